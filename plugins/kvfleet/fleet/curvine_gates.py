"""The Curvine gates, pure: what an upgrade or a scale-out may not do, judged from values alone.

Called by ``kvfleet.stages.curvine`` (stage 3), ``kvfleet.stages.curvine_upgrade`` and
``kvfleet.stages.curvine_scale``, which do the I/O (helm, the master API) and the sequencing, and by the Curvine
DAGs' task bodies (an override touching a format flag is refused before any cluster is touched). Each gate
raises ``GateRefused`` with what was wrong and what to do; the rules behind them are in
docs/reference/curvine.md#format-flags (a Curvine pod started with a format flag wipes the L2 metadata or cache)
and docs/reference/kubernetes.md#helm-set-parsing (helm's ``--set`` parser).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvfleet.errors import GateRefused, PermanentError
from kvfleet.fleet import curvine_values as cv


def safe_flags_set_text() -> str:
    """The ``--set`` flags that turn every format flag false, as a person would type them (kvfleet itself passes
    values as files; these flips contain no comma or escape)."""
    return " ".join(f"--set {key}={str(value).lower()}" for key, value in sorted(cv.safe_flags().items()))


def refuse_flag_hazard(cluster: str, namespace: str, values: Mapping[str, Any], revision: int, action: str) -> None:
    """The deployed release must have every format flag false before kvfleet touches it again."""
    hazard = cv.flags_set(values)
    if hazard:
        raise GateRefused(
            f"{action} refused on {cluster}: the deployed Curvine release (revision {revision}) has "
            f"{', '.join('cluster.' + f + '=true' for f in hazard)} — the next pod restart would reformat and wipe "
            "L2. Fix that first, as the drift check does: run kvfleet_rollout on this cluster (stage 3 flips the "
            f"flags with --reuse-values) or `helm upgrade curvine -n {namespace} --reuse-values "
            f"{safe_flags_set_text()}`, then retry.")


def normalize_overrides(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """Overrides as dotted keys with scalar values (nested mappings are flattened; a dot inside a nested key is a
    literal dot, as in a values file). They reach helm as a values file kvfleet writes, never as ``--set``."""
    out: dict[str, Any] = {}
    for key, value in dict(raw or {}).items():
        if isinstance(value, Mapping):
            out.update(normalize_overrides({f"{key}.{str(k).replace('.', chr(92) + '.')}": v
                                            for k, v in value.items()}))
        elif isinstance(value, list | tuple | set):
            raise PermanentError(f"override {key}: {value!r} is not a scalar; give one dotted key per value "
                                 "(e.g. worker.storage.dataDirs[0].size=200Gi)")
        else:
            out[str(key)] = value
    return out


def refuse_flag_overrides(cluster: str, overrides: Mapping[str, Any]) -> None:
    """An override that touches a format flag — by its key at any depth, or by a value that names one (a comma
    or an escape in a ``--set`` value used to set a second key) — is refused, whatever the approval says."""
    problems = cv.format_override_problems(overrides)
    if problems:
        raise GateRefused(
            f"upgrade refused on {cluster}: {'; '.join(problems)}. Such an override could start Curvine pods with a "
            "format flag and wipe the L2 metadata or cache. Approval does not change this: reformatting is a "
            "separate, deliberate action, never a side effect of an upgrade. Remove the override (kvfleet passes "
            "every format flag false itself).")


def metadata_preserved(before: Mapping[str, Any], after: Mapping[str, Any], expired_allowance: int) -> bool:
    """The metadata-preserved rule: ``files_total after >= files_total before - expired_allowance``.

    New files written during the window only raise the count, so ``>=`` holds. Files can legitimately vanish only
    by expiring (a Curvine TTL); LMCache's fs connector writes L2 files without a TTL, so the allowance defaults to
    0 and a Param raises it for clusters whose writers set one. A master that started with formatMaster drops the
    count to 0; a worker that formatted drops its share — both fail this rule.
    """
    return int(after.get("files_total") or 0) >= int(before.get("files_total") or 0) - max(0, expired_allowance)


def refuse_rendered_flags(cluster: str, docs: Sequence[Mapping[str, Any]], action: str, what: str) -> dict[str, Any]:
    """The format-flag check on what helm WOULD deploy (not on what kvfleet meant to pass): every ConfigMap's TOML
    and every container's env and args in the rendered objects and hooks. GateRefused naming each place."""
    if not docs:
        raise GateRefused(f"{action} refused on {cluster}: {what} rendered no objects, so the format flags "
                          "cannot be checked in what helm would deploy")
    findings = cv.rendered_format_findings(docs)
    if findings:
        raise GateRefused(
            f"{action} refused on {cluster} before any change: {what} would deploy a Curvine format flag "
            f"that is not false — {'; '.join(findings)}. A pod starting with it wipes the L2 metadata or cache "
            "(docs/reference/curvine.md#format-flags). Find what sets it (an override, the chart's defaults, the "
            "stored values) and remove it.")
    kinds = sorted({f"{d.get('kind')}/{(d.get('metadata') or {}).get('name')}" for d in docs})
    return {"rendered": what, "objects": len(docs), "kinds": kinds, "format_findings": []}


def refuse_unpinned_workers(cluster: str, docs: Sequence[Mapping[str, Any]]) -> None:
    """The rendered worker StatefulSet must pin the workers to the HyperPod nodes, one per node."""
    placement = cv.placement_problems(docs)
    if placement:
        raise GateRefused(
            f"scale-out refused on {cluster} before any change: the rendered worker StatefulSet does not "
            f"pin the workers ({'; '.join(placement)}). Without the nodeSelector a worker can land on a non-GPU "
            "node and write the NVMe hostPath onto its root disk; without the required anti-affinity two workers "
            "can share one node's hostPath. The chart must honour worker.nodeSelector and worker.antiAffinity.type.")


def requested_workers(cluster: str, target: int | None, *, all_eligible: bool, eligible: Sequence[str],
                      ineligible: Mapping[str, str]) -> int:
    """The on-demand scale-out's worker count: at least 1, and never more than the eligible nodes (a second
    worker on one node would share its NVMe)."""
    if all_eligible:
        return max(1, len(eligible))
    if target is None:
        raise PermanentError(f"scale-out on {cluster}: give target_workers, or set all_eligible")
    if target < 1:
        raise PermanentError(f"target worker count {target} on {cluster}: at least 1")
    if target > len(eligible):
        raise GateRefused(
            f"scale-out refused on {cluster}: {target} workers asked, but only {len(eligible)} "
            f"node(s) are eligible ({', '.join(eligible) or 'none'}"
            + (f"; not eligible: {'; '.join(f'{n}: {r}' for n, r in sorted(ineligible.items()))}"
               if ineligible else "")
            + "). A second worker on one node would share its NVMe: add GPU nodes first.")
    return target


def scale_out_due(*, replicas: int, eligible: int, nodes_without_worker: Sequence[str], usage: float,
                  previous_usage: float | None, threshold: float) -> dict[str, Any]:
    """The scheduled path's decision: why a scale-out is due (or not), and to how many workers. Usage counts
    only when the previous snapshot was above the threshold too (one spike is not a trend)."""
    reasons = []
    if nodes_without_worker:
        reasons.append(f"{len(nodes_without_worker)} GPU node(s) without a Curvine worker: "
                       f"{', '.join(nodes_without_worker)}")
    if usage > threshold and (previous_usage is None or previous_usage > threshold):
        reasons.append(f"fs_used/capacity {usage:.0%} above {threshold:.0%}"
                       + (f" (and {previous_usage:.0%} at the previous snapshot)" if previous_usage is not None
                          else ""))
    target = max(replicas, eligible)
    if reasons and target == replicas:
        reasons.append("but every eligible node already runs a worker: add GPU nodes to grow the pool")
        return {"due": False, "reasons": reasons, "target": replicas}
    return {"due": bool(reasons), "reasons": reasons, "target": target if reasons else replicas}
