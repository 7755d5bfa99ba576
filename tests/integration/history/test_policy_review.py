"""Ways a run could get past ``lobs[].policy`` or be wrongly refused (a hostile review of the policy floor): a run
whose shape lets an approval floor ask no human is refused at plan; a scope by clusters or endpoints still sees the
LOBs it touches; a LOB whose name contains another's is not held by it; an absent Curvine approval is `auto`."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from kvfleet.history.repos import HistoryRepos

pytestmark = pytest.mark.integration
FLEETS = Path(__file__).resolve().parents[2] / "fleets"
RETAIL_PROD = "111111111111/us-east-1/ml-prod"
PAYMENTS_PROD = "222222222222/us-east-1/ml-prod"
EVAL = "333333333333/us-west-2/ml-eval"


def _call(dag_id: str, task_id: str, run_id: str, fn: Any, *args: Any, run_type: str = "manual") -> Any:
    from airflow.sdk.execution_time.context import set_current_context

    dag_run = SimpleNamespace(dag_id=dag_id, run_id=run_id, run_type=run_type, triggering_user_name="ann")
    with set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id=task_id, map_index=-1)}):  # type: ignore[typeddict-item]
        return fn(*args)


def _plan(run_id: str, params: dict[str, Any], run_type: str = "manual") -> list[str]:
    from kvfleet.airflow import rollout

    return _call("kvfleet_rollout", "plan", run_id, rollout.plan_rollout, params, run_type=run_type)


def _write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policies: dict[str, dict[str, str]],
           extra_retail: int = 0) -> Path:
    doc = yaml.safe_load((FLEETS / "multi-account.yaml").read_text())
    for lob in doc["lobs"]:
        if lob["name"] in policies:
            lob["policy"] = policies[lob["name"]]
    for i in range(extra_retail):  # more retail endpoints on retail's production ml-prod
        doc["endpoints"].append({"name": f"shop-{i}", "namespace": "retail", "lob": "retail", "cluster": "ml-prod",
                                 "model": "qwen2-7b", "instance_type": "ml.g5.4xlarge"})
    if extra_retail:
        for c in doc["clusters"]:
            c["gpu_nodes"]["count"] = 16
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(tmp_path))
    return path


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return _write(tmp_path, monkeypatch, {"retail": {"gate": "verify", "approval": "after_canary",
                                                     "curvine_approval": "always"}})


def _human_approvals(run_key: str, cluster: str, params: dict[str, Any]) -> tuple[int, int]:
    """(waves the DAG runs on ``cluster``, human approvals it asks for between them), every wave passing its
    verification: the DAG's own rules (``rollout._slot_waves``, ``WaveGateOperator._decide`` -> ``gate_decision``,
    ``has_next`` as ``run_wave_slot`` sets it)."""
    from kvfleet.airflow.params import WAVE_SLOTS
    from kvfleet.airflow.request import RolloutRequest
    from kvfleet.airflow.rollout import _slot_waves
    from kvfleet.fleet import gates
    from kvfleet.history.runs import Runs

    req = RolloutRequest.from_params(params)
    plan = Runs().get(run_key)["plan"]
    waves = next(c["waves"] for c in plan["clusters"] if c["key"] == cluster)
    asks = 0
    for slot in range(WAVE_SLOTS - 1):  # a gate follows every slot but the last
        if not _slot_waves(plan, cluster, slot):
            break
        has_next = bool(_slot_waves(plan, cluster, slot + 1))
        decision, _ = gates.gate_decision("pass", gate=req.gate, approval=req.approval, slot=slot, has_next=has_next)
        asks += decision == gates.ASK_APPROVAL
    return len(waves), asks


# ---- a run's shape cannot empty an approval floor -------------------------------------------------------------


def test_after_canary_with_no_canary_wave_is_refused_and_with_one_a_human_is_asked(history: HistoryRepos,
                                                                                   fleet: Path) -> None:
    """approval after_canary with canary false: retail's two production endpoints would form one wave with nothing
    after it to approve; refused. With the canary, the DAG's own rules ask a human after it."""
    from airflow.sdk.exceptions import AirflowFailException

    params = {"fleet": str(fleet), "approval": "after_canary", "canary": False}
    with pytest.raises(AirflowFailException, match="lobs.retail.policy.approval is after_canary, and the run has no "
                                                   "canary wave for a human to approve after: run with canary true"):
        _plan("manual__nocanary", params)
    params = {"fleet": str(fleet), "approval": "after_canary"}
    _plan("manual__canary", params)
    waves, asks = _human_approvals("kvfleet_rollout/manual__canary", RETAIL_PROD, params)
    assert (waves, asks) == (2, 1)


def test_every_wave_with_more_waves_than_slots_is_refused(history: HistoryRepos, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """approval every_wave on a cluster with more waves than the rollout's slots (its last slot runs the rest back to
    back, ungated): refused naming the cluster; with waves that fit, every wave but the last is followed by a human."""
    from airflow.sdk.exceptions import AirflowFailException

    path = _write(tmp_path, monkeypatch, {"retail": {"approval": "every_wave"}}, extra_retail=6)
    params = {"fleet": str(path), "approval": "every_wave", "wave_size": 1}
    with pytest.raises(AirflowFailException, match=f"cluster {RETAIL_PROD} has 8 waves, more than the 5 a rollout "
                                                   "approves one by one"):
        _plan("manual__many", params)
    params = {**params, "wave_size": 2}
    _plan("manual__fits", params)
    waves, asks = _human_approvals("kvfleet_rollout/manual__fits", RETAIL_PROD, params)
    assert waves == 5 and asks == waves - 1


# ---- checks that held ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scope", [{"clusters": [RETAIL_PROD]}, {"endpoints": ["storefront-chat"]},
                                   {"endpoints": [f"{RETAIL_PROD}:retail/catalog-rag"]}])
def test_a_scope_by_clusters_or_endpoints_still_sees_retail(history: HistoryRepos, fleet: Path,
                                                            scope: dict[str, Any]) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"fleet\.yaml: lobs\.retail\.policy\.approval is after_canary"):
        _plan("manual__scoped", {"fleet": str(fleet), **scope})


def test_a_lob_named_as_a_substring_is_not_held(history: HistoryRepos, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    doc = yaml.safe_load((FLEETS / "multi-account.yaml").read_text())
    doc["lobs"].append({"name": "retail-eu", "policy": {"approval": "every_wave"}})
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(tmp_path))
    assert _plan("manual__sub", {"fleet": str(path), "lobs": ["retail"]}) == [RETAIL_PROD]


@pytest.mark.parametrize("approval", [None, ""])
def test_curvine_approval_absent_takes_the_default_auto(history: HistoryRepos, fleet: Path,
                                                        approval: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from kvfleet.airflow import curvine

    params = {"fleet": str(fleet), "version": "0.3.3-alpha", "approval": approval}
    with pytest.raises(AirflowFailException, match="curvine_approval is always, and the run asks for approval auto"):
        _call("kvfleet_curvine_upgrade", "scope", "manual__absent", curvine.open_upgrade, params)


def test_plan_json_is_pure_json(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from kvfleet import cli

    assert cli.main(["plan", "--fleet", str(fleet), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"]["retail"] == {"gate": "verify", "approval": "after_canary", "curvine_approval": "always",
                                       "scheduled": "apply", "four_eyes": False, "responders": []}
