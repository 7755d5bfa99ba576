"""`kvfleet stop` (``Holds.stop``) or `kvfleet freeze on` (``Holds.freeze``) arriving while a wave is in flight, on the twin through dag.test(): a patch-mode
cluster (its waves pause the Inference Operator) with one LOB and three endpoints, one per wave: canary [chat] ->
[docs] -> [rag], no gate and no approval, so nothing waits between the waves. Once the canary is done, every
Kubernetes request of the twin is slowed (``api_latency``) so that the docs wave takes seconds; the stop is given as
soon as the docs wave records its first intent (a freeze: of the cluster), then the latency is lifted. The docs wave finishes its safe
sequence (rolled, its pods ready, the operator it paused restored); the rag wave never starts; no endpoint is at 0
replicas, the operator runs, no lease is held, and the run ends stopped (frozen)."""

from __future__ import annotations

import os
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from conftest import SMALL_FLEET

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
KUBECTL = Path(__file__).resolve().parents[3] / ".tools" / "bin" / "kubectl"
KEY = "default/us-east-1/c-patch"
# conftest's c-patch cluster, with one LOB and three endpoints, one per wave
FLEET = yaml.safe_dump({
    "settings": {"wave_size": 1}, "lobs": [{"name": "alpha"}],
    "clusters": [c for c in yaml.safe_load(SMALL_FLEET)["clusters"] if c["name"] == "c-patch"],
    "endpoints": [{"name": f"alpha-{n}", "namespace": "alpha", "lob": "alpha", "cluster": "c-patch",
                   "model": "qwen2-7b", "instance_type": "ml.g5.4xlarge"} for n in ("chat", "docs", "rag")]})


@pytest.fixture
def small_fleet(tmp_path: Path) -> Path:
    """Overrides the conftest's fleet: the sandbox_process fixture starts the twin from this one."""
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def _one(history: Any, sql: str, **binds: Any) -> Any:
    with history.engine.connect() as conn:
        return conn.execute(text(sql), binds).scalar()


class StopMidWave(threading.Thread):
    """Slows the twin once the canary is rolled, gives the stop at the docs wave's first intent, then lifts the
    latency. ``seen``: the run key stopped and what the docs wave had done when the stop was given."""

    def __init__(self, history: Any, sandbox: Any, since: datetime, kind: str) -> None:
        super().__init__(daemon=True)
        self.kind = kind
        self.history, self.sandbox, self.since, self.done = history, sandbox, since, threading.Event()
        self.seen: dict[str, Any] = {}
        self.errors: list[str] = []

    def wait(self, sql: str, **binds: Any) -> Any:
        while not self.done.wait(0.05):
            value = _one(self.history, sql, **binds)
            if value:
                return value
        raise TimeoutError(sql)

    def run(self) -> None:
        from kvfleet.history.holds import CLUSTER, RUN, Scope

        try:
            run_key = self.wait("SELECT run_key FROM runs WHERE dag_id = 'kvfleet_rollout' AND started_at >= :t "
                                "ORDER BY started_at DESC LIMIT 1", t=self.since)
            self.wait("SELECT 1 FROM step_events WHERE run_key = :k AND step = 'endpoint:alpha/alpha-chat'", k=run_key)
            self.sandbox.admin("/fault", {"cluster": "c-patch", "kind": "api_latency", "seconds": 0.5,
                                          "target": "kube"})
            self.wait("SELECT 1 FROM audit_log WHERE run_key = :k AND endpoint = 'alpha/alpha-docs'", k=run_key)
            if self.kind == "stop":
                self.history.holds.stop(Scope(RUN, run_key), "INC-77: canary latency", "oncall")
            else:
                self.history.holds.freeze(Scope(CLUSTER, KEY), "INC-77: canary latency", "oncall")
            self.seen = {"run_key": run_key, "docs_done_at_stop": bool(_one(
                self.history, "SELECT 1 FROM step_events WHERE run_key = :k AND step = 'endpoint:alpha/alpha-docs'",
                k=run_key))}
        except Exception as exc:  # reported through self.errors, asserted by the test
            self.errors.append(repr(exc))
        finally:
            self.sandbox.admin("/fault", {"cluster": "c-patch", "kind": "clear"})


@pytest.mark.parametrize("kind,outcome", [("stop", "stopped"), ("freeze", "frozen")])
def test_a_hold_in_mid_wave_lets_the_wave_finish_and_starts_no_other(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, kind, outcome) -> None:
    from test_rollout_sandbox import _operator_state, _outcomes, conf

    from kvfleet.history.holds import CLUSTER, Scope

    stopper = StopMidWave(history, sandbox_process, datetime.now(UTC), kind)
    stopper.start()
    try:
        dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, gate="none", approval="none",
                                                                           wave_size=1))
    finally:
        stopper.done.set()
        stopper.join(timeout=60)
        if kind == "freeze" and any(f.scope.name == KEY for f in history.holds.active_freezes()):
            history.holds.lift(Scope(CLUSTER, KEY), "test over", "oncall")
    assert not stopper.errors, stopper.errors
    run_key = f"kvfleet_rollout/{dr.run_id}"
    assert stopper.seen == {"run_key": run_key, "docs_done_at_stop": False}, stopper.seen  # given in mid-wave
    assert _outcomes(history, run_key) == [(KEY, "alpha/alpha-chat", "changed"), (KEY, "alpha/alpha-docs", "changed"),
                                           (KEY, "alpha/alpha-rag", outcome)]
    run = history.runs.get(run_key)
    assert run["status"] == outcome and "INC-77: canary latency" in (run["reason"] or ""), run
    assert _operator_state(small_fleet, "c-patch")["paused_by"] is None
    assert _one(history, "SELECT count(*) FROM cluster_locks") == 0
    assert _one(history, "SELECT count(*) FROM audit_log i WHERE i.run_key = :k AND i.kind = 'intent' AND NOT "
                         "EXISTS (SELECT 1 FROM audit_log o WHERE o.intent_id = i.id)", k=run_key) == 0
    for name, want in (("alpha-chat", "2"), ("alpha-docs", "2")):  # rolled and serving; rag was never created
        got = subprocess.run([str(KUBECTL), "--context", "c-patch", "-n", "alpha", "get", "deployment", name, "-o",
                              "jsonpath={.status.readyReplicas}"], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ))
        assert (got.returncode, got.stdout) == (0, want), (name, got.stderr)
