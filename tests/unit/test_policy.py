"""The policy a line of business sets (``lobs[].policy``): the weakest gate and the least approval a rollout may ask
for, shown in the plan, and what a run that asks for less is told (``kvfleet.fleet.inventory.policy``)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvfleet import cli
from kvfleet.airflow.operators import Respondents
from kvfleet.errors import InventoryError
from kvfleet.fleet.inventory import parse_inventory
from kvfleet.fleet.inventory.policy import APPROVALS, CURVINE_APPROVALS, GATES, Policy, below, respondents, unanswerable
from kvfleet.fleet.plan import make_plan, render_plan_text

FLEET = Path(__file__).resolve().parents[1] / "fleets" / "multi-account.yaml"


def _doc(**policies: dict[str, str]) -> dict[str, Any]:
    doc = copy.deepcopy(yaml.safe_load(FLEET.read_text()))
    for lob in doc["lobs"]:
        if lob["name"] in policies:
            lob["policy"] = policies[lob["name"]]
    return doc


def test_the_plan_shows_the_policy_of_the_lobs_in_scope() -> None:
    inv = parse_inventory(yaml.safe_dump(_doc(retail={"gate": "verify", "approval": "after_canary"},
                                              platform={"approval": "every_wave"})))
    plan = make_plan(inv)
    rest = {"curvine_approval": "never", "scheduled": "apply", "four_eyes": False, "responders": []}
    assert plan.as_dict()["policy"] == {"retail": {"gate": "verify", "approval": "after_canary", **rest},
                                        "platform": {"gate": "none", "approval": "every_wave", **rest}}
    text = render_plan_text(plan)
    assert "policy of lob retail: gate verify or stronger, approval after_canary or more" in text
    assert "policy of lob payments" not in text  # it sets none
    retail_only = make_plan(inv.select(lobs=["payments"]))
    assert retail_only.policy == ()  # a LOB outside the scope holds the run to nothing


@pytest.mark.parametrize("gate,approval,refused", [
    ("none", "after_canary", ["lobs.retail.policy.gate is verify, and the run asks for gate none"]),
    ("verify", "none", ["lobs.retail.policy.approval is after_canary, and the run asks for approval none"]),
    ("none", "none", ["policy.gate", "policy.approval"]),
    ("verify", "after_canary", []),
    ("verify", "every_wave", []),  # a run may ask for more
])
def test_a_run_asking_for_less_than_the_policy_is_told_what_and_where(gate: str, approval: str,
                                                                       refused: list[str]) -> None:
    inv = parse_inventory(yaml.safe_dump(_doc(retail={"gate": "verify", "approval": "after_canary"})),
                          source="fleet.yaml")
    said = below(make_plan(inv).policy, inv.source, gate=gate, approval=approval)
    assert len(said) == len(refused) and all(r in s for r, s in zip(refused, said, strict=True)), said
    assert all(s.startswith("fleet.yaml: lobs.retail.policy.") for s in said)


def test_every_value_a_run_may_ask_for_is_ordered() -> None:
    from kvfleet.airflow.params import curvine_upgrade_params, rollout_params

    params = rollout_params()
    assert set(params["gate"].schema["enum"]) == set(GATES)
    assert set(params["approval"].schema["enum"]) == set(APPROVALS)
    assert set(curvine_upgrade_params()["approval"].schema["enum"]) == set(CURVINE_APPROVALS)


def test_a_curvine_upgrade_asking_less_approval_than_the_policy_is_told() -> None:
    inv = parse_inventory(yaml.safe_dump(_doc(retail={"curvine_approval": "always"})), source="fleet.yaml")
    lobs = [(x.name, x.policy) for x in inv.lobs]
    assert below(lobs, inv.source, curvine_approval="always") == []
    [said] = below(lobs, inv.source, curvine_approval="auto")
    assert said.startswith("fleet.yaml: lobs.retail.policy.curvine_approval is always, and the run asks for "
                           "approval auto: run with approval always")
    assert "Curvine approval always or more" in render_plan_text(make_plan(inv))


@pytest.mark.parametrize("policy,field", [({"gate": "strict"}, "policy.gate"), ({"approval": True}, "policy.approval"),
                                          ({"gates": "verify"}, "policy.gates"), ("verify", "policy"),
                                          ({"four_eyes": "yes please"}, "policy.four_eyes"),
                                          ({"responders": "alice"}, "policy.responders"),
                                          ({"responders": [""]}, "policy.responders[0]"),
                                          ({"responders": ["a\nb"]}, "policy.responders[0]"),
                                          ({"responders": [f"u{i}" for i in range(51)]}, "policy.responders")])
def test_a_bad_policy_is_refused_naming_the_field(policy: Any, field: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(yaml.safe_dump(_doc(retail=policy)))
    assert any(f"lobs.retail.{field}" in p for p in info.value.problems), info.value.problems
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_doc(retail=policy)))
    assert cli.main(["validate", "--fleet", str(path)]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err


def test_validate_json_shows_the_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(_doc(payments={"gate": "verify"})))
    assert cli.main(["validate", "--fleet", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {x["name"]: x["policy"] for x in shown["lobs"]}["payments"] == {
        "gate": "verify", "approval": "none", "curvine_approval": "never", "scheduled": "apply", "four_eyes": False, "responders": []}


def test_responders_are_those_every_lob_names_less_the_trigger_under_four_eyes() -> None:
    retail = ("retail", Policy(four_eyes=True, responders=["ann", "bo", "cy"]))
    payments = ("payments", Policy(responders=["bo", "cy", "dee"]))
    free = ("platform", Policy(approval="every_wave"))
    assert respondents([free], "ann") == (None, False)  # no LOB names anyone: anyone Airflow lets answer
    assert respondents([retail, free], None) == (["ann", "bo", "cy"], True)  # a scheduled run: no one to take out
    assert respondents([retail, free], "ann") == (["bo", "cy"], True)
    assert respondents([retail, payments], "cy") == (["bo"], True)  # a gate answers for both LOBs
    assert respondents([payments], "cy") == (["bo", "cy", "dee"], False)  # no four eyes: the trigger may answer
    assert unanswerable([retail, payments], "fleet.yaml", "ann") == []
    [said] = unanswerable([("retail", Policy(four_eyes=True, responders=["ann"])), payments], "fleet.yaml", "ann")
    assert said.startswith("fleet.yaml: lobs.retail.policy.responders, lobs.payments.policy.responders name no one "
                           "in common but ann, who triggered the run (four eyes)")
    assert "policy of lob retail: gate none or stronger, approval none or more, four eyes, answered by ann, bo, cy" \
        in render_plan_text(make_plan(parse_inventory(yaml.safe_dump(_doc(retail=retail[1].model_dump())))))


@pytest.mark.parametrize("who,allowed,four_eyes,refused", [
    ({"id": "ann", "name": "ann"}, None, True, "ann triggered this run and answered its gate"),
    ({"id": "7", "name": "ann"}, None, True, "ann triggered this run"),  # FAB: a numeric id, the name is the user's
    ({"id": "bo", "name": "bo"}, None, True, None),
    ({"id": "ann", "name": "ann"}, None, False, None),
    ({"id": "cy", "name": "cy"}, ["bo"], False, "cy is not among the responders of this run's LOBs (bo"),
    ({"id": "bo", "name": "bo"}, ["bo"], True, None),
    ({}, ["bo"], True, None),  # a timeout: the default, which no one chose
])
def test_an_answer_that_does_not_count_is_told_why(who: dict[str, str], allowed: list[str] | None, four_eyes: bool,
                                                   refused: str | None) -> None:
    said = Respondents(allowed, four_eyes, "ann").refusal(who)
    assert (said is None) if refused is None else (said is not None and said.startswith(refused)), said
