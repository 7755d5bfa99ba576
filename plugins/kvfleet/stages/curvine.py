"""Stage 3: Curvine (the shared NVMe L2), with format-flag safety, as an idempotent reconciler.

- Prerequisites: the EBS StorageClass the inventory names (the master's metadata and journal volumes) must
  exist; the VPC CNI and EBS CSI driver are reported when they cannot be observed.
- First install: curvine-csi, the Curvine StorageClass, then the Curvine chart with the three format flags
  **true** (the very first start must format) — and, as soon as every Curvine pod is Running, **immediately**
  ``helm upgrade --reuse-values`` with all three false (docs/reference/curvine.md#format-flags). The flip runs in a
  ``finally``: an error inside the window still attempts it, and the task fails loudly if it did not happen.
- Existing release: never installs again and never passes a flag true. A deployed release with a flag true is a
  hazard: it is flipped to false with --reuse-values, recorded, and warned about. Differences in chart version,
  worker count or dataDirs are *reported* and left to kvfleet_curvine_upgrade / kvfleet_curvine_scale_out.
- The RWX PVC in every endpoint namespace, waited to Bound; then the master API must report the inventory's
  live workers and a capacity of about workers × dataDir size, recorded as a capacity snapshot.

Every change is a typed action (``fleet.actions``: ``HelmInstall``, ``HelmUpgrade`` with the values file's
digest, ``CreateStorageClass``, ``CreatePvc``) that ``stages.executor`` applies (helm
commands with their write-ahead records) or, in a dry run, renders: `kvfleet plan --diff` lists the very calls.
The sequencing (the flip in a ``finally``) and the gates stay here.

The end of the module holds what the upgrade and scale-out workflows share with this stage: the format-flag
hazard gate, the busy-cluster gate (lease and running rollout), the values diff and capacity snapshots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvfleet.clients.curvine import CurvineMaster
from kvfleet.clients.helm import set_args
from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import actions as A
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_gates as gates
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.endpoint_spec import pvc_manifest
from kvfleet.fleet.inventory.vocabulary import size_to_bytes
from kvfleet.stages import executor, readiness
from kvfleet.stages.base import Outcome, Pending, StageContext
from kvfleet.stages.converge import converge

STAGE = "curvine"


def repo_url(ctx: StageContext) -> str:
    """The chart repository: the inventory's, unless ``KVFLEET_HELM_REPO_CURVINE`` names a mirror (checked by the
    same rule as the inventory's: ``kvfleet.fleet.shared_rules``)."""
    return ctx.settings.helm_repo_curvine or ctx.cluster.curvine.repo_url


def storage_class_manifest(ctx: StageContext) -> dict[str, Any]:
    spec = ctx.cluster.curvine
    master = f"{C.CURVINE_MASTER_STS}-0.{C.CURVINE_MASTER_STS}.{spec.namespace}.svc.cluster.local:8995"
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": spec.storage_class, "labels": {C.MANAGED_BY_LABEL: C.MANAGED_BY_VALUE}},
        "provisioner": "curvine",
        "parameters": {"master-addrs": master, "fs-path": spec.fs_path, "path-type": "DirectoryOrCreate"},
        "reclaimPolicy": "Retain", "volumeBindingMode": "Immediate",
    }


def check_prerequisites(ctx: StageContext) -> list[str]:
    """Fail on what blocks the install; return warnings for what could only be partly observed."""
    name = ctx.cluster.ebs_storage_class
    if get_or_none(ctx.kube.storage.read_storage_class, name) is None:
        raise PermanentError(
            f"stage 3 prerequisite: StorageClass {name!r} not found on {ctx.cluster.name}. Curvine's master keeps "
            f"metadata and journal on EBS: install the EBS CSI driver and create StorageClass {name} "
            "(provisioner ebs.csi.aws.com), or set clusters.<name>.ebs_storage_class to an existing class.")
    warnings = []
    if get_or_none(ctx.kube.apps.read_namespaced_daemon_set, "aws-node", "kube-system") is None:
        warnings.append("VPC CNI DaemonSet kube-system/aws-node not found: upgrade/install the VPC CNI plugin")
    if get_or_none(ctx.kube.apps.read_namespaced_deployment, "ebs-csi-controller", "kube-system") is None:
        warnings.append("EBS CSI controller not found in kube-system: install the EBS CSI driver and grant its "
                        "role attach permissions")
    for w in warnings:
        ctx.say(f"warning: {w}")
    return warnings


def _curvine_pods(ctx: StageContext) -> list[Any]:
    ns = ctx.cluster.curvine.namespace
    pods = call(ctx.kube.core.list_namespaced_pod, ns, what="list curvine pods").items
    return [p for p in pods if p.metadata.name.startswith((C.CURVINE_MASTER_STS, C.CURVINE_WORKER_STS))]


def wait_curvine_running(ctx: StageContext, timeout_s: float | None = None) -> str:
    spec = ctx.cluster.curvine
    want = spec.master.replicas + ctx.cluster.curvine_workers

    def check() -> tuple[bool, str]:
        pods = _curvine_pods(ctx)
        running = [p for p in pods if getattr(p.status, "phase", None) == "Running"]
        return len(running) >= want and len(running) == len(pods), f"{len(running)}/{want} Curvine pods Running"

    return wait_for(check, timeout_s=timeout_s or ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 1.0),
                    what=f"[{ctx.cluster.name}] curvine pods", progress=ctx.progress)


def rollout_state(ctx: StageContext) -> tuple[bool, str]:
    """Whether both StatefulSets are fully rolled out on their newest revision, and what was observed."""
    return readiness.curvine_rollout(ctx.kube, namespace=ctx.cluster.curvine.namespace)


def wait_rolled_out(ctx: StageContext, timeout_s: float | None = None,
                    each_poll: Callable[[], None] | None = None) -> str:
    """Both StatefulSets fully rolled out on their newest revision (after an install, flip or upgrade: a
    values change rolls the pods, and L2 is unavailable while the master restarts). ``each_poll`` runs before
    every observation (the rollback uses it to replace pods stuck on a broken revision)."""

    def check() -> tuple[bool, str]:
        if each_poll is not None:
            each_poll()
        return rollout_state(ctx)

    return wait_for(check, timeout_s=timeout_s or ctx.timeouts.pods_s, poll_s=min(ctx.poll_s, 1.0),
                    what=f"[{ctx.cluster.name}] curvine rollout", progress=ctx.progress)


def _record_revisions(ctx: StageContext, release: str) -> list[dict[str, Any]]:
    """Every revision in ``helm history`` with its format flags, recorded in the history store. A revision is
    immutable once written, so its values are read (``helm get values --revision``) only the first time it is
    seen; afterwards only its status is refreshed. Without a history store every revision is read."""
    ns, cluster = ctx.cluster.curvine.namespace, ctx.cluster.key  # the history's name for the cluster
    known = ctx.history.curvine.revisions(cluster, ns, release) if ctx.history is not None else {}
    out = []
    for rev in ctx.helm.revisions(release, ns) or []:
        n, status, updated = rev.revision, rev.status, rev.updated
        seen = known.get(n)
        if seen is not None and updated and seen["helm_updated"] == str(updated):  # only known with a history
            if seen["status"] != status and ctx.history is not None:
                ctx.history.curvine.set_status(cluster=cluster, namespace=ns, release=release, revision=n,
                                                       status=status)
            out.append({"revision": n, "status": status, "flags": seen["flags"]})
            continue
        values = ctx.helm.values(release, ns, revision=n)
        flags = cv.flags_of(values)
        out.append({"revision": n, "status": status, "flags": flags})
        if ctx.history is not None:
            ctx.history.curvine.record(
                cluster=cluster, namespace=ns, release=release, revision=n,
                chart_version=_chart_version(ctx, rev.chart), status=status, flags=flags, values=values,
                run_key=ctx.step_key.run_key if ctx.step_key else None,
                helm_updated=str(updated) if updated else None)
    return out


def _ensure_csi(ctx: StageContext) -> str:
    spec = ctx.cluster.curvine
    if ctx.helm.status(C.CURVINE_CSI_RELEASE, spec.namespace) is not None:
        return "unchanged"
    install = A.helm_install(C.CURVINE_CSI_RELEASE, spec.csi_chart, spec.namespace, repo=repo_url(ctx),
                             version=spec.version, values={
                                 "controller.sidecars.provisioner.image":
                                     "registry.k8s.io/sig-storage/csi-provisioner:v3.6.0",
                                 "node.sidecars.nodeDriverRegistrar.image":
                                     "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.10.0",
                                 **cv.NO_CHART_RBAC})
    executor.run(ctx, STAGE, [install])
    return "planned" if ctx.dry_run else "changed"


def _ensure_storage_class(ctx: StageContext) -> str:
    desired = storage_class_manifest(ctx)
    live = get_or_none(ctx.kube.storage.read_storage_class, desired["metadata"]["name"])
    if live is not None:
        if (live.provisioner, dict(live.parameters or {})) != (desired["provisioner"], desired["parameters"]):
            ctx.say(f"warning: StorageClass {desired['metadata']['name']} differs from the inventory "
                    "(StorageClass parameters are immutable; recreate it deliberately if needed)")
            return "reported"
        return "unchanged"
    executor.run(ctx, STAGE, [A.CreateStorageClass(desired["metadata"]["name"], A.canonical(desired))])
    return "planned" if ctx.dry_run else "changed"


def first_install(ctx: StageContext) -> dict[str, Any]:
    """Install with the flags true, then flip them false as soon as every pod runs — flip guaranteed."""
    spec = ctx.cluster.curvine
    install = A.helm_install(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=repo_url(ctx),
                             version=spec.version, values=cv.install_values(ctx.cluster), why="format flags true")
    flip = A.helm_upgrade(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=repo_url(ctx), version=spec.version,
                          values=cv.safe_flags(), why="format flags false",
                          when="immediately, once every Curvine pod is Running")
    if ctx.dry_run:
        executor.run(ctx, STAGE, [install, flip])
        return {"install": "planned"}
    ctx.say("stage 3: installing Curvine with the format flags TRUE (first start only)")
    window_error: BaseException | None = None
    try:
        executor.run(ctx, STAGE, [install])
        wait_curvine_running(ctx)
    except BaseException as exc:  # the flip below must still be attempted
        window_error = exc
        ctx.say(f"warning: stage 3 install window failed ({str(exc)[:500]}); flipping the flags anyway")
    finally:
        ctx.say("stage 3: flipping the format flags to false (--reuse-values)")
        executor.run(ctx, STAGE, [flip])
    if window_error is not None:
        raise window_error
    return {"install": "changed"}


def verify_flags_false(ctx: StageContext) -> dict[str, bool | None]:
    """The release's values AND the objects it deployed (``helm get manifest``: the ConfigMap's TOML, the pods'
    env and args) have every format flag false."""
    ns = ctx.cluster.curvine.namespace
    values = ctx.helm.values(C.CURVINE_RELEASE, ns)
    flags = cv.flags_of(values)
    deployed = cv.rendered_format_findings(ctx.helm.revision_manifest(C.CURVINE_RELEASE, ns))
    if any(flags.values()) or deployed:
        raise PermanentError(f"Curvine release on {ctx.cluster.name} still has format flags set after the flip: "
                             f"{flags}{'; deployed: ' + '; '.join(deployed) if deployed else ''}. A pod restart "
                             f"would wipe L2 metadata; fix with `helm upgrade curvine -n {ns} --reuse-values "
                             f"{' '.join(set_args(cv.safe_flags()))}`")
    return flags


def refuse_rendered_flags(ctx: StageContext, docs: list[dict[str, Any]], action: str, what: str) -> dict[str, Any]:
    """The format-flag gate on what helm would deploy (the judge: ``fleet.curvine_gates.refuse_rendered_flags``)."""
    return gates.refuse_rendered_flags(ctx.cluster.name, docs, action, what)


def _fix_hazard(ctx: StageContext, set_flags: list[str]) -> str:
    spec = ctx.cluster.curvine
    fix = A.helm_upgrade(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=repo_url(ctx),
                         version=_live_version(ctx) or spec.version, values={**cv.safe_flags(), **cv.NO_CHART_RBAC},
                         why=f"fix format-flag hazard ({', '.join(set_flags)})")
    ctx.say(f"warning: HAZARD: deployed Curvine release has {', '.join(set_flags)} true — the next pod restart "
            "would reformat. Flipping to false with --reuse-values.")
    executor.run(ctx, STAGE, [fix])
    return "planned" if ctx.dry_run else "changed"


def _live_version(ctx: StageContext) -> str | None:
    deployed = deployed_revision(ctx)
    return deployed.chart_version if deployed else None


@dataclass(frozen=True)
class DeployedRelease:
    """The Curvine release's current revision (the newest deployed one, else the newest of any status)."""

    revision: int
    chart_version: str | None
    status: str


def deployed_revision(ctx: StageContext) -> DeployedRelease | None:
    """The deployed revision of the Curvine release from ``helm history`` (cheaper than ``helm status``, and in
    helm 4 the only JSON that names the chart); None: no release."""
    rows = ctx.helm.revisions(C.CURVINE_RELEASE, ctx.cluster.curvine.namespace)
    if not rows:  # None: helm says release: not found
        return None
    row = max([r for r in rows if r.status == "deployed"] or rows, key=lambda r: r.revision)
    return DeployedRelease(row.revision, _chart_version(ctx, row.chart), row.status)


def _chart_version(ctx: StageContext, chart: Any) -> str | None:
    """``curvine-0.3.2-alpha`` -> ``0.3.2-alpha`` (a version may contain dashes; the chart name is known)."""
    if not chart:
        return None
    text, prefix = str(chart), f"{ctx.cluster.curvine.chart}-"
    return text[len(prefix):] if text.startswith(prefix) else text.rsplit("-", 1)[-1]


def release_drift(ctx: StageContext, values: dict[str, Any]) -> list[str]:
    spec = ctx.cluster.curvine
    diffs = []
    live_version = _live_version(ctx)
    if live_version and live_version != spec.version:
        diffs.append(f"chart version {live_version} (inventory {spec.version}): use kvfleet_curvine_upgrade")
    workers = cv.get_path(values, "worker.replicas")
    if workers is not None and int(workers) != ctx.cluster.curvine_workers:
        diffs.append(f"worker.replicas {workers} (inventory {ctx.cluster.curvine_workers}): use "
                     "kvfleet_curvine_scale_out")
    size = cv.get_path(values, "worker.storage.dataDirs[0].size")
    if size is not None and size != spec.worker.size:
        diffs.append(f"dataDirs[0].size {size} (inventory {spec.worker.size})")
    path = cv.get_path(values, "worker.storage.dataDirs[0].hostPath")
    if path is not None and path != spec.worker.host_path:
        diffs.append(f"dataDirs[0].hostPath {path} (inventory {spec.worker.host_path})")
    return diffs


def pvc_actions(ctx: StageContext) -> list[A.Action]:
    """What the RWX Curvine PVC in every endpoint namespace of this cluster needs. The namespace comes with the
    kvfleet-bootstrap bundle: a missing one is refused (kvfleet may not create namespaces)."""
    from kvfleet.fleet.bootstrap_bundle import missing_namespace

    spec = ctx.cluster.curvine
    out: list[A.Action] = []
    for ns in sorted({e.namespace for e in ctx.inventory.endpoints_of(ctx.cluster.key) if e.l2}):
        if get_or_none(ctx.kube.core.read_namespace, ns) is None:
            raise PermanentError(missing_namespace(ctx.inventory.source, ctx.cluster.name, ns))
        if get_or_none(ctx.kube.core.read_namespaced_persistent_volume_claim, C.CURVINE_PVC, ns) is None:
            out.append(A.CreatePvc(ns, C.CURVINE_PVC, A.canonical(pvc_manifest(ns, spec.storage_class))))
    return out


def create_pvcs(ctx: StageContext) -> dict[str, str]:
    """The RWX Curvine PVC in every endpoint namespace of this cluster, created where missing (not waited for):
    each namespace's result."""
    actions = pvc_actions(ctx)
    executor.run(ctx, STAGE, actions)
    created = {a.namespace for a in actions if isinstance(a, A.CreatePvc)}
    namespaces = sorted({e.namespace for e in ctx.inventory.endpoints_of(ctx.cluster.key) if e.l2})
    return {ns: ("planned" if ctx.dry_run else "changed") if ns in created else "unchanged" for ns in namespaces}


def ensure_pvcs(ctx: StageContext) -> dict[str, str]:
    """The RWX Curvine PVC in every endpoint namespace of this cluster, waited to Bound (not in a dry run)."""
    out = create_pvcs(ctx)
    if not ctx.dry_run:
        for ns in out:
            _wait_bound(ctx, ns)
    return out


def _wait_bound(ctx: StageContext, ns: str) -> None:
    """One namespace's PVC to Bound, in this process (``readiness.curvine_pvcs`` says why it stays Pending)."""
    wait_for(lambda: readiness.curvine_pvcs(ctx.kube, namespaces=[ns]), timeout_s=ctx.timeouts.pvc_s,
             poll_s=min(ctx.poll_s, 1.0), what=f"[{ctx.cluster.name}] PVC {ns}/{C.CURVINE_PVC}",
             progress=ctx.progress)


def verify_capacity(ctx: StageContext, phase: str = "verify", workers: int | None = None,
                    step: str = "curvine", timeout_s: float | None = None) -> dict[str, Any]:
    """The master reports ``workers`` live workers (default: the inventory's) and ~workers × dataDir size.

    The rollout passes the release's own ``worker.replicas``: after kvfleet_curvine_scale_out grew the pool,
    the inventory's count is a reported difference, not a failure."""
    spec = ctx.cluster.curvine
    args = _capacity_args(ctx, workers)
    state = wait_for(lambda: readiness.curvine_capacity(ctx.kube, **args),
                     timeout_s=ctx.timeouts.pods_s if timeout_s is None else timeout_s,
                     poll_s=min(ctx.poll_s, 1.0), what=f"[{ctx.cluster.name}] Curvine master API",
                     progress=ctx.progress)
    snap = CurvineMaster(ctx.kube, spec.namespace).overview().snapshot()
    if ctx.history is not None:
        ctx.history.curvine.record_capacity(run_key=ctx.step_key.run_key if ctx.step_key else None, step=step,
                                    cluster=ctx.cluster.key, phase=phase, overview=snap)
    return {"state": state, **snap}


def _capacity_args(ctx: StageContext, workers: int | None) -> dict[str, Any]:
    """``readiness.curvine_capacity``'s arguments: ``workers`` live workers (default: the inventory's)."""
    spec = ctx.cluster.curvine
    return {"namespace": spec.namespace, "workers": ctx.cluster.curvine_workers if workers is None else workers,
            "worker_bytes": size_to_bytes(spec.worker.size)}


def reconcile(ctx: StageContext) -> Outcome:
    """Stage 3 to its end in this process (``act``, waiting in the worker, ``finish``)."""
    return converge(ctx, act, finish)


def act(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """Stage 3's changes, then one look at each read-only wait, in order, handing back the first not yet met
    (``base.Pending``, a ``stages.readiness`` check): the StatefulSets rolled out, the PVCs Bound, the master's
    capacity. The caller waits (in the worker, or deferred) and calls ``act`` again with the same ``progress``.

    The release changes run in this process on the first call and never again: the prerequisites, curvine-csi,
    the StorageClass, the first install with its flip to false — that window stays here, its flip in a
    ``finally``, never across a deferral — or the fix of a flag hazard; then every flag verified false. The later
    steps run once each, on whichever call reaches them (``progress`` keeps what is done): the revisions recorded
    once the StatefulSets are rolled out, then the missing PVCs created."""
    if "detail" not in progress:
        progress["detail"], progress["changed"] = _release(ctx)
        if ctx.dry_run:
            progress["detail"]["pvcs"] = ensure_pvcs(ctx)
        else:
            progress["detail"]["flags"] = verify_flags_false(ctx)
    if ctx.dry_run:
        return None
    return _rolled_out(ctx, progress) or _bound(ctx, progress) or _capacity(ctx, progress)


def _rolled_out(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """Both StatefulSets rolled out (then the release's revisions recorded), or the wait for it."""
    detail = progress["detail"]
    if "rollout" not in detail:
        ready, state = rollout_state(ctx)
        if not ready:
            return Pending("after:curvine", f"stage 3: {state}", ctx.timeouts.pods_s, check="curvine_rollout",
                           args={"namespace": ctx.cluster.curvine.namespace})
        detail["rollout"] = state
        detail["revisions"] = _record_revisions(ctx, C.CURVINE_RELEASE)
    return None


def _bound(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """The PVCs created where missing and Bound, or the wait for them."""
    detail = progress["detail"]
    if "pvcs" not in detail:
        detail["pvcs"] = create_pvcs(ctx)
        progress["changed"] = progress["changed"] or "changed" in detail["pvcs"].values()
    if not progress.get("bound"):
        pvcs = {"namespaces": sorted(detail["pvcs"])}
        ready, state = readiness.curvine_pvcs(ctx.kube, **pvcs)
        if not ready:
            return Pending("after:pvcs", f"stage 3: {state}", ctx.timeouts.pvc_s, check="curvine_pvcs", args=pvcs)
        progress["bound"] = True
    return None


def _capacity(ctx: StageContext, progress: dict[str, Any]) -> Pending | None:
    """The master reporting the release's workers and their capacity, or the wait for it."""
    if "workers" not in progress:  # the release's own count (kvfleet_curvine_scale_out may have grown it)
        live = cv.get_path(ctx.helm.values(C.CURVINE_RELEASE, ctx.cluster.curvine.namespace), "worker.replicas")
        progress["workers"] = int(live) if live is not None else ctx.cluster.curvine_workers
    capacity = _capacity_args(ctx, progress["workers"])
    ready, state = readiness.curvine_capacity(ctx.kube, **capacity)
    if not ready:
        return Pending("after:curvine_capacity", f"stage 3: Curvine master API: {state}", ctx.timeouts.pods_s,
                       check="curvine_capacity", args=capacity)
    return None


def finish(ctx: StageContext, progress: dict[str, Any]) -> Outcome:
    """Every wait met: the capacity snapshot recorded, and the stage's outcome."""
    detail = dict(progress["detail"])
    if ctx.dry_run:
        planned = [p for p in ctx.planned if p.stage == STAGE]
        return ctx.record("curvine", STAGE, "planned" if planned else "unchanged", **detail)
    # One look (``act`` has just seen it met): a change since is a ConvergenceTimeout, and the retry observes again.
    detail["capacity"] = verify_capacity(ctx, workers=progress["workers"], timeout_s=0)
    return ctx.record("curvine", STAGE, "changed" if progress["changed"] else "unchanged", **detail)


def _release(ctx: StageContext) -> tuple[dict[str, Any], bool]:
    """The prerequisites, curvine-csi, the StorageClass, and the release: the first install (flags true, then
    false as soon as every pod runs) or, on an existing release, a flag hazard fixed and any other difference
    reported. What was done, and whether anything changed."""
    spec = ctx.cluster.curvine
    warnings = check_prerequisites(ctx)
    csi = _ensure_csi(ctx)
    sc = _ensure_storage_class(ctx)
    detail: dict[str, Any] = {"csi": csi, "storage_class": sc, "warnings": warnings}
    status = ctx.helm.status(C.CURVINE_RELEASE, spec.namespace)
    changed = "changed" in (csi, sc)
    if status is None:
        detail.update(first_install(ctx))
        changed = changed or not ctx.dry_run
    else:
        values = ctx.helm.values(C.CURVINE_RELEASE, spec.namespace)
        hazard = cv.flags_set(values)
        if hazard:
            detail["hazard_fixed"] = {"flags": hazard, "result": _fix_hazard(ctx, hazard)}
            changed = changed or not ctx.dry_run
        drift = release_drift(ctx, values)
        if drift:
            detail["reported"] = drift
            for d in drift:
                ctx.say(f"reported, not changed by the rollout: {d}")
    return detail, changed


# ---- shared by the upgrade and scale-out workflows (kvfleet.stages.curvine_upgrade / curvine_scale) ----------

ROLLOUT_PURPOSE = "rollout"  # the lease purpose kvfleet_rollout uses for its per-cluster work


def require_release(ctx: StageContext) -> DeployedRelease:
    """The deployed Curvine revision (``deployed_revision``); a clear refusal when there is no release."""
    deployed = deployed_revision(ctx)
    if deployed is None:
        raise PermanentError(f"no Curvine release {C.CURVINE_RELEASE!r} in namespace {ctx.cluster.curvine.namespace} "
                             f"on {ctx.cluster.name}: install it first (kvfleet_rollout, stage 3)")
    return deployed


def refuse_flag_hazard(ctx: StageContext, values: dict[str, Any], revision: int, action: str) -> None:
    """The deployed release must have every format flag false before kvfleet touches it again (the judge:
    ``fleet.curvine_gates.refuse_flag_hazard``)."""
    gates.refuse_flag_hazard(ctx.cluster.name, ctx.cluster.curvine.namespace, values, revision, action)


def refuse_busy_cluster(ctx: StageContext, holder: str, action: str) -> None:
    """The cluster lease is free (or ours) and no rollout is working on the cluster.

    A rollout shows itself two ways: its lease (purpose ``rollout``), and — while stage 4 patches endpoints —
    the Inference Operator paused with its run key in the ``kvfleet.io/paused-by`` annotation."""
    name = ctx.cluster.name
    lock = ctx.history.leases.get(ctx.cluster.key) if ctx.history is not None else None
    if lock and not lock.get("expired") and lock.get("holder") != holder:
        since = f"since {lock.get('acquired_at')}, last heartbeat {lock.get('heartbeat_at')}"
        if lock.get("purpose") == ROLLOUT_PURPOSE:
            raise GateRefused(f"{action} refused on {name}: a rollout is running on the cluster "
                              f"({lock.get('holder')}, {since}). Wait for it to finish, then retry.")
        raise GateRefused(f"{action} refused on {name}: the cluster lock is held by {lock.get('holder')} "
                          f"({lock.get('purpose')}, {since}). Wait for that run to finish, or stop it (its lease "
                          "expires when it stops heartbeating), then retry.")
    dep = get_or_none(ctx.kube.apps.read_namespaced_deployment, C.OPERATOR_DEPLOYMENT, C.OPERATOR_NAMESPACE)
    annotations = (dep.metadata.annotations or {}) if dep is not None else {}
    paused_by = annotations.get(C.PAUSED_BY_ANNOTATION)
    if paused_by and paused_by != holder:
        at = annotations.get(C.PAUSED_AT_ANNOTATION)
        raise GateRefused(f"{action} refused on {name}: a rollout is running on the cluster — the inference "
                          f"operator was paused by {paused_by} at {at} while it patches endpoints. Wait for it to "
                          "restore the operator (or restore it with the rollout's teardown), then retry.")


def capacity_snapshot(ctx: StageContext, step: str, phase: str) -> dict[str, Any]:
    """The master API's view (inodes, files, capacity, fs_used, live workers by name), recorded."""
    master = CurvineMaster(ctx.kube, ctx.cluster.curvine.namespace)
    snap = master.overview().snapshot()
    workers = master.workers()
    snap["live_worker_names"] = sorted(_worker_name(w) for w in workers["live_workers"])
    snap["worker_fs_used"] = {_worker_name(w): int(w.get("fs_used") or 0) for w in workers["live_workers"]}
    if ctx.history is not None:
        ctx.history.curvine.record_capacity(run_key=ctx.step_key.run_key if ctx.step_key else None, step=step,
                                    cluster=ctx.cluster.key, phase=phase, overview=snap)
    ctx.say(f"{step} {phase}: {snap['files_total']} files, {snap['dir_total']} dirs, capacity "
            f"{snap['capacity'] / 2**30:.0f} GiB, fs_used {snap['fs_used'] / 2**30:.2f} GiB, live workers "
            f"{snap['live_workers']} ({', '.join(snap['live_worker_names'])})")
    return snap


def _worker_name(info: dict[str, Any]) -> str:
    host = str((info.get("address") or {}).get("hostname") or "")
    return host.split(".", 1)[0] or f"worker-{info.get('worker_id')}"
