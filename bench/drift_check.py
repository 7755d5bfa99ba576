"""Benchmark: a drift check over 1,000 endpoints across 10 sandbox clusters.

Starts a sandbox of 10 clusters (16 GPU nodes each), converges stages 1–3 on every cluster (tiered storage,
the five add-ons, Curvine with its PVCs), then seeds 100 endpoints per cluster straight into each twin's store:
the InferenceEndpointConfig (the simulated operator renders its Deployment) and two pods per endpoint. The
check itself goes through the real APIs (boto3 to the AWS emulator, the official Kubernetes client and the helm
CLI to the Kubernetes emulators), clusters in parallel as the DAG maps them. Reports:

- the wall time of the check logic for the whole fleet (no Airflow start-up; client set-up included and also
  shown apart), and per cluster (observe, classify);
- the API calls per cluster, from the emulators' request counters;
- a comparison with the anchors: Kyverno's background scan (hourly) and Argo CD's default reconcile (~3 min).

    python bench/drift_check.py [--clusters 10] [--endpoints-per-cluster 100]

Exit 0 when every cluster was checked and saw all its endpoints.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KYVERNO_BACKGROUND_S = 3600.0  # Kyverno background scan: hourly by default
ARGOCD_RECONCILE_S = 180.0  # Argo CD: timeout.reconciliation 180 s by default
SCHEDULE_S = 600.0  # kvfleet_drift_check runs every 10 minutes
LOBS = ("retail", "payments", "support")


def bench_inventory(clusters: int, per_cluster: int) -> Any:
    from kvfleet.fleet.inventory import Endpoint, load_inventory

    base = load_inventory(ROOT / "fleet.example.yaml")
    template = base.cluster("ml-prod-use1")
    cls = [template.model_copy(update={
        "name": f"ml-bench-{i:02d}", "region": ("us-east-1", "us-west-2")[i % 2],
        "addons": [a.model_copy(update={"configuration": {
            **(a.configuration or {}), "tlsCertificateS3Bucket": f"tls-bench-{i:02d}"}}) for a in template.addons]})
        for i in range(clusters)]
    eps = tuple(Endpoint(name=f"ep-{j:03d}", namespace=f"team-{j % 5}", lob=LOBS[j % 3], cluster=c.name,
                         model="qwen2-7b-instruct", instance_type=template.gpu_nodes.instance_type, replicas=2)
                for c in cls for j in range(per_cluster))
    lobs = [lob.model_copy(update={"remediate_drift": False}) for lob in base.lobs]  # observe only
    return base.model_copy(update={"lobs": lobs, "clusters": cls, "endpoints": eps})


def _ctx(inv: Any, cluster: str) -> Any:
    from kvfleet.stages.base import StageContext, Timeouts

    return StageContext(inventory=inv, cluster=inv.cluster(cluster), aws_conn_id=None, progress=lambda _m: None,
                        timeouts=Timeouts(cluster_update_s=120, addon_s=120, pods_s=120, pvc_s=60))


def converge(inv: Any, cluster: str) -> None:
    from kvfleet.stages import addons, curvine, tiered_storage

    for attempt in range(3):  # reconcilers are idempotent: a retry is what Airflow would do
        ctx = _ctx(inv, cluster)
        try:
            for stage in (tiered_storage, addons, curvine):
                stage.reconcile(ctx)
            return
        except Exception as exc:
            if attempt == 2:
                raise
            print(f"{cluster}: converge attempt {attempt + 1} failed ({type(exc).__name__}: {exc}); retrying")
        finally:
            ctx.close()


def seed(twin: Any, inv: Any) -> None:
    """IECs into the store (the operator renders their Deployments), then two pods per Deployment."""
    from kvfleet.fleet import constants as C
    from kvfleet.fleet.endpoint_spec import render_iec

    eps = inv.endpoints_of(twin.name)
    for ep in eps:
        iec = render_iec(ep.model_copy(update={"replicas": 0}), inv.settings)  # pods are seeded below
        twin.store.create(C.IEC_GROUP, C.IEC_PLURAL, iec)
    selector = f"{C.MANAGED_BY_LABEL}={C.MANAGED_BY_VALUE}"
    deadline = time.monotonic() + 300
    while len(twin.store.list("apps", "deployments", label_selector=selector)) < len(eps):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{twin.name}: the operator did not render {len(eps)} Deployments")
        time.sleep(0.2)
    nodes = list(twin.gpu_nodes)
    for k, dep in enumerate(twin.store.list("apps", "deployments", label_selector=selector)):
        tpl = dep["spec"]["template"]
        for i in range(2):
            spec = copy.deepcopy(tpl["spec"])
            for c in spec.get("containers") or []:
                c.pop("resources", None)  # seeded pods must not compete with the GPU scheduler
            spec["nodeName"] = nodes[(2 * k + i) % len(nodes)]
            twin.store.create("", "pods", {"apiVersion": "v1", "kind": "Pod", "spec": spec, "metadata": {
                "name": f"{dep['metadata']['name']}-seed-{i}", "namespace": dep["metadata"]["namespace"],
                "labels": dict(tpl["metadata"]["labels"])}})


def client_setup(inv: Any, cluster: str) -> tuple[Any, float]:
    """A context with its AWS, Kubernetes and helm clients built (what a task process does once at start)."""
    t0 = time.perf_counter()
    ctx = _ctx(inv, cluster)
    _ = ctx.hyperpod, ctx.kube, ctx.helm
    return ctx, time.perf_counter() - t0


def check_one(ctx: Any, setup_s: float) -> dict[str, Any]:
    from kvfleet.stages import drift

    t0 = time.perf_counter()
    try:
        result = drift.check(ctx)
    finally:
        ctx.close()
    return {"cluster": ctx.cluster.name, "setup_s": setup_s, "check_s": time.perf_counter() - t0,
            "observe_s": result.observe_s, "findings": result.findings, "reachable": result.reachable}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--endpoints-per-cluster", type=int, default=100)
    args = ap.parse_args(argv)

    from kvfleet_sandbox.runtime import start_sandbox
    from kvfleet_sandbox.twin import SandboxSettings

    os.environ["PATH"] = f"{ROOT / '.tools' / 'bin'}{os.pathsep}{os.environ['PATH']}"
    os.environ.setdefault("KVFLEET_POLL_SECONDS", "0.05")
    inv = bench_inventory(args.clusters, args.endpoints_per_cluster)
    names = [c.name for c in inv.clusters]
    state = Path(tempfile.mkdtemp(prefix="kvfleet-bench-drift-"))
    started = time.perf_counter()
    sandbox = start_sandbox(inv, state, SandboxSettings(time_scale=0.005))
    try:
        os.environ.update(sandbox.exports())
        os.environ.pop("AIRFLOW_CONN_AWS_DEFAULT", None)  # boto3 reads AWS_ENDPOINT_URL natively
        with ThreadPoolExecutor(5) as pool:  # set-up only: fewer helm processes at once
            list(pool.map(lambda c: converge(inv, c), names))
        converged_s = time.perf_counter() - started
        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(lambda c: seed(sandbox.twin(c), inv), names))
        print(f"set-up: {len(names)} clusters converged in {converged_s:.0f}s, "
              f"{len(inv.endpoints)} endpoints seeded in {time.perf_counter() - started - converged_s:.0f}s")

        # The emulated API servers keep serving; the simulated controllers stop, so that the check measures
        # kvfleet rather than 10 clusters' simulation competing for the same interpreter.
        for twin in sandbox.twins.values():
            twin.stop()
            twin.store.reset_request_log()
        sandbox.aws.reset_request_log()
        t_setup = time.perf_counter()
        with ThreadPoolExecutor(len(names)) as pool:
            contexts = list(pool.map(lambda c: client_setup(inv, c), names))
        setup_wall = time.perf_counter() - t_setup
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(names)) as pool:  # clusters in parallel, as the DAG maps them
            results = list(pool.map(lambda cs: check_one(*cs), contexts))
        wall = time.perf_counter() - t0
        print(f"client set-up (boto3, kube, helm) for {len(names)} clusters: {setup_wall:.1f}s (in the DAG, each "
              "mapped task builds its own at start-up, in parallel)")
        k8s = {c: sandbox.twin(c).store.request_counts() for c in names}
        aws = collections.Counter(sandbox.aws.operations())
    finally:
        sandbox.stop()
        shutil.rmtree(state, ignore_errors=True)
    return report(inv, results, wall, k8s, aws)


def report(inv: Any, results: list[dict[str, Any]], wall: float, k8s: dict[str, Any], aws: Any) -> int:
    n = len(results)
    print(f"\ndrift check: {len(inv.endpoints)} endpoints on {n} clusters, clusters in parallel")
    print(f"{'cluster':<14}{'endpoints':>10}{'setup s':>9}{'observe s':>11}{'check s':>9}{'findings':>10}"
          f"{'k8s calls':>11}")
    ok = True
    for r in results:
        eps = len(inv.endpoints_of(r["cluster"]))
        seen = {f.endpoint for f in r["findings"] if f.endpoint}
        ok = ok and r["reachable"] and len(seen) >= eps
        print(f"{r['cluster']:<14}{eps:>10}{r['setup_s']:>9.2f}{r['observe_s']:>11.2f}{r['check_s']:>9.2f}"
              f"{len(r['findings']):>10}{sum(k8s[r['cluster']].values()):>11}")
    calls = k8s[results[0]["cluster"]]
    same = all(k8s[r["cluster"]] == calls for r in results)
    print("\nKubernetes API calls per cluster" + (" (identical on every cluster):" if same else ":"))
    for (verb, resource), count in sorted(calls.items()):
        print(f"  {verb:<5} {resource:<26} {count}")
    print("AWS API calls per cluster: " + ", ".join(f"{op} {c / n:g}" for op, c in sorted(aws.items())))
    print(f"\nfull-fleet check wall time: {wall:.1f}s ({wall / len(inv.endpoints) * 1000:.1f} ms per endpoint)")
    for name, period in (("Kyverno background scan (hourly)", KYVERNO_BACKGROUND_S),
                         ("Argo CD default reconcile (~3 min)", ARGOCD_RECONCILE_S),
                         ("kvfleet_drift_check schedule (10 min)", SCHEDULE_S)):
        print(f"  vs {name:<40} {period:>6.0f}s: the check takes {wall / period:6.2%} of the period")
    print("worst-case drift lifetime: " f"{(SCHEDULE_S + wall) / 60:.1f} min (kvfleet) vs "
          f"{(KYVERNO_BACKGROUND_S) / 60:.0f} min (Kyverno background) vs {ARGOCD_RECONCILE_S / 60:.0f} min (Argo CD)")
    if not ok:
        print("FAILED: a cluster was unreachable or did not see all its endpoints", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
