"""Helpers for stage tests: mutating-call counters and inventory tweaks."""

from __future__ import annotations

from typing import Any

from kvfleet.fleet.inventory import Inventory

MUTATING_K8S = {"create", "update", "patch", "delete", "deletecollection"}
MUTATING_AWS = {"UpdateCluster", "CreateAddon", "UpdateAddon", "DeleteAddon", "CreateCluster"}


def mutating_calls(sandbox, cluster: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    store = sandbox.twin(cluster).store
    k8s = [r for r in store.request_log if r.verb in MUTATING_K8S and not r.dry_run]
    aws = [op for op in sandbox.aws.operations() if op in MUTATING_AWS]
    return {"k8s": [(r.verb, r.resource, r.namespace, r.name) for r in k8s], "aws": aws}


def reset_counters(sandbox) -> None:  # type: ignore[no-untyped-def]
    for twin in sandbox.twins.values():
        twin.store.reset_request_log()
    sandbox.aws.reset_request_log()


def with_cluster(inv: Inventory, name: str, memory_percent: int | None = None, **changes: Any) -> Inventory:
    """``inv`` with cluster ``name`` changed (model_copy: not validated, so a refused value reaches the stage);
    ``memory_percent`` goes to its ``tiered_storage``."""
    if memory_percent is not None:
        changes["tiered_storage"] = inv.cluster(name).tiered_storage.model_copy(
            update={"memory_percent": memory_percent})
    clusters = [c.model_copy(update=changes) if c.name == name else c for c in inv.clusters]
    return inv.model_copy(update={"clusters": clusters})


def converge_cluster(make_ctx, cluster: str, **kw: Any):  # type: ignore[no-untyped-def]
    """Stages 1–3 on one cluster; returns the context used."""
    from kvfleet.stages import addons, curvine, tiered_storage

    ctx = make_ctx(cluster, **kw)
    for stage in (tiered_storage, addons, curvine):
        stage.reconcile(ctx)
    return ctx


def endpoint(inv: Inventory, cluster: str, name: str):  # type: ignore[no-untyped-def]
    return next(e for e in inv.endpoints if e.cluster == cluster and e.name == name)


def tamper_deployment_env(twin, ep, *, set_env: dict[str, str] | None = None,  # type: ignore[no-untyped-def]
                          remove: tuple[str, ...] = ()) -> None:
    """Break an endpoint the way a hand edit would: pause the operator (so it does not re-render), change the
    vLLM container's env, and delete the pods so they are recreated from the changed template."""
    from kvfleet.fleet import constants as C

    def scale0(d):  # type: ignore[no-untyped-def]
        d["spec"]["replicas"] = 0
        return d

    twin.store.mutate("apps", "deployments", C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE, scale0)
    import time

    deadline = time.monotonic() + 20
    while (twin.store.get("apps", "deployments", C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE)
           .get("status", {}).get("readyReplicas")):
        assert time.monotonic() < deadline, "operator did not stop"
        time.sleep(0.05)

    def edit(d):  # type: ignore[no-untyped-def]
        c = next(c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == ep.name)
        env = [e for e in c.get("env", []) if e["name"] not in remove and e["name"] not in (set_env or {})]
        env += [{"name": k, "value": v} for k, v in (set_env or {}).items()]
        c["env"] = env
        return d

    twin.store.mutate("apps", "deployments", ep.name, ep.namespace, edit)
    for pod in twin.store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}"):
        twin.store.delete("", "pods", pod["metadata"]["name"], ep.namespace)


def wait_pods_ready(twin, ep, n: int, timeout: float = 30.0, *, env: dict[str, str] | None = None,  # type: ignore[no-untyped-def]
                    absent: tuple[str, ...] = ()) -> None:
    """Until exactly n pods are Ready and every one carries ``env`` and lacks ``absent`` (no old pods left)."""
    import time

    def ok(p):  # type: ignore[no-untyped-def]
        c = next(c for c in p["spec"]["containers"] if c["name"] == ep.name)
        have = {e["name"]: e.get("value") for e in c.get("env", [])}
        ready = any(x.get("type") == "Ready" and x.get("status") == "True"
                    for x in (p.get("status") or {}).get("conditions", []))
        return ready and all(have.get(k) == v for k, v in (env or {}).items()) and not any(a in have for a in absent)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = twin.store.list("", "pods", ep.namespace, label_selector=f"app={ep.name}")
        if len(pods) == n and all(ok(p) for p in pods):
            return
        time.sleep(0.1)
    raise AssertionError(f"{ep.key}: pods not ready in {timeout}s")


def without_overlay(fleet_env, ctx, eps, cluster: str) -> None:  # type: ignore[no-untyped-def]
    """Every endpoint deployed, then re-rendered by the operator, which drops kvfleet's patch (as after an
    operator upgrade): each Deployment needs the overlay again."""
    from kvfleet.fleet import constants as C
    from kvfleet.stages import endpoints

    for ep in eps:
        endpoints.apply_iec(ctx, ep)
    endpoints.wait_complete(ctx, eps)
    twin = fleet_env.twin(cluster)
    for ep in eps:
        twin.services["operator"].rerender_now(ep.namespace, ep.name)
    for ep in eps:
        wait_pods_ready(twin, ep, ep.replicas, timeout=60, env={C.ENV_REMOTE_URL: C.OPERATOR_L2_URL})
