"""kvfleet's triggers (the ``kvfleet.airflow.triggers`` package) run as the triggerer runs them: ``run()`` on an asyncio loop,
against the sandbox (AWS emulator, Kubernetes API emulator with watch) and the embedded PostgreSQL.

Each trigger: re-created from ``serialize()`` it is the same trigger; it waits while waiting is right, ends with
one ``success`` event when the thing is ready, and with an ``error`` event at once on a terminal state. The watch
fires on a change made by hand with the real ``kubectl``, even one stamped with an annotation that claims to be
kvfleet's, and a watch re-created from its checkpoint resumes from its last resourceVersion. (The watch's pure
rules are tested alone in ``tests/unit/test_watch_rules.py``.)

The ``timeout`` of ``_first_event`` is a guard against a hang, not a timed assertion."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from kvfleet.airflow.triggers import fleet_watch, kube_watch
from kvfleet.airflow.triggers.fleet_watch import FleetWatchTrigger
from kvfleet.airflow.triggers.kube_watch import KubeWatchTrigger
from kvfleet.airflow.triggers.lease import LeaseFreeTrigger
from kvfleet.airflow.triggers.readiness import ClusterReadyTrigger, KubeReadyTrigger
from kvfleet.fleet import watch_rules
from kvfleet.fleet.inventory import Inventory, load_inventory

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
PROD = "ml-prod-use1"
PROD_KEY = "default/us-east-1/ml-prod-use1"  # how the fleet watch names it (its events, its state, its retries)
ROLLED = ("retail-assistant", "payments-disputes")


def _inventory() -> Inventory:
    inv = load_inventory(ROOT / "fleet.example.yaml")
    return inv.model_copy(update={"endpoints": [e for e in inv.endpoints if e.cluster != PROD or e.name in ROLLED]})


def rbac_with_watch(target: Path) -> Path:
    """k8s/rbac with the grants the drift watch needs (``watch_rules.RBAC_*_RULES``) added to kvfleet's
    ClusterRoles: the change proposed for k8s/rbac, applied to this module's sandbox only."""
    import shutil

    import yaml

    target.mkdir(parents=True, exist_ok=True)
    for path in (ROOT / "k8s" / "rbac").iterdir():
        if path.suffix != ".yaml":
            shutil.copy(path, target / path.name)
            continue
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for doc in docs:
            name = doc.get("metadata", {}).get("name")
            # k8s/rbac must already grant what the watch declares: nothing is added, the shipped files are tested
            if doc.get("kind") == "ClusterRole" and name == "kvfleet:cluster":
                _assert_granted(doc["rules"], watch_rules.RBAC_CLUSTER_RULES, name)
            if doc.get("kind") == "ClusterRole" and name == "kvfleet:curvine-namespace":
                _assert_granted(doc["rules"], watch_rules.RBAC_CURVINE_NAMESPACE_RULES, name)
        (target / path.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return target


def _assert_granted(rules: list[dict[str, Any]], needed: Any, role: str) -> None:
    for need in needed:
        for group in need["apiGroups"]:
            for resource in need["resources"]:
                for verb in need["verbs"]:
                    assert any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
                               and verb in r.get("verbs", []) and not r.get("resourceNames") for r in rules), (
                        f"k8s/rbac: {role} does not grant {verb} {group or 'core'}/{resource} (the drift watch)")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One sandbox for the module, pointed at by the process environment as Airflow connections would be;
    stages 1–3 and two endpoints rolled out on the prod cluster. kvfleet's identity is held to k8s/rbac plus
    the drift watch's ``watch`` grants."""
    from kvfleet.stages import addons, curvine, endpoints, tiered_storage
    from kvfleet.stages.base import StageContext, Timeouts
    from kvfleet_sandbox import runtime
    from kvfleet_sandbox.twin import SandboxSettings

    tmp = tmp_path_factory.mktemp("triggers")
    with pytest.MonkeyPatch.context() as rbac:
        rbac.setattr(runtime, "RBAC_DIR", rbac_with_watch(tmp / "rbac"))
        sandbox = runtime.start_sandbox(_inventory(), tmp / "sandbox", SandboxSettings(time_scale=0.005))
    assert sandbox.rbac_enforced
    with pytest.MonkeyPatch.context() as mp:
        for key, value in sandbox.exports().items():
            mp.setenv(key, value)
        mp.setenv("KVFLEET_POLL_SECONDS", "0.05")
        mp.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)  # boto3 reads AWS_ENDPOINT_URL natively
        inv = _inventory()  # the same inventory, typed as kvfleet's (the sandbox holds a structural one)
        ctx = StageContext(inventory=inv, cluster=inv.cluster(PROD), aws_conn_id=None,
                           timeouts=Timeouts(cluster_update_s=60, addon_s=60, pods_s=60, pvc_s=30))
        try:
            for stage in (tiered_storage, addons, curvine):
                stage.reconcile(ctx)
            endpoints.reconcile_wave(ctx, list(inv.endpoints_of(PROD)), holder="t/rollout")
            ctx.close()
            yield sandbox
        finally:
            sandbox.stop()


async def _first(trigger: Any, action: Callable[[], None] | None, ready: Callable[[], bool] | None,
                 timeout: float) -> dict[str, Any]:
    agen: AsyncIterator[Any] = trigger.run()
    nxt = asyncio.ensure_future(agen.__anext__())
    try:
        if ready is not None:
            deadline = time.monotonic() + timeout
            while not ready():
                assert not nxt.done(), f"the trigger ended before it was ready: {nxt.result().payload}"
                assert time.monotonic() < deadline, f"the trigger's watches were not all listed within {timeout} s"
                await asyncio.sleep(0.05)
        if action is not None:
            await asyncio.to_thread(action)
        event = await asyncio.wait_for(nxt, timeout)
        return dict(event.payload)
    finally:
        if not nxt.done():
            nxt.cancel()
            await asyncio.gather(nxt, return_exceptions=True)  # aclose() refuses a generator still running
        await agen.aclose()  # type: ignore[attr-defined]


def _first_event(trigger: Any, action: Callable[[], None] | None = None, *,
                 ready: Callable[[], bool] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    return asyncio.run(_first(trigger, action, ready, timeout))


def _roundtrip(trigger: Any) -> Any:
    import importlib

    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    return again


# ---- serialize ------------------------------------------------------------------------------------------------
def test_every_trigger_is_recreated_from_its_plain_serialized_kwargs() -> None:
    lease = LeaseFreeTrigger("c1", "kvfleet_rollout/r1", history_url="postgresql+psycopg2://x/y", poll_s=2,
                             timeout_s=600)
    made = [lease,
            ClusterReadyTrigger("c1", "us-east-1", aws_conn_id="aws_x", addon="metrics-server", timeout_s=60),
            KubeReadyTrigger("c1", "us-east-1", check="ai_toolkit", args={"mode": "Enable", "nodes": 16},
                             aws_conn_id="aws_x", timeout_s=600),
            KubeWatchTrigger("c1", "us-east-1", quiet_s=3, resource_versions={"Deployment": "42"})]
    modules = ["lease", "readiness", "readiness", "kube_watch"]
    for trigger, module in zip(made, modules, strict=True):
        classpath, _ = trigger.serialize()
        assert classpath == f"kvfleet.airflow.triggers.{module}.{type(trigger).__name__}"
        _roundtrip(trigger)
    # The deadline is wall-clock from the first defer: a trigger re-created after a restart keeps it.
    again = _roundtrip(made[0])
    assert isinstance(again, LeaseFreeTrigger) and again.started_at == lease.started_at


# ---- the lease ------------------------------------------------------------------------------------------------
@pytest.fixture
def leases(fresh_db_url: str) -> Any:
    from kvfleet.history.db import get_engine
    from kvfleet.history.leases import Leases

    return Leases(get_engine(fresh_db_url))


def test_lease_trigger_waits_for_a_live_holder_and_fires_when_it_releases(leases: Any, fresh_db_url: str) -> None:
    leases.try_take(PROD, "kvfleet_curvine_upgrade/u1", "curvine upgrade")
    trigger = LeaseFreeTrigger(PROD, "kvfleet_rollout/r1", history_url=fresh_db_url, poll_s=0.05)
    looks: list[tuple[str | None, str]] = []
    check = trigger._check

    def counted() -> tuple[str | None, str]:
        looks.append(check())
        return looks[-1]

    def release() -> None:
        assert leases.release(PROD, "kvfleet_curvine_upgrade/u1")

    trigger._check = counted  # type: ignore[method-assign]
    # released once the trigger has looked twice and kept waiting (not after a fixed time)
    event = _first_event(trigger, release, ready=lambda: len(looks) >= 2)
    assert all(status is None and "kvfleet_curvine_upgrade/u1" in message for status, message in looks[:2]), looks
    assert event["status"] == "success" and event["message"] == f"no lease on {PROD}"


def test_lease_trigger_fires_at_once_for_a_dead_holder_and_for_our_own_run(leases: Any, fresh_db_url: str) -> None:
    from kvfleet.history.leases import utcnow

    leases.try_take(PROD, "kvfleet_rollout/old", "rollout", now=utcnow() - timedelta(minutes=5))
    event = _first_event(LeaseFreeTrigger(PROD, "kvfleet_rollout/r2", history_url=fresh_db_url, poll_s=0.05))
    assert event["status"] == "success" and "is dead" in event["message"] and "expired" in event["message"]

    leases.try_take(PROD, "kvfleet_rollout/r2#ml-prod-use1", "rollout")
    event = _first_event(LeaseFreeTrigger(PROD, "kvfleet_rollout/r2", history_url=fresh_db_url, poll_s=0.05))
    assert event["status"] == "success" and "our own run" in event["message"]


def test_lease_trigger_gives_up_with_the_holder_named_when_its_deadline_passed(leases: Any,
                                                                                fresh_db_url: str) -> None:
    leases.try_take(PROD, "kvfleet_curvine_upgrade/u2", "curvine upgrade")
    # Re-created after a restart with the original start: the deadline is already behind it.
    trigger = LeaseFreeTrigger(PROD, "kvfleet_rollout/r3", history_url=fresh_db_url, poll_s=0.05, timeout_s=30,
                               started_at=time.time() - 31)
    event = _first_event(trigger)
    assert event["status"] == "error" and event["reason"] == "timeout"
    assert "kvfleet_curvine_upgrade/u2 (curvine upgrade)" in event["message"]


def test_lease_trigger_fails_fast_when_the_lease_table_is_unreadable(leases: Any, fresh_db_url: str) -> None:
    """The table is gone (a database restored without kvfleet's schema): no wait can fix it."""
    from sqlalchemy import text

    with leases.engine.begin() as conn:
        conn.execute(text("DROP TABLE cluster_locks"))
    event = _first_event(LeaseFreeTrigger(PROD, "kvfleet_rollout/r4", history_url=fresh_db_url, poll_s=0.05))
    assert event["status"] == "error" and "lease table unreadable" in event["message"]
    assert "cluster_locks" in event["message"]


# ---- cluster readiness ------------------------------------------------------------------------------------------
def test_cluster_ready_trigger_succeeds_on_inservice_and_an_active_addon(fleet: Any) -> None:
    from kvfleet.fleet.constants import OPERATOR_ADDON

    event = _first_event(ClusterReadyTrigger(PROD, "us-east-1", aws_conn_id=None, poll_s=0.05))
    assert event["status"] == "success" and "InService" in event["message"]
    event = _first_event(ClusterReadyTrigger(PROD, "us-east-1", aws_conn_id=None, addon=OPERATOR_ADDON,
                                             poll_s=0.05))
    assert event["status"] == "success" and f"{OPERATOR_ADDON}" in event["message"] and "ACTIVE" in event["message"]


def test_cluster_ready_trigger_fails_fast_on_a_missing_cluster_and_a_failed_addon(fleet: Any) -> None:
    from kvfleet.clients.hyperpod import HyperPodClient

    event = _first_event(ClusterReadyTrigger("no-such-cluster", "us-east-1", aws_conn_id=None, poll_s=0.05))
    assert event["status"] == "error" and "'no-such-cluster' not found" in event["message"]

    hp = HyperPodClient("us-east-1", None)
    eks = hp.require_cluster(PROD).eks_cluster_name
    fleet.aws.fail_addon(eks, "metrics-server", "metrics-server: image pull backoff in kube-system")
    hp.update_addon(eks, "metrics-server", None, {"replicas": 2}, "OVERWRITE")
    event = _first_event(ClusterReadyTrigger(PROD, "us-east-1", aws_conn_id=None, addon="metrics-server",
                                             poll_s=0.05))
    assert event["status"] == "error" and event["addon"] == "metrics-server"
    assert "FAILED" in event["message"] and "image pull backoff" in event["message"]


def test_cluster_ready_trigger_waits_through_updating_and_fails_fast_on_failed(fleet: Any) -> None:
    from kvfleet.clients.hyperpod import HyperPodClient

    hp = HyperPodClient("us-east-1", None)
    fleet.aws.fail_next_update(PROD, "InsufficientInstanceCapacity for ml.g6e.4xlarge")
    current = hp.require_cluster(PROD)
    hp.update_tiered_storage(PROD, "Enable", 30 if current.tiered_storage.memory_percent != 30 else 40,
                             current.node_recovery or "Automatic")
    event = _first_event(ClusterReadyTrigger(PROD, "us-east-1", aws_conn_id=None, poll_s=0.05))
    assert event["status"] == "error"
    assert "is Failed" in event["message"] and "InsufficientInstanceCapacity" in event["message"]


def test_kube_ready_trigger_waits_for_the_operator_then_fires_and_gives_up_on_a_check_that_never_holds(
        fleet: Any) -> None:
    from kvfleet.fleet import constants as C

    scale = ("-n", C.OPERATOR_NAMESPACE, "scale", "deployment", C.OPERATOR_DEPLOYMENT)
    _kubectl(fleet, *scale, "--replicas=0")
    deadline = time.monotonic() + 60  # the Deployment controller's next pass (readyReplicas is omitted at 0)
    while True:
        out = subprocess.run([str(KUBECTL), "--context", PROD, "-n", C.OPERATOR_NAMESPACE, "get", "deployment",
                              C.OPERATOR_DEPLOYMENT, "-o", "jsonpath={.status.readyReplicas}"], check=True,
                             env={**os.environ, "KUBECONFIG": str(fleet.kubeconfig)}, capture_output=True, text=True)
        if out.stdout.strip() in ("", "0"):
            break
        assert time.monotonic() < deadline, f"the operator was not scaled to 0 ready within 60 s: {out.stdout!r}"
        time.sleep(0.1)
    trigger = KubeReadyTrigger(PROD, "us-east-1", check="operator", aws_conn_id=None, poll_s=0.05, timeout_s=60)
    looks: list[tuple[str | None, str]] = []
    check = trigger._check

    def counted() -> tuple[str | None, str]:
        looks.append(check())
        return looks[-1]

    trigger._check = counted  # type: ignore[method-assign]
    try:
        event = _first_event(trigger, lambda: _kubectl(fleet, *scale, "--replicas=1"),
                             ready=lambda: len(looks) >= 2)
    finally:
        _kubectl(fleet, *scale, "--replicas=1")
    assert all(status is None for status, _ in looks[:2]), looks  # not ready while scaled to 0: it waited
    assert "ready 0" in looks[0][1], looks
    assert event["status"] == "success" and "ready 1" in event["message"], event
    never = KubeReadyTrigger(PROD, "us-east-1", check="ai_toolkit", args={"mode": "Enable", "nodes": 999},
                             aws_conn_id=None, poll_s=0.05, timeout_s=0.5)
    event = _first_event(never)
    assert event["status"] == "error" and event["reason"] == "timeout", event
    assert "on 999 nodes" in event["message"], event  # the last observed state, for the task's error


# ---- the drift watch ------------------------------------------------------------------------------------------
def _kubectl(fleet: Any, *args: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(fleet.kubeconfig)}
    subprocess.run([str(KUBECTL), "--context", PROD, *args], check=True, env=env, capture_output=True, timeout=60)


def _patch_env(fleet: Any, ep: Any, value: str, annotations: dict[str, str] | None = None) -> Callable[[], None]:
    body: dict[str, Any] = {"spec": {"template": {"spec": {"containers": [
        {"name": ep.name, "env": [{"name": "KVFLEET_WATCH_TEST", "value": value}]}]}}}}
    if annotations:
        body["metadata"] = {"annotations": annotations}
    return lambda: _kubectl(fleet, "-n", ep.namespace, "patch", "deployment", ep.name, "--type", "strategic",
                            "-p", json.dumps(body))


def _ep(fleet: Any, name: str) -> Any:
    return next(e for e in fleet.inventory.endpoints if e.cluster == PROD and e.name == name)


def test_watch_fires_on_a_kubectl_edit_by_hand_stamped_as_kvfleets_change(fleet: Any) -> None:
    """An annotation an editor writes (here the ``kvfleet.io/change-id`` a former version trusted) does not hide
    the edit: only the field manager the API server records tells kvfleet's own writes apart. One edit, so the
    event cannot depend on how two edits fall into the debounce window."""
    stamped = _ep(fleet, "retail-assistant")
    trigger = KubeWatchTrigger(PROD, "us-east-1", aws_conn_id=None, quiet_s=0.5, watch_timeout_s=30)

    def stamp() -> None:
        # an annotation the operator does not render (an env patch would be re-rendered away by the running
        # operator, itself a change)
        _kubectl(fleet, "-n", stamped.namespace, "annotate", "deployment", stamped.name, "--overwrite",
                 f"kvfleet.io/change-id=t/run-{uuid.uuid4().hex[:6]}", "kvfleet.io/original-strategy=rolling")

    event = _first_event(trigger, stamp, ready=trigger.ready)
    assert event["status"] == "changed" and event["cluster"] == PROD, event
    assert event["objects"] == [f"Deployment:{stamped.namespace}/{stamped.name}"], event
    assert set(event["resource_versions"]) == {"InferenceEndpointConfig", "Deployment", "Pod", "Secret"}


def test_watch_recreated_from_its_checkpoint_resumes_and_sees_a_change_made_while_it_was_down(fleet: Any) -> None:
    ep = _ep(fleet, "payments-disputes")
    first = KubeWatchTrigger(PROD, "us-east-1", aws_conn_id=None, quiet_s=0.5, watch_timeout_s=30)
    event = _first_event(first, _patch_env(fleet, ep, "before-restart"), ready=first.ready)
    assert event["objects"] == [f"Deployment:{ep.namespace}/{ep.name}"]
    _, kwargs = first.checkpoint()
    assert kwargs["resource_versions"] == event["resource_versions"]

    _patch_env(fleet, ep, "while-down")()  # no trigger runs now
    again = KubeWatchTrigger(**{k: v for k, v in json.loads(json.dumps(kwargs)).items()})
    resumed = _first_event(again, ready=again.ready)
    assert resumed["status"] == "changed" and resumed["objects"] == [f"Deployment:{ep.namespace}/{ep.name}"]


class _AssetStore:
    """The asset's state store as the triggerer injects it (``AssetStateStoreAccessors``: ``aget``/``aset``),
    kept in a dict: in Airflow it persists in the metadata database across triggerer restarts."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = json.loads(json.dumps(value))


def test_watch_as_the_triggerer_restarts_it_resumes_from_the_asset_state_store(fleet: Any) -> None:
    """The triggerer re-creates an event trigger from its DAG-time kwargs (no watermark in them) and injects the
    asset's state store: the watermark saved with the last event brings the change made meanwhile."""
    ep = _ep(fleet, "retail-assistant")
    store = _AssetStore()
    first = KubeWatchTrigger(PROD, "us-east-1", aws_conn_id=None, quiet_s=0.5, watch_timeout_s=30)
    first.asset_state_store = store  # type: ignore[assignment]
    event = _first_event(first, _patch_env(fleet, ep, "before-restart"), ready=first.ready)
    assert store.values["resource_versions"] == event["resource_versions"]

    _patch_env(fleet, ep, "while-the-triggerer-was-down")()
    again = _roundtrip(KubeWatchTrigger(PROD, "us-east-1", aws_conn_id=None, quiet_s=0.5, watch_timeout_s=30))
    assert again.serialize()[1]["resource_versions"] == {}
    again.asset_state_store = store
    resumed = _first_event(again, ready=again.ready)
    assert resumed["objects"] == [f"Deployment:{ep.namespace}/{ep.name}"]


def test_fleet_watch_reads_the_inventory_and_names_the_changed_cluster(fleet: Any, tmp_path: Path) -> None:
    """One trigger for the DAG's asset: a watch per inventory cluster, each event naming its cluster."""
    ep = _ep(fleet, "payments-disputes")
    trigger = _roundtrip(FleetWatchTrigger(str(ROOT / "fleet.example.yaml"), aws_conn_id=None, quiet_s=0.5,
                                           watch_timeout_s=30))
    event = _first_event(trigger, _patch_env(fleet, ep, "fleet-watch"), ready=trigger.ready)
    assert [c.cluster for c in trigger.children] == ["ml-prod-use1", "ml-stage-usw2"]
    assert event["status"] == "changed" and event["cluster"] == PROD_KEY, event
    assert event["objects"] == [f"Deployment:{ep.namespace}/{ep.name}"]


OUTAGES = {  # the sandbox fault on the cluster's API server, and what the reported failure says
    "5xx": ({"kind": "api_error_rate", "rate": 1.0, "target": "kube"}, r"HTTP 5\d\d\b"),
    "stall": ({"kind": "api_latency", "seconds": 3.0, "target": "kube"}, r"(?i)timed? ?out"),
}


@pytest.mark.parametrize(("resumed", "outage"), [(False, "5xx"), (True, "5xx"), (False, "stall")],
                         ids=["fresh-5xx", "resumed-5xx", "fresh-stall"])
def test_fleet_watch_reports_a_cluster_whose_watch_failed_and_watches_it_again(
        fleet: Any, monkeypatch: pytest.MonkeyPatch, resumed: bool, outage: str) -> None:
    """A cluster's watch whose start fails (its API server answers 5xx to the first list, or does not answer
    within the list's timeout; whether the watch starts fresh or resumes a watermark a previous triggerer saved)
    is one ``error`` event naming the cluster, not a silent end and not one per retry; once the API server answers
    again the cluster is watched again: a change made by hand fires."""
    monkeypatch.setattr(FleetWatchTrigger, "RETRY_BASE_S", 0.05)
    monkeypatch.setattr(kube_watch, "LIST_TIMEOUT_S", 0.5)  # below the stall's 3 s
    fault, says = OUTAGES[outage]
    ep = _ep(fleet, "payments-disputes")
    store = _AssetStore()
    if resumed:
        first = KubeWatchTrigger(PROD, "us-east-1", aws_conn_id=None, quiet_s=0.5, watch_timeout_s=30)
        _first_event(first, _patch_env(fleet, ep, "before-the-outage"), ready=first.ready)
        store.values[f"{PROD_KEY}/resource_versions"] = first.checkpoint()[1]["resource_versions"]
    trigger = _roundtrip(FleetWatchTrigger(str(ROOT / "fleet.example.yaml"), aws_conn_id=None, quiet_s=0.5,
                                           watch_timeout_s=30))
    trigger.asset_state_store = store

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        agen: AsyncIterator[Any] = trigger.run()
        fleet.admin.fault({"cluster": PROD, **fault})
        try:
            failed = dict((await asyncio.wait_for(agen.__anext__(), 60)).payload)
            # still failing: retried after 0.05, 0.1, 0.2 and 0.4 s, each retry logged, none an event
            deadline = time.monotonic() + 60
            while trigger.restarts.get(PROD_KEY, 0) < 4:
                assert time.monotonic() < deadline, f"the failed watch was retried {trigger.restarts} in 60 s"
                await asyncio.sleep(0.05)
        finally:
            fleet.admin.fault({"cluster": PROD, "kind": "clear"})
        deadline = time.monotonic() + 60
        while not trigger.ready():
            assert time.monotonic() < deadline, "the failed cluster was not watched again within 60 s"
            await asyncio.sleep(0.05)
        nxt = asyncio.ensure_future(agen.__anext__())
        try:
            await asyncio.to_thread(_patch_env(fleet, ep, "after-the-outage"))
            return failed, dict((await asyncio.wait_for(nxt, 60)).payload)
        finally:
            if not nxt.done():
                nxt.cancel()
                await asyncio.gather(nxt, return_exceptions=True)
            await agen.aclose()  # type: ignore[attr-defined]

    failed, changed = asyncio.run(scenario())
    assert failed["status"] == "error" and failed["cluster"] == PROD_KEY and failed["kind"] == "watch", failed
    assert re.search(says, failed["message"]), failed  # what failed: the run records it (drift_watch:<cluster>)
    assert trigger.restarts.get(PROD_KEY, 0) >= 4 and not trigger.restarts.get("default/us-west-2/ml-stage-usw2"), trigger.restarts
    # the next event after the failure is the change: the retries that failed too were not passed on
    assert changed["status"] == "changed" and changed["cluster"] == PROD_KEY, changed
    assert f"Deployment:{ep.namespace}/{ep.name}" in changed["objects"], changed


def test_watch_reports_a_resync_when_its_resource_version_is_gone(fleet: Any) -> None:
    """A watermark older than the API server's history: 410 Gone, a re-list, and one event (changes may have
    been missed while it was down, so the drift check runs)."""
    store = fleet.twin(PROD).store
    old = str(store.get("apps", "deployments", "payments-disputes", "payments")["metadata"]["resourceVersion"])
    # Push the version the watch resumes from out of the API server's history (ConfigMap churn, unwatched).
    store.create("", "configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": "churn", "namespace": "default"}, "data": {"n": "0"}})
    from kvfleet_sandbox.kube.store import HISTORY_LIMIT

    for n in range(HISTORY_LIMIT + 1):
        store.patch("", "configmaps", "churn", "default", {"data": {"n": str(n)}}, "application/merge-patch+json")
    trigger = KubeWatchTrigger(PROD, "us-east-1", aws_conn_id=None, quiet_s=0.5, watch_timeout_s=30,
                               resource_versions={"Deployment": old})
    event = _first_event(trigger)
    assert event["status"] == "changed" and "Deployment:*" in event["objects"]


def test_watch_refused_by_rbac_is_an_error_event_naming_the_grant() -> None:
    """Without the watch grants (k8s/rbac as committed today), kvfleet's identity is refused: one error event
    at once, not a silent watch."""
    from kubernetes.client.exceptions import ApiException

    refused: list[Any] = []

    def put(item: tuple[str, str, Any]) -> None:
        refused.append(item)

    watcher = kube_watch._Watcher(kube_watch.streams()[0], None, "1", put, 5)
    assert watcher._failed(ApiException(status=403, reason="Forbidden")) is True  # the stream stops
    assert refused == [("InferenceEndpointConfig", "FAILED", {"status": 403, "reason": "Forbidden"})]
    trigger = KubeWatchTrigger(PROD, "us-east-1")
    kinds = {s.kind: s for s in kube_watch.streams()}
    event = trigger._judge(refused[0], kinds, {}, watch_rules.Burst())
    assert event is not None and event.payload["status"] == "error"
    assert "HTTP 403" in event.payload["message"] and "RBAC" in event.payload["message"]


def test_two_failures_are_the_same_trouble_when_their_type_and_status_class_match() -> None:
    """What the fleet watch reports once per run of failures: an outage answering 500 then 503 is one cause; a
    refusal after it, or an unreachable endpoint, is another (and so is reported)."""
    from kubernetes.client.exceptions import ApiException

    key = fleet_watch.cause_key
    assert key(ApiException(status=500, reason="Internal Server Error")) == key(
        ApiException(status=503, reason="Service Unavailable"))
    assert key(ApiException(status=503)) != key(ApiException(status=403))
    assert key(ConnectionError("connect to 10.0.0.1:443 failed")) == key(ConnectionError("connect to 10.0.0.2:443 failed"))
    assert key(ConnectionError("refused")) != key(TimeoutError("refused"))
    assert fleet_watch.one_line(ApiException(status=503, reason="Service Unavailable")) == (
        "ApiException: HTTP 503 Service Unavailable")
