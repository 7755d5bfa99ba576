"""Each cluster reached with its own identity (``kvfleet.clients.identity``, ``kvfleet.clients.aws``): on the twin
started with tests/fleets/multi-account.yaml (kvfleet_sandbox keeps its state per account), stages 1-3 converge
both ``ml-prod`` clusters, each through its account's role assumed from the hub's base identity, with the session
named after the run and tagged with it and the LOB; ml-eval through its account's own connection. A role the hub
cannot assume is refused before any change, naming the role and what its trust policy must allow."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from twinenv import use_twin

from kvfleet.clients.identity import Identity, identity_for
from kvfleet.errors import PermanentError
from kvfleet.fleet.inventory import load_inventory
from kvfleet.history.keys import StepKey
from kvfleet.stages import addons, curvine, tiered_storage
from kvfleet.stages.base import StageContext, Timeouts

pytestmark = pytest.mark.integration

FLEET = Path(__file__).resolve().parents[2] / "fleets" / "multi-account.yaml"
HUB, RETAIL, PAYMENTS, SHARED = "123456789012", "111111111111", "222222222222", "333333333333"
RUN = ("kvfleet_rollout", "manual__accounts")


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    sandbox = start_sandbox(FLEET, tmp_path_factory.mktemp("accounts"), SandboxSettings(time_scale=0.005))
    try:
        yield sandbox
    finally:
        sandbox.stop()


def _ctx(inv: Any, key: str, identity: Identity | None = None, **kw: Any) -> StageContext:
    cl = inv.cluster(key)
    return StageContext(inventory=inv, cluster=cl, aws_conn_id=None,
                        identity=identity or identity_for(inv, cl, conn_id=None, run=RUN),
                        timeouts=Timeouts(cluster_update_s=120, addon_s=120, pods_s=120, pvc_s=60), **kw)


def test_each_cluster_converges_as_its_account(twin: Any, monkeypatch: pytest.MonkeyPatch, history: Any) -> None:
    use_twin(twin, monkeypatch)
    inv = load_inventory(FLEET)
    history.runs.start("kvfleet_rollout/manual__accounts", dag_id=RUN[0], run_id=RUN[1], trigger="test",
                       triggered_by=None, params={})
    for cluster in inv.clusters:
        ctx = _ctx(inv, cluster.key, history=history, step_key=StepKey("kvfleet_rollout/manual__accounts", "s"))
        try:
            assert [s.reconcile(ctx).outcome for s in (tiered_storage, addons, curvine)] == ["changed"] * 3, \
                cluster.key
        finally:
            ctx.close()
    # Every change was made in the cluster's own account, as its role, in a session named after the run and
    # tagged with it and the cluster's LOB; none in the hub's account.
    for account, role, lob in ((RETAIL, "kvfleet-operator", "retail"), (PAYMENTS, "kvfleet-operator", "payments")):
        changes = twin.aws.calls(account=account, mutating=True)
        assert changes, account
        assert {c.caller_arn for c in changes} == {
            f"arn:aws:sts::{account}:assumed-role/{role}/kvfleet-rollout-manual__accounts"}
        assert {c.session_tags for c in changes} == {(("run", "kvfleet_rollout/manual__accounts"), ("lob", lob))}
    assert {c.caller_arn.split(":")[4] for c in twin.aws.calls(account=SHARED, mutating=True)} == {SHARED}
    assert twin.aws.calls(account=HUB, mutating=True) == []
    hp = {k: twin.aws.hyperpod_cluster("ml-prod", account=a) for k, a in (("retail", RETAIL), ("pay", PAYMENTS))}
    assert {k: v["TieredStorageConfig"]["Mode"] for k, v in hp.items()} == {"retail": "Enable", "pay": "Enable"}


@pytest.mark.parametrize("change,said", [
    ({"external_id": "wrong"}, "with the account's external id (sts:ExternalId)"),
    ({"role_arn": f"arn:aws:iam::{RETAIL}:role/not-trusted"}, "must allow the base identity sts:AssumeRole"),
])
def test_a_role_the_hub_cannot_assume_is_refused_before_any_change(
        twin: Any, monkeypatch: pytest.MonkeyPatch, change: dict[str, str], said: str) -> None:
    use_twin(twin, monkeypatch)
    inv = load_inventory(FLEET)
    key = f"{RETAIL}/us-east-1/ml-prod"
    base = identity_for(inv, inv.cluster(key), conn_id=None, run=RUN)
    wrong = Identity(**{**base.__dict__, **change})
    twin.aws.reset_request_log()
    ctx = _ctx(inv, key, wrong)
    try:
        with pytest.raises(PermanentError) as err:
            tiered_storage.reconcile(ctx)
    finally:
        ctx.close()
    text = str(err.value)
    assert f"AssumeRole {wrong.role_arn} (account {RETAIL}" in text and "AWS AccessDenied" in text and said in text
    assert [c.operation for c in twin.aws.request_log] == ["AssumeRole"]
    assert twin.aws.calls(mutating=True) == []


def test_a_curvine_upgrade_outlasts_its_credentials(twin: Any, monkeypatch: pytest.MonkeyPatch, history: Any) -> None:
    """Credentials that expire every 2 seconds (the twin's AssumeRole, capped): the upgrade still completes, its
    Kubernetes calls and its helm commands on tokens renewed as the credentials were assumed again."""
    from kvfleet.stages import curvine_upgrade as up

    use_twin(twin, monkeypatch)
    inv = load_inventory(FLEET)
    key = f"{RETAIL}/us-east-1/ml-prod"
    history.runs.start("kvfleet_curvine_upgrade/expiring", dag_id="kvfleet_curvine_upgrade", run_id="expiring",
                       trigger="test", triggered_by=None, params={})
    twin.aws.credential_lifetime_s = 2
    twin.servers[key].latency_s = 0.05  # every Kubernetes call slower, so the upgrade outlasts its credentials
    try:
        twin.aws.reset_request_log()
        ctx = _ctx(inv, key, identity=identity_for(inv, inv.cluster(key), conn_id=None,
                                                   run=("kvfleet_curvine_upgrade", "expiring")),
                   history=history, step_key=StepKey("kvfleet_curvine_upgrade/expiring", "upgrade"))
        started = time.time()
        try:
            out = up.upgrade(ctx, up.UpgradeRequest(version="0.3.3-alpha", timeout_s=120),
                             holder="kvfleet_curvine_upgrade/expiring")
        finally:
            ctx.close()
        took = time.time() - started
    finally:
        twin.aws.credential_lifetime_s = None
        twin.servers[key].latency_s = 0.0
    assert out.outcome == "changed", out.detail
    assert out.detail["to_revision"] == out.detail["from_revision"] + 1
    assumed = [c for c in twin.aws.request_log if c.operation == "AssumeRole"]
    # the precondition of the test, not a timing: the upgrade outlasted several lifetimes of its credentials
    assert took > 2 * 2, took
    assert len(assumed) >= 3, len(assumed)


def test_a_900s_session_is_assumed_once_not_before_every_call(twin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortest session STS allows is reused until near its end (botocore's own refresh windows, 15 and 10
    minutes, would assume it again before every call)."""
    from kvfleet.clients import aws
    from kvfleet.clients.factory import hyperpod_for

    use_twin(twin, monkeypatch)
    aws.forget()
    inv = load_inventory(FLEET)
    cl = inv.cluster(f"{RETAIL}/us-east-1/ml-prod")
    who = Identity(**{**identity_for(inv, cl, conn_id=None, run=RUN).__dict__, "duration_s": 900})
    twin.aws.reset_request_log()
    hp = hyperpod_for(cl.ref, who)
    for _ in range(5):
        assert hp.describe_cluster("ml-prod") is not None
    ops = [c.operation for c in twin.aws.request_log]
    assert ops.count("AssumeRole") == 1 and ops.count("DescribeCluster") == 5, ops


def test_an_old_trigger_resumes_in_its_account(twin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trigger kwargs serialized before the identity travelled (aws_conn_id + account) act as that connection."""
    from kvfleet.airflow.triggers.readiness import ClusterReadyTrigger

    use_twin(twin, monkeypatch)
    old = {"cluster": "ml-eval", "region": "us-west-2", "aws_conn_id": "aws_shared_services", "addon": None,
           "poll_s": 0.1, "timeout_s": 30.0, "started_at": time.time(), "account": SHARED}
    trigger = ClusterReadyTrigger(**old)
    assert trigger.identity == Identity(account=SHARED, conn_id="aws_shared_services")
    assert trigger._hyperpod().caller_identity()["Account"] == SHARED


def test_the_dry_run_is_guarded_too(twin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --diff`'s path: a role of another account than the cluster's is refused by the guard."""
    use_twin(twin, monkeypatch)
    inv = load_inventory(FLEET)
    cl = inv.cluster(f"{RETAIL}/us-east-1/ml-prod")
    good = identity_for(inv, cl, conn_id=None, run=RUN)
    pay = identity_for(inv, inv.cluster(f"{PAYMENTS}/us-east-1/ml-prod"), conn_id=None, run=RUN)
    wrong = Identity(**{**good.__dict__, "role_arn": pay.role_arn, "external_id": None, "duration_s": 1800})
    twin.aws.reset_request_log()
    ctx = StageContext(inventory=inv, cluster=cl, aws_conn_id=None, identity=wrong, dry_run=True)
    try:
        with pytest.raises(PermanentError, match=f"in account {PAYMENTS}, but the inventory puts cluster ml-prod in "
                                                 f"account {RETAIL}"):
            tiered_storage.reconcile(ctx)
    finally:
        ctx.close()
    assert twin.aws.calls(mutating=True) == []


def test_an_account_connection_that_does_not_exist_is_refused(twin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The account's own aws_conn_id, undefined: refused naming it, never a fall back to the hub's credentials."""
    use_twin(twin, monkeypatch)
    monkeypatch.delenv("AIRFLOW_CONN_AWS_SHARED_SERVICES")
    inv = load_inventory(FLEET)
    twin.aws.reset_request_log()
    ctx = _ctx(inv, f"{SHARED}/us-west-2/ml-eval")
    try:
        with pytest.raises(PermanentError, match="the Airflow connection aws_shared_services .account 333333333333. "
                                                 "does not exist"):
            tiered_storage.reconcile(ctx)
    finally:
        ctx.close()
    assert twin.aws.request_log == []


def test_the_drift_watch_reaches_each_cluster_as_its_account(twin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drift watch belongs to no run: each of its per-cluster watches reaches its cluster's Kubernetes API as
    the account's role (or the account's own connection), in a session named after the watch."""
    from kvfleet.airflow.triggers.fleet_watch import FleetWatchTrigger, watched
    from kvfleet.clients.factory import kube_for
    from kvfleet.clients.kube import call

    use_twin(twin, monkeypatch)
    found = watched(str(FLEET), "aws_default")
    trigger = FleetWatchTrigger(str(FLEET), aws_conn_id="aws_default")
    trigger._children(found)
    assert [(c.ref.key, c.identity.role_arn or c.identity.conn_id) for c in trigger.children] == [
        (f"{RETAIL}/us-east-1/ml-prod", f"arn:aws:iam::{RETAIL}:role/kvfleet-operator"),
        (f"{PAYMENTS}/us-east-1/ml-prod", f"arn:aws:iam::{PAYMENTS}:role/platform/kvfleet-operator"),
        (f"{SHARED}/us-west-2/ml-eval", "aws_shared_services")]
    twin.aws.reset_request_log()
    for child in trigger.children:
        access = kube_for(child.ref, child.identity)
        try:
            assert call(access.core.read_namespace, "kube-system", what="read kube-system").metadata.name
        finally:
            access.close()
    callers = {(c.account, c.caller_arn.split(":")[4], c.caller_arn.split(":", 5)[5])
               for c in twin.aws.request_log if c.operation == "DescribeCluster"}
    assert {(a, owner) for a, owner, _ in callers} == {(RETAIL, RETAIL), (PAYMENTS, PAYMENTS), (SHARED, SHARED)}
    assert {who for a, _, who in callers if a != SHARED} == {"assumed-role/kvfleet-operator/kvfleet-drift_watch-watch"}
