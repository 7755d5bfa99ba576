"""A rollout that asks for less than its LOBs' policy (``lobs[].policy``) is refused by its plan task, before any
cluster task runs, naming the policy's key and file; the same conf on a LOB whose policy allows it is planned, and
so is a dry run. The run's pinned inventory holds the policy it was held to."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration
FLEETS = Path(__file__).resolve().parents[2] / "fleets"


def _plan(run_id: str, params: dict[str, Any]) -> list[str]:
    from airflow.sdk.execution_time.context import set_current_context

    from kvfleet.airflow import rollout

    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id=run_id, run_type="manual", triggering_user_name="ann")
    with set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id="plan", map_index=-1)}):  # type: ignore[typeddict-item]
        return rollout.plan_rollout(params)


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    doc = yaml.safe_load((FLEETS / "multi-account.yaml").read_text())
    for lob in doc["lobs"]:
        if lob["name"] == "retail":  # production: verified waves, and a human after the canary
            lob["policy"] = {"gate": "verify", "approval": "after_canary"}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(tmp_path))
    return path


@pytest.mark.parametrize("conf,said", [
    ({"gate": "none", "approval": "after_canary"}, "lobs.retail.policy.gate is verify, and the run asks for gate none"),
    ({"approval": "none"}, "lobs.retail.policy.approval is after_canary, and the run asks for approval none"),
])
def test_a_run_below_the_policy_is_refused_at_plan(history: HistoryRepos, fleet: Path, conf: dict[str, Any],
                                                   said: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException) as err:
        _plan("manual__low", {"fleet": str(fleet), **conf})
    assert said in str(err.value) and f"{fleet.name}: " in str(err.value) and "nothing was changed" in str(err.value)
    [step] = [s for s in history.runs.steps("kvfleet_rollout/manual__low") if s["step"] == "policy"]
    assert step["outcome"] == "refused" and said in " ".join(step["detail"]["refused"])
    assert step["detail"]["policy"] == {"retail": {"gate": "verify", "approval": "after_canary",
                                                   "curvine_approval": "never", "four_eyes": False,
                                                   "responders": []}}
    assert history.runs.pinned("kvfleet_rollout/manual__low") is not None  # the inventory it was held to


def test_the_same_conf_on_a_lob_whose_policy_allows_it_is_planned(history: HistoryRepos, fleet: Path) -> None:
    keys = _plan("manual__payments", {"fleet": str(fleet), "lobs": ["payments"], "gate": "none", "approval": "none"})
    assert keys == ["222222222222/us-east-1/ml-prod"]


def test_a_dry_run_below_the_policy_is_planned(history: HistoryRepos, fleet: Path) -> None:
    keys = _plan("manual__dry", {"fleet": str(fleet), "gate": "none", "dry_run": True})
    assert len(keys) == 3
    plan = history.runs.get("kvfleet_rollout/manual__dry")["plan"]
    assert plan["policy"] == {"retail": {"gate": "verify", "approval": "after_canary", "curvine_approval": "never",
                                         "four_eyes": False, "responders": []}}


def _open_upgrade(run_id: str, params: dict[str, Any]) -> list[str]:
    from airflow.sdk.execution_time.context import set_current_context

    from kvfleet.airflow import curvine

    dag_run = SimpleNamespace(dag_id="kvfleet_curvine_upgrade", run_id=run_id, run_type="manual",
                              triggering_user_name="ann")
    with set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id="scope", map_index=-1)}):  # type: ignore[typeddict-item]
        return curvine.open_upgrade(params)


@pytest.fixture
def curvine_policy(fleet: Path) -> Path:
    doc = yaml.safe_load(fleet.read_text())
    for lob in doc["lobs"]:
        if lob["name"] == "retail":
            lob["policy"]["curvine_approval"] = "auto"
    fleet.write_text(yaml.safe_dump(doc))
    return fleet


def test_a_curvine_upgrade_below_the_policy_is_refused_before_anything(history: HistoryRepos,
                                                                        curvine_policy: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    base = {"fleet": str(curvine_policy), "version": "0.3.3-alpha", "approval": "never"}
    with pytest.raises(AirflowFailException,
                       match="lobs.retail.policy.curvine_approval is auto, and the run asks for approval never: "
                             "run with approval auto or always"):
        _open_upgrade("manual__never", base)
    [step] = [s for s in history.runs.steps("kvfleet_curvine_upgrade/manual__never") if s["step"] == "policy"]
    assert step["outcome"] == "refused"
    # payments' ml-prod serves no LOB with that policy; a dry run changes nothing; auto meets the floor
    assert _open_upgrade("manual__pay", {**base, "clusters": ["222222222222/us-east-1/ml-prod"]}) == [
        "222222222222/us-east-1/ml-prod"]
    assert len(_open_upgrade("manual__dry", {**base, "dry_run": True})) == 3
    assert len(_open_upgrade("manual__auto", {**base, "approval": "auto"})) == 3


def test_a_run_whose_gates_no_one_could_answer_is_refused_at_plan(history: HistoryRepos, fleet: Path) -> None:
    """Four eyes and responders (lobs[].policy.four_eyes, responders): a run triggered by the only responder of its
    LOB could have its gates answered by no one, so it is refused before anything changes; a run that asks no human
    (a dry run), or one whose LOB names someone else too, is planned. The Curvine upgrade is held the same way."""
    from airflow.sdk.exceptions import AirflowFailException

    doc = yaml.safe_load(fleet.read_text())
    [retail] = [lob for lob in doc["lobs"] if lob["name"] == "retail"]
    retail["policy"].update(four_eyes=True, responders=["ann"])
    fleet.write_text(yaml.safe_dump(doc))
    conf = {"fleet": str(fleet), "gate": "verify", "approval": "after_canary"}
    said = re.escape("lobs.retail.policy.responders names no one but ann, who triggered the run (four eyes), so no "
                     "one could answer this run's gates")
    with pytest.raises(AirflowFailException, match=said):
        _plan("manual__alone", conf)
    [step] = [s for s in history.runs.steps("kvfleet_rollout/manual__alone") if s["step"] == "policy"]
    assert step["outcome"] == "refused" and step["detail"]["policy"]["retail"]["responders"] == ["ann"]
    with pytest.raises(AirflowFailException, match=said):
        _open_upgrade("manual__alone_upgrade", {"fleet": str(fleet), "version": "0.3.3-alpha", "approval": "always"})
    assert len(_plan("manual__alone_dry", {**conf, "dry_run": True})) == 3
    retail["policy"]["responders"] = ["ann", "bo"]
    fleet.write_text(yaml.safe_dump(doc))
    assert len(_plan("manual__two", conf)) == 3
    plan = history.runs.get("kvfleet_rollout/manual__two")["plan"]
    assert plan["policy"]["retail"] == {"gate": "verify", "approval": "after_canary", "curvine_approval": "never",
                                        "four_eyes": True, "responders": ["ann", "bo"]}


def test_the_curvine_approval_of_the_trigger_does_not_count_under_four_eyes(history: HistoryRepos,
                                                                            fleet: Path) -> None:
    """The Curvine upgrade's one approval (``CurvineApprovalOperator``) holds every LOB in scope: with four eyes on
    retail, ann's approval of her own upgrade is taken as Reject (the upgrade tasks are skipped) and recorded with
    why; bo's counts. Its assigned users are those every LOB in scope names, ann taken out."""
    from datetime import UTC, datetime

    from kvfleet.airflow.operators import CurvineApprovalOperator, Respondents

    doc = yaml.safe_load(fleet.read_text())
    [retail] = [lob for lob in doc["lobs"] if lob["name"] == "retail"]
    retail["policy"].update(four_eyes=True, responders=["ann", "bo"])
    fleet.write_text(yaml.safe_dump(doc))
    params = {"fleet": str(fleet), "version": "0.3.3-alpha", "approval": "always"}
    assert len(_open_upgrade("manual__4eyes", params)) == 3
    context = {"dag_run": SimpleNamespace(dag_id="kvfleet_curvine_upgrade", run_id="manual__4eyes",
                                          run_type="manual", triggering_user_name="ann"),
               "ti": SimpleNamespace(task_id="approve", map_index=-1), "params": params}
    assert Respondents.of(context, None).assigned() == [{"id": "bo", "name": "bo"}]
    op = CurvineApprovalOperator(task_id="approve", subject="Curvine upgrade")

    def answer(who: str) -> Any:
        return op.execute_complete(context, {"chosen_options": ["Approve"], "params_input": {}, "timedout": False,
                                             "responded_at": datetime.now(UTC),
                                             "responded_by_user": {"id": who, "name": who}})

    assert answer("ann")["chosen_options"] == ["Reject"]
    [step] = [s for s in history.runs.steps("kvfleet_curvine_upgrade/manual__4eyes")
              if s["step"] == "gate_response:approve"]
    assert step["outcome"] == "refused" and step["detail"]["refused"].startswith("ann triggered this run"), step
    assert answer("bo")["chosen_options"] == ["Approve"]
