"""Issue 19: the waits after a change kvfleet itself just made give the worker slot back.

A rollout of a fresh ``c-patch`` (tiered storage off, no add-on): stage 1 sends ``UpdateCluster`` and stage 2
creates the five add-ons. Each of those changes is followed by a wait (InService, ACTIVE) that ``cluster.stages``
now defers on ``ClusterReadyTrigger`` (``stages.base.Pending``, ``act``/``finish``) instead of polling in the
worker. What must hold: one deferral per change, each change sent exactly once (the resumed task goes on from the
stage's ``progress``, it does not redo the change), and the stages' outcomes recorded once each, as ``changed``,
with what ``finish`` verified.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import mutating_requests
from test_deferral import ti_states  # noqa: F401  (the fixture: the task instances' states from the database)
from test_rollout_sandbox import conf

from kvfleet.fleet import constants as C

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_update_cluster_and_each_addon_wait_deferred_and_each_change_is_sent_once(  # type: ignore[no-untyped-def]
        dagbag, history, sandbox_process, small_fleet, ti_states) -> None:  # noqa: F811
    dr = dagbag.get_dag("kvfleet_rollout").test(run_conf=conf(small_fleet, clusters=["c-patch"], gate="none"))
    assert dr.state == "success", ti_states.rows()
    rows = ti_states.rows("cluster.stages")
    ready = [r for r in rows if r["state"] == "deferred"
             and str(r.get("classpath") or "").endswith("ClusterReadyTrigger")]
    run_key = f"kvfleet_rollout/{dr.run_id}"
    # A fresh cluster: one UpdateCluster and one CreateAddon per add-on reached AWS, each exactly once across the
    # deferrals (the twin's request log; a redone change after a resume would show twice).
    aws = [op.split(":", 1)[-1] for op in mutating_requests(sandbox_process)["aws"]]
    assert aws.count("UpdateCluster") == 1, aws
    assert aws.count("CreateAddon") == len(C.ADDON_ORDER), aws
    intents = [r for r in history.query("write_ahead", cutoff="1970-01-01", run_key=run_key, cluster=None,
                                        endpoint=None, limit=1000)
               if r["action"].startswith(("update_cluster", "create_addon"))]
    assert len(intents) == 1 + len(C.ADDON_ORDER), intents
    assert not [r for r in intents if r["outcome"].startswith("unknown")], intents  # every intent has its outcome
    # ... and each of them was waited for in the triggerer, not in a worker slot.
    assert len(ready) >= 1 + len(C.ADDON_ORDER), [(r["state"], r.get("classpath")) for r in rows]
    assert all(r["next_method"] == "resume" for r in ready)
    assert rows[-1]["state"] == "success", rows
    steps: dict[str, list[dict[str, Any]]] = {}
    for s in history.steps(run_key):
        steps.setdefault(s["step"], []).append(s)
    tiered, addons = steps["tiered_storage"], steps["addons"]
    assert len(tiered) == 1 and tiered[0]["outcome"] == "changed", tiered
    assert "ai-toolkit ready" in str(tiered[0]["detail"].get("verified")), tiered  # finish verified the daemon
    assert len(addons) == 1 and addons[0]["outcome"] == "changed", addons
    assert addons[0]["detail"]["addons"] == {name: "changed" for name in C.ADDON_ORDER}, addons
    assert "ready" in str(addons[0]["detail"].get("operator")), addons  # finish verified the operator
