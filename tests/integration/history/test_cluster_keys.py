"""Clusters named by their key in the history (revision 0011, ``kvfleet.history.clusters``).

- The revision upgrades a history written by the previous revision (bare names; a lease held, a parallelism slot,
  an open drift finding, audit rows): each row gets the key its run's pinned inventory gives the name, the lease
  still protects its cluster for its holder, the finding's fingerprint is the one the next check computes, and
  the audit chain still verifies, its rows untouched.
- A history that holds rows of two ``ml-prod`` clusters (two accounts) keeps them apart in every `kvfleet audit`
  listing and filter, and refuses the bare name ``ml-prod`` listing both keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from kvfleet.fleet.drift import Finding
from kvfleet.fleet.pinning import pin
from kvfleet.history import migrate
from kvfleet.history.clusters import AmbiguousCluster, filter_values
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos

FLEETS = Path(__file__).resolve().parents[2] / "fleets"
RETAIL = "111111111111/us-east-1/ml-prod"
PAYMENTS = "222222222222/us-east-1/ml-prod"
TWIN = "default/us-east-1/ml-prod-use1"
GATED = "kvfleet_rollout/gated"


def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from kvfleet.cli import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _seed_as_revision_0010(history: HistoryRepos) -> Finding:
    """What the previous revision wrote: bare names everywhere, a gated rollout holding its lease and slot."""
    twin, multi = pin(FLEETS / "twin.yaml"), pin(FLEETS / "multi-account.yaml")
    history.runs.start(GATED, dag_id="kvfleet_rollout", run_id="gated", trigger="manual", triggered_by="alice",
                       params={}, inventory=twin)
    # a run of the multi-account fleet scoped to the payments account's ml-prod (the name is in two accounts)
    history.runs.start("kvfleet_rollout/payments", dag_id="kvfleet_rollout", run_id="payments", trigger="manual",
                       triggered_by="bob", params={"clusters": [PAYMENTS]}, inventory=multi)
    history.runs.start("kvfleet_rollout/older", dag_id="kvfleet_rollout", run_id="older", trigger="manual",
                       triggered_by="bob", params={})  # from before runs pinned their inventory
    history.runs.record_step(StepKey(GATED, "cluster_stages", 0), StepEvent(
        "endpoint:alpha/alpha-chat", "endpoint", "changed", cluster="ml-prod-use1", endpoint="alpha/alpha-chat"))
    history.runs.record_step(StepKey("kvfleet_rollout/payments", "cluster_stages", 0), StepEvent(
        "endpoint:pay/pay-chat", "endpoint", "changed", cluster="ml-prod", endpoint="pay/pay-chat"))
    history.runs.record_step(StepKey("kvfleet_rollout/older", "cluster_stages", 0), StepEvent(
        "endpoint:x/y", "endpoint", "changed", cluster="gone-cluster", endpoint="x/y"))
    with history.audit.write_ahead(StepKey(GATED, "cluster_stages", 0), "patch", "alpha/alpha-chat",
                                   cluster="ml-prod-use1", endpoint="alpha/alpha-chat"):
        pass
    history.leases.try_take("ml-prod-use1", GATED, "rollout", 60)
    history.leases.park("ml-prod-use1", GATED)
    history.leases.try_take(f"slot:{GATED}:0", f"{GATED}#ml-prod-use1", "rollout parallelism", 600)
    finding = Finding("operator_paused", "ml-prod-use1", "Deployment/x/y", "spec.replicas", "1", "0")
    history.drift.sync("ml-prod-use1", [finding.as_dict()], GATED)
    return finding


def _rows(history: HistoryRepos, sql: str) -> list[Any]:
    with history.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql))]


def test_the_upgrade_keys_every_row_keeps_the_lease_and_the_chain_verifies(
        fresh_db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KVFLEET_HISTORY_URL", fresh_db_url)
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine, "0010_pinned_inventory")
    history = HistoryRepos.on(engine)
    finding = _seed_as_revision_0010(history)
    audit_before = _rows(history, "SELECT id, cluster, row_hash FROM audit_log ORDER BY id")

    migrate.upgrade(engine)

    assert sorted(_rows(history, "SELECT run_key, cluster FROM step_events")) == [
        ("kvfleet_rollout/gated", TWIN), ("kvfleet_rollout/older", "gone-cluster"),  # no snapshot: kept
        ("kvfleet_rollout/payments", PAYMENTS)]  # the run's scope chose one of the two ml-prod
    # the lease still protects the cluster for its holder, under the key its next task asks for; the slot is kept
    assert sorted(_rows(history, "SELECT cluster, holder, state FROM cluster_locks")) == [
        (TWIN, GATED, "parked"), (f"slot:{GATED}:0", f"{GATED}#{TWIN}", "active")]
    assert history.leases.try_take(TWIN, "kvfleet_rollout/other", "rollout")["holder"] == GATED
    assert history.leases.try_take(TWIN, GATED, "rollout")["holder"] == GATED
    # the open finding is the one the next check computes on the key: touched, not opened again
    (row,) = _rows(history, "SELECT cluster, fingerprint FROM drift_findings WHERE resolved_at IS NULL")
    keyed = Finding(finding.kind, TWIN, finding.object_ref, finding.field, finding.expected, finding.actual)
    assert row == (TWIN, keyed.fingerprint) and keyed.fingerprint != finding.fingerprint
    assert history.drift.sync(TWIN, [keyed.as_dict()], "kvfleet_drift_check/next")["still_open"] == 1
    assert sorted(_rows(history, "SELECT cluster FROM endpoint_state")) == [
        (PAYMENTS,), (TWIN,), ("gone-cluster",)]
    # the audit log is not rewritten, and its chain verifies; its older rows are found by the key
    assert _rows(history, "SELECT id, cluster, row_hash FROM audit_log ORDER BY id") == audit_before
    code, out, err = _cli("audit", "verify", capsys=capsys)
    assert code == 0, (out, err)
    code, out, _ = _cli("audit", "changes", "--cluster", TWIN, "--json", capsys=capsys)
    assert code == 0 and [r["endpoint"] for r in json.loads(out)] == ["alpha/alpha-chat"]

    # undone: every key is its name again (here no two keys share a name)
    migrate.downgrade(engine, "0010_pinned_inventory")
    assert sorted(_rows(history, "SELECT cluster FROM step_events")) == [
        ("gone-cluster",), ("ml-prod",), ("ml-prod-use1",)]
    engine.dispose()


def test_the_downgrade_refuses_two_keys_of_one_name(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine)
    history = HistoryRepos.on(engine)
    for run, key in (("t/retail", RETAIL), ("t/payments", PAYMENTS)):
        history.runs.start(run, dag_id="t", run_id=run, trigger="test", triggered_by=None, params={})
        history.runs.record_step(StepKey(run, "s"), StepEvent("endpoint:a/b", "endpoint", "changed", cluster=key,
                                                              endpoint="a/b"))
    with pytest.raises(Exception, match="share a name \\(ml-prod\\)"):
        migrate.downgrade(engine, "0010_pinned_inventory")
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


def _two_ml_prod(history: HistoryRepos) -> None:
    """Rows of both ml-prod clusters in every table a listing reads, and a bare-named row from before 0011."""
    for run, key, ep in (("kvfleet_rollout/r", RETAIL, "shop/chat"), ("kvfleet_rollout/p", PAYMENTS, "pay/chat")):
        history.runs.start(run, dag_id="kvfleet_rollout", run_id=run.split("/")[1], trigger="manual",
                           triggered_by="alice", params={})
        step = StepKey(run, "cluster_stages", 0)
        history.runs.record_step(step, StepEvent(f"endpoint:{ep}", "endpoint", "changed", cluster=key, endpoint=ep))
        with history.audit.write_ahead(step, "patch", ep, cluster=key, endpoint=ep):
            pass
        history.verifications.record(step, f"verify:{ep}:1000", {
            "cluster": key, "endpoint": ep, "lob": ep.split("/")[0], "verdict": "pass", "prompt_tokens": 1000,
            "speedup": 2.0, "hit_ratio": 1.0})
        history.drift.sync(key, [Finding("operator_paused", key, f"Deployment/{ep}", "spec.replicas", "1",
                                         "0").as_dict()], run)
        history.runs.record_step(StepKey(run, "cluster.gate_0", 0), StepEvent(
            "gate_response:cluster.gate_0", "gate", "continue", cluster=key,
            detail={"chosen": "Approve", "responded_by": {"name": "alice"}}))
        history.curvine.record_capacity(run_key=run, step="curvine", cluster=key, phase="verify",
                                        overview={"capacity": int(key[0]) * 2**30})


@pytest.mark.parametrize(("listing", "column"), [
    (("changes",), "cluster"), (("verifications",), "cluster"), (("drift",), "cluster"),
    (("drift", "--open"), "cluster")])
def test_each_listing_keeps_the_two_ml_prod_apart(history: HistoryRepos, capsys: pytest.CaptureFixture[str],
                                                 listing: tuple[str, ...], column: str) -> None:
    _two_ml_prod(history)
    code, out, err = _cli("audit", *listing, "--json", capsys=capsys)
    assert code == 0, err
    assert sorted({r[column] for r in json.loads(out)}) == [RETAIL, PAYMENTS]
    for key in (RETAIL, PAYMENTS):
        code, out, err = _cli("audit", *listing, "--cluster", key, "--json", capsys=capsys)
        assert code == 0 and {r[column] for r in json.loads(out)} == {key}, err
    code, out, err = _cli("audit", *listing, "--cluster", "ml-prod", "--json", capsys=capsys)
    assert (code, out) == (2, "") and RETAIL in err and PAYMENTS in err and "account/region/name" in err


def test_the_curvine_audit_shows_one_ml_prod_at_a_time(history: HistoryRepos,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _two_ml_prod(history)
    for key in (RETAIL, PAYMENTS):
        code, out, err = _cli("audit", "curvine", "--cluster", key, "--json", capsys=capsys)
        assert code == 0, err
        assert [r["capacity_bytes"] for r in json.loads(out)["capacity"]] == [int(key[0]) * 2**30]
    code, out, err = _cli("audit", "curvine", "--cluster", "ml-prod", capsys=capsys)
    assert (code, out) == (2, "") and RETAIL in err and PAYMENTS in err


def test_a_bare_name_reads_its_key_and_its_older_rows(history: HistoryRepos) -> None:
    history.runs.start("t/old", dag_id="t", run_id="old", trigger="test", triggered_by=None, params={})
    history.runs.record_step(StepKey("t/old", "s"), StepEvent("endpoint:a/b", "endpoint", "changed", cluster="c1",
                                                              endpoint="a/b"))
    assert filter_values(history.engine, "c1") == ["c1"]
    history.runs.record_step(StepKey("t/old", "s2"), StepEvent("endpoint:a/c", "endpoint", "changed",
                                                               cluster="default/eu-west-1/c1", endpoint="a/c"))
    assert filter_values(history.engine, "c1") == ["default/eu-west-1/c1", "c1"]
    assert filter_values(history.engine, "default/eu-west-1/c1") == ["default/eu-west-1/c1", "c1"]
    assert filter_values(history.engine, "111111111111/eu-west-1/c1") == ["111111111111/eu-west-1/c1"]
    history.runs.record_step(StepKey("t/old", "s3"), StepEvent("endpoint:a/d", "endpoint", "changed",
                                                               cluster="111111111111/eu-west-1/c1", endpoint="a/d"))
    with pytest.raises(AmbiguousCluster, match="names 2 clusters"):
        filter_values(history.engine, "c1")
    # an account named as the inventory names it: the history knows the id
    with pytest.raises(ValueError, match="12-digit id"):
        filter_values(history.engine, "retail-prod/eu-west-1/c1")
    # bare rows (the base account's) and one other account's key: two clusters, not one
    history.runs.record_step(StepKey("t/old", "s4"), StepEvent("endpoint:a/e", "endpoint", "changed", cluster="c2",
                                                               endpoint="a/e"))
    history.runs.record_step(StepKey("t/old", "s5"), StepEvent("endpoint:a/f", "endpoint", "changed",
                                                               cluster="111111111111/eu-west-1/c2", endpoint="a/f"))
    with pytest.raises(AmbiguousCluster, match="older rows"):
        filter_values(history.engine, "c2")
    for bad in ("a/b", "a//c", "x" * 300):
        with pytest.raises(ValueError, match="--cluster"):
            filter_values(history.engine, bad)


@pytest.mark.parametrize("view", ["fleet", "drift", "curvine", "trends"])
def test_the_page_keeps_the_two_ml_prod_apart(history: HistoryRepos, view: str) -> None:
    from kvfleet.airflow.ui import pages
    from kvfleet.airflow.ui.catalog import Filters, QueryError

    _two_ml_prod(history)
    seen = {}
    for key in (RETAIL, PAYMENTS):
        data = pages.build(view, history, Filters.from_query({"cluster": key}))
        if view == "curvine":
            assert data.pop("clusters") == [RETAIL, PAYMENTS]  # the picker lists both, by key
        text_ = json.dumps(data, default=str)
        seen[key] = text_
        other = PAYMENTS if key == RETAIL else RETAIL
        assert key in text_ and other not in text_, (view, key)
    assert seen[RETAIL] != seen[PAYMENTS]
    if view != "trends":  # trends without an endpoint lists the choices; a bare ambiguous name is refused
        with pytest.raises(QueryError, match="names 2 clusters") as err:
            pages.build(view, history, Filters.from_query({"cluster": "ml-prod"}))
        assert err.value.status == 400 and RETAIL in str(err.value) and PAYMENTS in str(err.value)


def test_the_other_listings_name_each_ml_prod_by_key(history: HistoryRepos,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _two_ml_prod(history)
    code, out, err = _cli("audit", "gates", "--json", capsys=capsys)
    assert code == 0, err
    assert sorted((r["run_key"], r["cluster"]) for r in json.loads(out)) == [
        ("kvfleet_rollout/p", PAYMENTS), ("kvfleet_rollout/r", RETAIL)]
    code, out, err = _cli("audit", "endpoint", "--endpoint", "chat", "--json", capsys=capsys)
    assert code == 0, err
    assert {(r["cluster"], r["endpoint"]) for r in json.loads(out)} == {(RETAIL, "shop/chat"), (PAYMENTS, "pay/chat")}
    for run, key in (("kvfleet_rollout/r", RETAIL), ("kvfleet_rollout/p", PAYMENTS)):
        code, out, err = _cli("audit", "changes", "--run", run, "--json", capsys=capsys)
        assert code == 0 and {r["cluster"] for r in json.loads(out)} == {key}, err


def test_an_upgrade_that_cannot_key_a_held_lease_is_refused_and_older_findings_still_resolve(
        fresh_db_url: str) -> None:
    """From revision 0009 (no pinned inventories): a live lease on a bare name would stop protecting its cluster
    (its next holder asks by the key), so the upgrade is refused naming it; once it is freed the upgrade goes on,
    the bare rows stay bare, and a check on the key resolves the older bare finding as gone."""
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine, "0009_endpoint_state")
    history = HistoryRepos.on(engine)
    history.runs.start("kvfleet_rollout/old", dag_id="kvfleet_rollout", run_id="old", trigger="manual",
                       triggered_by="bob", params={})
    history.leases.try_take("ml-prod-use1", "kvfleet_rollout/old", "rollout", 600)
    old = Finding("operator_paused", "ml-prod-use1", "Deployment/x/y", "spec.replicas", "1", "0")
    history.drift.sync("ml-prod-use1", [old.as_dict()], "kvfleet_rollout/old")
    with pytest.raises(Exception, match=r"held leases are in: ml-prod-use1 \(held by kvfleet_rollout/old"):
        migrate.upgrade(engine)
    assert migrate.current_revision(engine) == "0009_endpoint_state"  # nothing changed
    history.leases.release("ml-prod-use1", "kvfleet_rollout/old")
    migrate.upgrade(engine)
    assert _rows(history, "SELECT cluster, fingerprint FROM drift_findings WHERE resolved_at IS NULL") == [
        ("ml-prod-use1", old.fingerprint)]
    keyed = Finding(old.kind, TWIN, old.object_ref, old.field, old.expected, "2")
    assert history.drift.sync(TWIN, [], "kvfleet_drift_check/next")["resolved"] == 1  # the bare one, by its name
    assert history.drift.sync(TWIN, [keyed.as_dict()], "kvfleet_drift_check/later")["opened"] == 1
    engine.dispose()


def test_an_open_finding_already_written_under_its_key_absorbs_its_bare_twin(fresh_db_url: str) -> None:
    """The previous revision wrote an endpoint's finding under the cluster as the endpoint named it (a key, or
    its name): the same finding open under both becomes one, the keyed one; the upgrade does not stop on it."""
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine, "0010_pinned_inventory")
    history = HistoryRepos.on(engine)
    history.runs.start(GATED, dag_id="kvfleet_rollout", run_id="gated", trigger="manual", triggered_by="alice",
                       params={}, inventory=pin(FLEETS / "twin.yaml"))
    args = ("endpoint_missing", "InferenceEndpointConfig/alpha/chat", "metadata", "present", "absent")
    keyed, bare = Finding(args[0], TWIN, *args[1:]), Finding(args[0], "ml-prod-use1", *args[1:])
    history.drift.sync(TWIN, [keyed.as_dict()], GATED)
    history.drift.sync("ml-prod-use1", [bare.as_dict()], GATED)
    migrate.upgrade(engine)
    assert _rows(history, "SELECT cluster, fingerprint, coalesce(resolution, 'open') FROM drift_findings "
                          "ORDER BY id") == [(TWIN, keyed.fingerprint, "open"), (TWIN, keyed.fingerprint, "merged")]
    engine.dispose()


def test_the_downgrade_refuses_a_key_and_a_bare_name_of_one_name(fresh_db_url: str) -> None:
    engine = create_engine(fresh_db_url)
    migrate.upgrade(engine)
    history = HistoryRepos.on(engine)
    history.runs.start("t/r", dag_id="t", run_id="r", trigger="test", triggered_by=None, params={})
    for step, cluster in (("a", RETAIL), ("b", "ml-prod")):
        history.curvine.record_capacity(run_key="t/r", step="curvine", cluster=cluster, phase=step,
                                        overview={"capacity": 1})
    with pytest.raises(Exception, match="share a name \\(ml-prod\\)"):
        migrate.downgrade(engine, "0010_pinned_inventory")
    engine.dispose()


# ---- one run over both ml-prod clusters --------------------------------------------------------------------------


def _as_task(dag_id: str, run_id: str, task_id: str) -> Any:
    from types import SimpleNamespace

    from airflow.sdk.execution_time.context import set_current_context

    dag_run = SimpleNamespace(dag_id=dag_id, run_id=run_id, run_type="scheduled", triggering_user_name=None)
    return set_current_context({"dag_run": dag_run, "ti": SimpleNamespace(task_id=task_id, map_index=-1)})  # type: ignore[typeddict-item]


def test_a_run_without_a_scope_takes_both_ml_prod_clusters(history: HistoryRepos, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduled drift check and a fleet-wide rollout of the multi-account fleet map over every key, both
    ml-prod clusters included, and each cluster's task reads its own endpoints from the run's plan and pin."""
    from kvfleet.airflow import drift, rollout
    from kvfleet.airflow.context import scoped

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text((FLEETS / "multi-account.yaml").read_text())
    monkeypatch.setenv("KVFLEET_FLEET_PATHS", str(tmp_path))
    every = [RETAIL, PAYMENTS, "333333333333/us-west-2/ml-eval"]
    with _as_task("kvfleet_drift_check", "scheduled__both", "open_run"):
        assert sorted(drift.open_run({"fleet": str(fleet), "clusters": []})) == sorted(every)
    with _as_task("kvfleet_rollout", "manual__both", "plan_rollout"):
        assert sorted(rollout.plan_rollout({"fleet": str(fleet)})) == sorted(every)
    run = "kvfleet_rollout/manual__both"
    for key, names in ((RETAIL, ["catalog-rag", "storefront-chat"]), (PAYMENTS, ["chargebacks", "disputes-rag"])):
        plan = history.runs.cluster_plan(run, key)
        assert plan is not None and [c["key"] for c in plan["clusters"]] == [key]
        refs = sorted(e["ref"] for w in plan["clusters"][0]["waves"] for e in w["endpoints"])
        namespace = "retail" if key == RETAIL else "payments"
        assert refs == [f"{key}:{namespace}/{n}" for n in names]
        assert sorted(e.name for e in scoped(run).endpoints_of(key)) == names
