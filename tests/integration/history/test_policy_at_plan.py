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


def _plan(run_id: str, params: dict[str, Any], run_type: str = "manual") -> list[str]:
    from airflow.sdk.execution_time.context import set_current_context

    from kvfleet.airflow import rollout

    dag_run = SimpleNamespace(dag_id="kvfleet_rollout", run_id=run_id, run_type=run_type,
                              triggering_user_name=None if run_type == "scheduled" else "ann")
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
                                                   "curvine_approval": "never", "scheduled": "apply",
                                                   "four_eyes": False, "responders": []}}
    assert history.runs.pinned("kvfleet_rollout/manual__low") is not None  # the inventory it was held to


def test_the_same_conf_on_a_lob_whose_policy_allows_it_is_planned(history: HistoryRepos, fleet: Path) -> None:
    keys = _plan("manual__payments", {"fleet": str(fleet), "lobs": ["payments"], "gate": "none", "approval": "none"})
    assert keys == ["222222222222/us-east-1/ml-prod"]


def test_a_dry_run_below_the_policy_is_planned(history: HistoryRepos, fleet: Path) -> None:
    keys = _plan("manual__dry", {"fleet": str(fleet), "gate": "none", "dry_run": True})
    assert len(keys) == 3
    plan = history.runs.get("kvfleet_rollout/manual__dry")["plan"]
    assert plan["policy"] == {"retail": {"gate": "verify", "approval": "after_canary", "curvine_approval": "never",
                                         "scheduled": "apply", "four_eyes": False, "responders": []}}


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
                                        "scheduled": "apply", "four_eyes": True, "responders": ["ann", "bo"]}


def test_the_curvine_approval_of_the_trigger_does_not_count_under_four_eyes(history: HistoryRepos,
                                                                            fleet: Path) -> None:
    """The Curvine upgrade's one approval (``CurvineApprovalOperator``) holds every LOB in scope: with four eyes on
    retail, ann's approval of her own upgrade is taken as Reject (the upgrade tasks are skipped) and recorded with
    why; bo's counts. Its assigned users are those every LOB in scope names, ann taken out."""
    from datetime import UTC, datetime

    from kvfleet.airflow.operators import CurvineApprovalOperator, Respondents, _scope

    doc = yaml.safe_load(fleet.read_text())
    [retail] = [lob for lob in doc["lobs"] if lob["name"] == "retail"]
    retail["policy"].update(four_eyes=True, responders=["ann", "bo"])
    fleet.write_text(yaml.safe_dump(doc))
    params = {"fleet": str(fleet), "version": "0.3.3-alpha", "approval": "always"}
    assert len(_open_upgrade("manual__4eyes", params)) == 3
    context = {"dag_run": SimpleNamespace(dag_id="kvfleet_curvine_upgrade", run_id="manual__4eyes",
                                          run_type="manual", triggering_user_name="ann"),
               "ti": SimpleNamespace(task_id="approve", map_index=-1), "params": params}
    assert Respondents.of(context, None, _scope(context)).assigned() == [{"id": "bo", "name": "bo"}]
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


def test_a_freeze_refuses_the_start_of_every_mutating_run_in_its_scope(history: HistoryRepos, fleet: Path) -> None:
    """``kvfleet freeze on`` (``Holds.freeze``) of a LOB or a cluster: a rollout or a Curvine upgrade or scale-out
    whose scope it covers is refused before anything changes, naming who froze, why and how to lift it (a
    ``freeze`` step, refused: the run ends refused); a dry run, and a run outside the frozen scope, start; lifted,
    the run starts."""
    from airflow.sdk.exceptions import AirflowFailException

    from kvfleet.airflow import curvine
    from kvfleet.history.holds import CLUSTER, LOB, Scope

    retail_prod = "111111111111/us-east-1/ml-prod"
    conf = {"fleet": str(fleet), "gate": "verify", "approval": "after_canary"}  # retail's policy
    history.holds.freeze(Scope(LOB, "retail"), "black friday", "oncall")
    said = "LOB retail is frozen by oncall since .*: black friday. Lift it with: kvfleet freeze off --lob retail"
    with pytest.raises(AirflowFailException, match=f"the run does not start, nothing was changed: {said}"):
        _plan("manual__frozen", conf)
    [step] = [s for s in history.runs.steps("kvfleet_rollout/manual__frozen") if s["step"] == "freeze"]
    assert (step["stage"], step["outcome"], step["detail"]["hold"]["by"]) == ("plan", "refused", "oncall")
    assert _plan("manual__frozen_dry", {**conf, "dry_run": True})  # a dry run changes nothing
    assert _plan("manual__payments", {"fleet": str(fleet), "lobs": ["payments"]}) == [
        "222222222222/us-east-1/ml-prod"]  # outside the frozen scope
    # the Curvine upgrade and scale-out of a cluster serving the LOB
    with pytest.raises(AirflowFailException, match=said):
        _open_upgrade("manual__frozen_upgrade", {"fleet": str(fleet), "version": "0.3.3-alpha",
                                                 "clusters": [retail_prod]})
    from airflow.sdk.execution_time.context import set_current_context

    dag_run = SimpleNamespace(dag_id="kvfleet_curvine_scale_out", run_id="manual__frozen_scale", run_type="manual",
                              triggering_user_name="ann")
    scope_ti = SimpleNamespace(task_id="scope", map_index=-1)
    with set_current_context({"dag_run": dag_run, "ti": scope_ti}), pytest.raises(AirflowFailException, match=said):  # type: ignore[typeddict-item]
        curvine.open_scale({"fleet": str(fleet), "clusters": [retail_prod], "target_workers": 3})
    history.holds.lift(Scope(LOB, "retail"), "over", "oncall")
    history.holds.freeze(Scope(CLUSTER, retail_prod), "disk swap", "ops")
    with pytest.raises(AirflowFailException, match=f"cluster {retail_prod} is frozen by ops"):
        _plan("manual__cluster_frozen", conf)
    history.holds.lift(Scope(CLUSTER, retail_prod), "done", "ops")
    assert len(_plan("manual__thawed", conf)) == 3


def test_a_gate_asks_no_human_for_a_cluster_a_freeze_holds(history: HistoryRepos, fleet: Path) -> None:
    """A wave gate that would ask for an approval is a safe point: with the cluster frozen since the wave, it asks
    no one and carries the hold on (the later slots record their endpoints frozen); unfrozen, it asks."""
    from kvfleet.airflow.operators import WaveGateOperator
    from kvfleet.fleet import gates
    from kvfleet.history.holds import CLUSTER, Scope

    key = "111111111111/us-east-1/ml-prod"
    conf = {"fleet": str(fleet), "gate": "verify", "approval": "after_canary"}
    _plan("manual__gate", conf)
    wave = {"cluster": "ml-prod", "key": key, "verdict": "pass", "has_next": True, "waves": ["w0"]}
    context = {"dag_run": SimpleNamespace(dag_id="kvfleet_rollout", run_id="manual__gate", run_type="manual",
                                          triggering_user_name="ann"),
               "ti": SimpleNamespace(task_id="cluster.gate_0", map_index=0, xcom_pull=lambda **_: wave),
               "params": conf}
    gate = WaveGateOperator(task_id="gate_0", wave_task_id="cluster.wave_0", slot=0)
    assert gate._decide(context)[0] == gates.ASK_APPROVAL  # unfrozen: a human is asked
    history.holds.freeze(Scope(CLUSTER, key), "incident", "oncall")
    out = gate.execute(context)
    assert (out["decision"], out["held"]["outcome"]) == (gates.HALT, "frozen"), out
    assert out["reason"].startswith(f"cluster {key} is frozen by oncall"), out


def test_the_daily_run_on_the_example_fleet_changes_nothing_in_production(history: HistoryRepos, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """fleet.example.yaml's policy (retail and payments: ``scheduled: plan``): the scheduled run plans the production
    cluster and leaves it out (no task is mapped over it, so nothing there changes), recorded as a policy step;
    the staging cluster is rolled. The same Params triggered by hand cover both."""
    import shutil

    fleet = tmp_path / "fleet.example.yaml"
    shutil.copy(Path(__file__).resolve().parents[3] / "fleet.example.yaml", fleet)
    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(tmp_path))
    keys = _plan("scheduled__daily", {"fleet": str(fleet)}, run_type="scheduled")
    assert keys == ["default/us-west-2/ml-stage-usw2"]
    run = history.runs.get("kvfleet_rollout/scheduled__daily")
    assert [c["key"] for c in run["plan"]["clusters"]] == keys
    [step] = [s for s in history.runs.steps("kvfleet_rollout/scheduled__daily") if s["step"] == "policy"]
    assert (step["outcome"], step["detail"]["left_out"]) == ("planned", ["default/us-east-1/ml-prod-use1"])
    assert step["detail"]["why"] == [  # the first LOB of the inventory that keeps it for a human
        f"default/us-east-1/ml-prod-use1: {fleet.name}: lobs.retail.policy.scheduled is plan, and "
        "default/us-east-1/ml-prod-use1 is a production cluster: trigger kvfleet_rollout by hand to apply it"]
    assert step["detail"]["planned"]["default/us-east-1/ml-prod-use1"]["waves"]  # what a human would apply
    assert _plan("manual__by_hand", {"fleet": str(fleet)}) == ["default/us-east-1/ml-prod-use1",
                                                               "default/us-west-2/ml-stage-usw2"]


def test_the_daily_run_leaves_out_what_its_params_may_not_apply(history: HistoryRepos, fleet: Path) -> None:
    """A LOB's approval floor (retail: after_canary) and the daily run's Params (approval none): where a run by hand
    is refused whole, the scheduled run leaves retail's cluster to a human and applies the others."""
    keys = _plan("scheduled__floor", {"fleet": str(fleet)}, run_type="scheduled")
    assert keys == ["333333333333/us-west-2/ml-eval", "222222222222/us-east-1/ml-prod"]
    [step] = [s for s in history.runs.steps("kvfleet_rollout/scheduled__floor") if s["step"] == "policy"]
    assert (step["outcome"], step["detail"]["left_out"]) == ("planned", ["111111111111/us-east-1/ml-prod"])
    assert all("lobs.retail.policy.approval is after_canary" in w for w in step["detail"]["why"])
