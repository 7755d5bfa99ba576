"""Curvine chart upgrades that cannot bring a format flag back, with snapshots, post-checks and a safe rollback.

Called by the ``kvfleet_curvine_upgrade`` DAG (``kvfleet.airflow.curvine``), once per cluster. Why it exists:
a Curvine pod that *starts* with ``cluster.formatMaster``/``formatWorker``/``formatJournal`` wipes the L2
metadata or cache (docs/reference/curvine.md#format-flags), and helm makes that easy to do by accident — an upgrade
without ``--reuse-values``, a ``--set cluster.formatMaster=true`` left in a script, or a ``helm rollback`` to the
install revision, whose stored values carry all three flags true.

Order of work (``upgrade``):
1. **Gates**, all before any change, each a ``GateRefused`` with the reason: no override sets a format flag (even
   with approval: reformatting is a deliberate action kvfleet does not offer as a side effect); the cluster is
   not busy (lease free, no rollout running) — then the lease is taken; the deployed release has no flag true;
   the target chart version exists in the chart source; the resulting values (new chart defaults < the release's
   user-supplied values < overrides < the three flags false, exactly what the upgrade command deploys) have every
   flag false.
2. **Snapshot before**: the master API (inodes, files, capacity, fs_used, live workers), a few L2 files to re-read,
   the release revision and values; every revision with its flags goes to the history store.
3. **Upgrade** keeping the release's values (``--reset-then-reuse-values``, see ``upgrade_args``) and the three
   flags false passed explicitly, whatever the values say; wait
   for both StatefulSets with a bounded timeout, progress in the log.
4. **Post-checks**: flags false; metadata preserved (see ``metadata_preserved``); live workers as before; L2 still
   serves (the sampled files are re-read through the master, or stage 5 runs on one endpoint).
5. On failure, when asked, **rollback** to the newest earlier revision whose stored values have every flag false
   (``rollback_to_safe_revision``); none → refused, with why. Never to a revision with a flag true.

A dry run stops after the gates and prints the exact helm command and the values diff. The upgrade and the
rollback are typed actions (``fleet.actions.HelmUpgrade`` with its values files' digests, ``HelmRollback``) that
``stages.executor`` applies with their write-ahead records or renders; the render gate renders the very
arguments the executor then runs (``executor.helm_args``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvfleet.clients.curvine import CurvineMaster
from kvfleet.clients.kube import call, get_or_none, wait_for
from kvfleet.errors import GateRefused, KvfleetError, PermanentError
from kvfleet.fleet import actions as A
from kvfleet.fleet import constants as C
from kvfleet.fleet import curvine_values as cv
from kvfleet.fleet.curvine_gates import metadata_preserved, normalize_overrides, refuse_flag_overrides
from kvfleet.stages import curvine as stage3
from kvfleet.stages import curvine_scale, executor
from kvfleet.stages.base import Outcome, StageContext
from kvfleet.stages.locks import ClusterLock

STAGE = "curvine-upgrade"
PURPOSE = "curvine-upgrade"
REVISION_LABEL = "controller-revision-hash"  # set by the StatefulSet controller on every pod it creates
# Rollback candidates must have been healthy once: a revision whose own upgrade failed is no target.
_NOT_TARGETS = frozenset({"failed", "pending-install", "pending-upgrade", "pending-rollback", "uninstalling"})


@dataclass(frozen=True)
class UpgradeRequest:
    """What the DAG's Params ask for, for one cluster."""

    version: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    rollback: bool = True
    timeout_s: float = 900.0
    expired_allowance: int = 0  # files that may legitimately disappear during the upgrade (Curvine TTL)
    lock_wait_s: float = 0.0
    l2_check: str = "file"  # "file": re-read sampled L2 files; "endpoint": stage 5 on one endpoint
    sample_files: int = 3


@dataclass
class Preflight:
    """Everything the gates observed, and what the upgrade would run."""

    revision: int
    chart_version: str | None
    values: dict[str, Any]  # the release's computed values (--all)
    user_values: dict[str, Any]  # the release's user-supplied values: what --reuse-values keeps
    result: dict[str, Any]  # what the upgrade will deploy
    action: A.HelmUpgrade
    command: str
    diff: str
    warnings: list[str] = field(default_factory=list)
    values_files: dict[str, str] = field(default_factory=dict)  # name in the command -> its YAML
    rendered: dict[str, Any] = field(default_factory=dict)  # the render check's summary

    def as_dict(self) -> dict[str, Any]:
        return {"revision": self.revision, "chart_version": self.chart_version, "command": self.command,
                "diff": self.diff, "warnings": self.warnings, "flags": cv.flags_of(self.values),
                "result_flags": cv.flags_of(self.result), "values_files": self.values_files,
                "rendered": self.rendered}


# ---- gates -----------------------------------------------------------------------------------------------------


def preflight(ctx: StageContext, req: UpgradeRequest, overrides: Mapping[str, Any]) -> Preflight:
    """The read-only gates (the lease is handled by the caller). Raises GateRefused with the reason."""
    spec = ctx.cluster.curvine
    ns = spec.namespace
    release = stage3.require_release(ctx)
    revision = release.revision
    values = ctx.helm.values(C.CURVINE_RELEASE, ns)
    stage3.refuse_flag_hazard(ctx, values, revision, "upgrade")
    repo = stage3.repo_url(ctx)
    if not ctx.helm.chart_exists(spec.chart, repo, req.version):
        raise GateRefused(f"upgrade refused on {ctx.cluster.name}: chart {spec.chart} version {req.version} was not "
                          f"found in {repo}. Check the version (helm search repo {spec.chart} --versions) or the "
                          "chart source (KVFLEET_HELM_REPO_CURVINE / curvine.repo_url).")
    replicas = overrides.get("worker.replicas")
    if replicas is not None and str(replicas) != str(cv.get_path(values, "worker.replicas")):
        raise GateRefused(f"upgrade refused on {ctx.cluster.name}: the override worker.replicas={replicas} changes "
                          f"the worker count ({cv.get_path(values, 'worker.replicas')} now). Use "
                          "kvfleet_curvine_scale_out: it checks the eligible nodes, proves the capacity, and refuses "
                          "a scale-in unless allowed.")
    defaults = ctx.helm.chart_defaults(spec.chart, repo, req.version)
    user_values = ctx.helm.values(C.CURVINE_RELEASE, ns, all_values=False)
    sets = {**overrides, **cv.safe_flags(), **cv.NO_CHART_RBAC}  # last: what the upgrade command passes last
    result = cv.merged_values(copy.deepcopy(user_values), sets, defaults)  # it shares nested mappings otherwise
    warnings = []
    if moving := curvine_scale.spare_node_warning(ctx, "upgrade"):
        warnings.append(moving)
    if cv.flags_set(defaults):
        warnings.append(f"chart {req.version} defaults set {', '.join(cv.flags_set(defaults))} true; kvfleet passes "
                        "them false explicitly, so they do not reach the pods")
    if cv.flags_set(result):  # cannot happen while the flags are passed last; kept as the contract's check
        raise GateRefused(f"upgrade refused on {ctx.cluster.name}: the resulting values would set "
                          f"{', '.join(cv.flags_set(result))} true")
    diff = cv.values_diff(values, result)
    action = dataclasses.replace(upgrade_action(ctx, req.version, overrides, revision, release.chart_version),
                                 diff=diff)
    # the check that counts: the flags in what helm would deploy with exactly the arguments the executor runs
    rendered = stage3.refuse_rendered_flags(ctx, ctx.helm.upgrade_render(executor.helm_args(ctx, action)),
                                            "upgrade", f"helm upgrade to {req.version} (--dry-run=server)")
    for w in warnings:
        ctx.say(f"warning: {w}")
    files = {name: yaml_text(tree) for name, tree in action.files()}
    return Preflight(revision, release.chart_version, values, user_values, result, action, action.equivalent(),
                     diff, warnings, values_files=files, rendered=rendered)


def yaml_text(values: Mapping[str, Any]) -> str:
    """A values file's YAML (the nested tree of dotted keys), as shown in the records."""
    import yaml

    return str(yaml.safe_dump(cv.nested(values), sort_keys=True, default_flow_style=False, width=120))


def upgrade_action(ctx: StageContext, version: str, overrides: Mapping[str, Any], revision: int,
                   chart_version: str | None) -> A.HelmUpgrade:
    """``helm upgrade -f <overrides> --reset-then-reuse-values -f <flags false>``: the new chart's defaults, then
    the release's user-supplied values, then the files in order — what ``merged_values`` models. The overrides
    and the flags are YAML files kvfleet writes (never ``--set``, whose parser splits values on commas); the
    flags file comes last, so it wins. Plain ``--reuse-values`` would also keep the *old* chart's defaults (helm
    copies the previous chart's values), so a new chart's new keys would never arrive; without either, the
    release's values would be dropped for chart defaults."""
    spec = ctx.cluster.curvine
    return A.helm_upgrade(C.CURVINE_RELEASE, spec.chart, spec.namespace, repo=stage3.repo_url(ctx), version=version,
                          values=overrides, reuse_values=False, reset_then_reuse=True,
                          last_values={**cv.safe_flags(), **cv.NO_CHART_RBAC},
                          why=f"revision {revision} {chart_version} -> {version}")


# ---- L2 samples and post-checks ----------------------------------------------------------------------------------


def sample_l2_files(ctx: StageContext, limit: int = 3, max_requests: int = 25) -> list[dict[str, Any]]:
    """A few files under the Curvine fs-path (newest directories first), with their length, for re-reading."""
    master = CurvineMaster(ctx.kube, ctx.cluster.curvine.namespace)
    queue = [ctx.cluster.curvine.fs_path]
    found: list[dict[str, Any]] = []
    requests = 0
    while queue and len(found) < limit and requests < max_requests:
        path = queue.pop(0)
        requests += 1
        try:
            entries = master.browse(path)
        except KvfleetError:
            continue
        if not isinstance(entries, list):
            continue
        for e in sorted(entries, key=lambda e: -int(e.get("mtime") or 0)):
            if e.get("is_dir"):
                queue.append(str(e["path"]))
            elif len(found) < limit:
                found.append({"path": str(e["path"]), "len": int(e.get("len") or 0)})
    return found


def reread_files(ctx: StageContext, files: list[dict[str, Any]]) -> dict[str, Any]:
    """Each sampled file is still there, same length, read back through the master."""
    master = CurvineMaster(ctx.kube, ctx.cluster.curvine.namespace)
    missing = []
    for f in files:
        try:
            got = master.browse(f["path"])
        except KvfleetError as exc:
            missing.append(f"{f['path']} ({exc})")
            continue
        entry = got[0] if isinstance(got, list) and got else {}
        if entry.get("path") != f["path"] or int(entry.get("len") or -1) != f["len"]:
            missing.append(f"{f['path']} (got {got!r:.120})")
    return {"files": len(files), "missing": missing}


def post_checks(ctx: StageContext, before: Mapping[str, Any], files: list[dict[str, Any]], req: UpgradeRequest,
                *, phase: str = "after") -> dict[str, Any]:
    """Flags false, metadata preserved, live workers as before, L2 serving. PermanentError naming what failed."""
    ns = ctx.cluster.curvine.namespace
    values = ctx.helm.values(C.CURVINE_RELEASE, ns)
    flags = cv.flags_of(values)
    master = CurvineMaster(ctx.kube, ns)
    want_live = int(before.get("live_workers") or 0)

    def workers_back() -> tuple[bool, str]:
        ov = master.overview()
        return ov.live_workers >= want_live, f"live workers {ov.live_workers}/{want_live}"

    problems = []
    try:
        wait_for(workers_back, timeout_s=req.timeout_s, poll_s=min(ctx.poll_s, 1.0),
                 what=f"[{ctx.cluster.name}] Curvine workers registered", progress=ctx.progress)
    except KvfleetError as exc:
        problems.append(f"live workers not back: {exc}")
    after = stage3.capacity_snapshot(ctx, STAGE, phase)
    if any(flags.values()):
        problems.append(f"release values have format flags set: {flags}")
    if not metadata_preserved(before, after, req.expired_allowance):
        problems.append(f"metadata lost: {after['files_total']} files after, {before.get('files_total')} before "
                        f"(allowance for expired files {req.expired_allowance})")
    if after["live_workers"] < want_live:
        problems.append(f"live workers {after['live_workers']}, {want_live} before")
    serving = l2_serving(ctx, files, req)
    if serving.get("missing"):
        problems.append(f"L2 no longer serves files written before the upgrade: {', '.join(serving['missing'])}")
    if serving.get("verdict") not in (None, "pass", "degraded"):
        problems.append(f"stage 5 on {serving.get('endpoint')}: {serving.get('verdict')} {serving.get('diagnosis')}")
    result = {"flags": flags, "files_before": before.get("files_total"), "files_after": after["files_total"],
              "live_before": want_live, "live_after": after["live_workers"], "l2": serving, "problems": problems}
    if problems:
        raise PermanentError(f"post-checks failed on {ctx.cluster.name}: " + "; ".join(problems))
    return result


def l2_serving(ctx: StageContext, files: list[dict[str, Any]], req: UpgradeRequest) -> dict[str, Any]:
    if req.l2_check == "endpoint":
        from kvfleet.stages import verify

        eps = [e for e in ctx.inventory.endpoints_of(ctx.cluster.key) if e.l2]
        if eps:
            result = verify.verify_endpoint(ctx, eps[0]).as_dict()
            return {"endpoint": eps[0].ref, "verdict": result["verdict"], "hit_ratio": result["hit_ratio"],
                    "diagnosis": result.get("diagnosis")}
    if not files:
        ctx.say("warning: L2 held no file before the upgrade and no endpoint was probed: L2 serving is unverified")
        return {"files": 0, "missing": [], "unverified": True}
    return reread_files(ctx, files)


# ---- rollback --------------------------------------------------------------------------------------------------


def rollback_to_safe_revision(ctx: StageContext, failed_revision: int, *, reason: str = "",
                              timeout_s: float | None = None) -> dict[str, Any]:
    """Roll back to the newest revision before ``failed_revision`` whose stored values have every format flag
    false (and which once deployed: not a failed or pending one). None → GateRefused saying why. Never to a
    revision with a flag true: its pods would reformat on start."""
    ns = ctx.cluster.curvine.namespace
    history = ctx.helm.revisions(C.CURVINE_RELEASE, ns) or []
    candidates: list[tuple[int, dict[str, Any]]] = []
    seen: dict[int, dict[str, Any]] = {}
    for row in history:
        rev = row.revision
        if rev >= failed_revision:
            continue
        values = ctx.helm.values(C.CURVINE_RELEASE, ns, revision=rev)
        seen[rev] = {"status": row.status, "flags": cv.flags_of(values)}
        if row.status.lower() not in _NOT_TARGETS:
            candidates.append((rev, values))
    # The stored values say the flags are false; what the rollback re-deploys is the revision's stored manifest
    # and hooks, so that is checked too (newest first; a revision whose objects carry a flag is skipped).
    target, rendered = None, {}
    while True:
        target = cv.newest_safe_revision(candidates, failed_revision)
        if target is None:
            break
        docs = ctx.helm.revision_manifest(C.CURVINE_RELEASE, ns, target)
        findings = cv.rendered_format_findings(docs)
        if docs and not findings:
            rendered = {"rendered": f"helm get manifest/hooks --revision {target}", "objects": len(docs),
                        "format_findings": []}
            break
        seen[target]["manifest_findings"] = findings or ["the stored manifest is empty"]
        ctx.say(f"revision {target} is no rollback target: its stored objects carry a format flag "
                f"({'; '.join(findings) or 'empty manifest'})")
        candidates = [(r, v) for r, v in candidates if r != target]
    if target is None:
        listed = "; ".join(
            f"revision {r} ({s['status']}): " + ", ".join(f"{k}={v}" for k, v in s["flags"].items())
            + (f", deployed objects: {'; '.join(s['manifest_findings'])}" if s.get("manifest_findings") else "")
            for r, s in sorted(seen.items())) or "none kept in the release history"
        ctx.record("rollback", STAGE, "refused", failed_revision=failed_revision, revisions=seen, reason=reason)
        raise GateRefused(
            f"rollback refused on {ctx.cluster.name}: no revision before {failed_revision} has every format flag "
            f"false ({listed}). Rolling back to one of them would start Curvine with a format flag and wipe the L2 "
            f"metadata and cache. Fix forward instead: `helm upgrade curvine -n {ns} --reuse-values --version "
            "<a working version> --set cluster.formatMaster=false --set cluster.formatWorker=false "
            "--set cluster.formatJournal=false`.")
    rollback = A.HelmRollback(C.CURVINE_RELEASE, ns, target, failed_revision)
    if ctx.dry_run:
        executor.run(ctx, STAGE, [rollback])
        return {"to": target, "planned": True}
    ctx.say(f"rolling back Curvine from revision {failed_revision} to revision {target} (its stored values have "
            f"every format flag false){': ' + reason if reason else ''}")
    executor.run(ctx, STAGE, [rollback])
    values = ctx.helm.values(C.CURVINE_RELEASE, ns)
    if cv.flags_set(values):  # the target was checked; this guards against a release edited meanwhile
        raise PermanentError(f"after the rollback on {ctx.cluster.name} the release has {cv.flags_set(values)} set: "
                             "flip them false now, before any pod restarts")
    replaced: list[str] = []
    state = stage3.wait_rolled_out(ctx, timeout_s, each_poll=lambda: replaced.extend(replace_stuck_pods(ctx)))
    return {"from": failed_revision, "to": target, "flags": cv.flags_of(values), "replaced_stuck_pods": replaced,
            "rollout": state, "rendered": rendered}


def replace_stuck_pods(ctx: StageContext) -> list[str]:
    """Delete Curvine pods that are not Ready and belong to an older StatefulSet revision than the current one.

    A StatefulSet rolling update never replaces a pod that is not Ready, so after reverting a template that
    broke the pods, the broken pods stay until deleted (Kubernetes documents this "forced rollback" step)."""
    ns = ctx.cluster.curvine.namespace
    deleted = []
    for name in (C.CURVINE_MASTER_STS, C.CURVINE_WORKER_STS):
        sts = get_or_none(ctx.kube.apps.read_namespaced_stateful_set, name, ns)
        if sts is None or (sts.status.observed_generation or 0) < (sts.metadata.generation or 0):
            continue
        current = sts.status.update_revision
        selector = ",".join(f"{k}={v}" for k, v in (sts.spec.selector.match_labels or {}).items())
        for pod in call(ctx.kube.core.list_namespaced_pod, ns, label_selector=selector, what="list pods").items:
            labels = pod.metadata.labels or {}
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            if current and labels.get(REVISION_LABEL) not in (None, current) and not ready:
                ctx.say(f"deleting {pod.metadata.name}: not Ready on the reverted revision "
                        f"{labels.get(REVISION_LABEL)}")
                call(ctx.kube.core.delete_namespaced_pod, pod.metadata.name, ns, what="delete stuck pod")
                deleted.append(pod.metadata.name)
    return deleted


# ---- the workflow ------------------------------------------------------------------------------------------------


def upgrade(ctx: StageContext, req: UpgradeRequest, *, holder: str) -> Outcome:
    """Gates, snapshot, upgrade, wait, post-checks and (when asked) a safe rollback on one cluster."""
    cluster = ctx.cluster.name
    try:
        refuse_flag_overrides(cluster, req.overrides)  # the raw form first: nested, lists and all
        overrides = normalize_overrides(req.overrides)
        refuse_flag_overrides(cluster, overrides)
        stage3.refuse_busy_cluster(ctx, holder, "upgrade")
        if ctx.dry_run:
            pre = preflight(ctx, req, overrides)
    except GateRefused as exc:
        ctx.record("gates", STAGE, "refused", version=req.version, reason=str(exc))
        raise
    if ctx.dry_run:
        executor.run(ctx, STAGE, [pre.action])
        return ctx.record("upgrade", STAGE, "planned", version=req.version, **pre.as_dict())
    if ctx.history is None:
        raise PermanentError("a Curvine upgrade needs the history store (cluster lease and records)")
    lock = ClusterLock(ctx.history, ctx.cluster.key, holder, PURPOSE, wait_s=req.lock_wait_s, poll_s=ctx.poll_s,
                       progress=ctx.progress)
    try:
        lock.acquire()
    except GateRefused as exc:
        ctx.record("gates", STAGE, "refused", version=req.version, reason=str(exc))
        raise
    try:
        return _upgrade_locked(ctx, req, overrides)
    finally:
        lock.release()


def _upgrade_locked(ctx: StageContext, req: UpgradeRequest, overrides: Mapping[str, Any]) -> Outcome:
    try:
        pre = preflight(ctx, req, overrides)
    except GateRefused as exc:
        ctx.record("gates", STAGE, "refused", version=req.version, reason=str(exc))
        raise
    ctx.record("gates", STAGE, "passed", version=req.version, **pre.as_dict())
    if pre.chart_version == req.version and pre.diff == "(no value changes)":
        ctx.say(f"Curvine already at {req.version} with these values: nothing to do")
        return ctx.record("upgrade", STAGE, "unchanged", version=req.version, revision=pre.revision)

    revisions = stage3._record_revisions(ctx, C.CURVINE_RELEASE)
    before = stage3.capacity_snapshot(ctx, STAGE, "before")
    files = sample_l2_files(ctx, req.sample_files) if req.l2_check == "file" else []
    ctx.record("snapshot_before", STAGE, "passed", revision=pre.revision, chart_version=pre.chart_version,
               flags=cv.flags_of(pre.values), values=pre.values, overview=before, sample_files=files,
               revisions=revisions)
    ctx.say(f"upgrading Curvine {pre.chart_version} (revision {pre.revision}) -> {req.version}: {pre.command}\n"
            f"{pre.diff}")
    failure: Exception | None = None
    checks: dict[str, Any] = {}
    try:
        executor.run(ctx, STAGE, [pre.action])
        stage3.wait_rolled_out(ctx, req.timeout_s)
        checks = post_checks(ctx, before, files, req)
    except KvfleetError as exc:
        failure = exc
    # the newest revision of any status: a helm failure leaves a "failed" revision whose objects may be applied
    rows = ctx.helm.revisions(C.CURVINE_RELEASE, ctx.cluster.curvine.namespace)
    if not rows:
        raise PermanentError(f"the Curvine release on {ctx.cluster.name} is gone after the upgrade attempt "
                             f"({failure or 'no error'}); check `helm history {C.CURVINE_RELEASE}`") from failure
    now = max(r.revision for r in rows)
    revisions = stage3._record_revisions(ctx, C.CURVINE_RELEASE)
    if failure is None:
        ctx.say(f"upgrade to {req.version} done: revision {now}, flags false, {checks['files_after']} files, "
                f"{checks['live_after']} live workers")
        return ctx.record("upgrade", STAGE, "changed", version=req.version, from_revision=pre.revision,
                          to_revision=now, flags=checks["flags"], post_checks=checks, revisions=revisions)
    ctx.record("upgrade", STAGE, "failed", version=req.version, from_revision=pre.revision, to_revision=now,
               error=str(failure), revisions=revisions)
    if now <= pre.revision:
        raise PermanentError(f"upgrade of Curvine on {ctx.cluster.name} to {req.version} failed before a new "
                             f"revision was deployed (still revision {pre.revision}): {failure}") from failure
    if not req.rollback:
        raise PermanentError(f"upgrade of Curvine on {ctx.cluster.name} to {req.version} failed (revision {now}); "
                             f"rollback not requested: {failure}. Roll back with this DAG's rollback Param, or fix "
                             "forward.") from failure
    rolled = rollback_to_safe_revision(ctx, now, reason=str(failure), timeout_s=req.timeout_s)
    try:
        rolled["post_checks"] = post_checks(ctx, before, files, req, phase="after-rollback")
    except PermanentError as exc:
        rolled["post_checks"] = {"problems": [str(exc)]}
    rolled["revisions"] = stage3._record_revisions(ctx, C.CURVINE_RELEASE)
    ok = not rolled["post_checks"].get("problems")
    ctx.record("rollback", STAGE, "changed" if ok else "failed", **rolled)
    raise PermanentError(
        f"upgrade of Curvine on {ctx.cluster.name} to {req.version} failed: {failure}. Rolled back from revision "
        f"{now} to revision {rolled['to']} (format flags false); post-checks after the rollback "
        + ("passed: L2 files and metadata kept." if ok else f"failed: {rolled['post_checks']['problems']}")) \
        from failure
