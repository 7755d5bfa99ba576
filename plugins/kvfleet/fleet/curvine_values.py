"""Curvine chart values: what kvfleet installs, and the format-flag rules every Curvine action obeys.

Pure. Used by the Curvine stage (install, flip, hazard fix), the upgrade and scale-out workflows (gates,
rollback target) and the drift check (``format_flag_set``).

Why it matters (FACTS.md §3.3): a Curvine master that *starts* with ``cluster.formatMaster`` wipes its metadata
and journal; a worker that starts with ``formatWorker`` deletes its cache dirs. The flags must be true for the
very first start only, and false for every start after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvfleet.fleet import constants as C
from kvfleet.fleet.inventory import Cluster, CurvineSpec

FLAG_KEYS = tuple(f"cluster.{f}" for f in C.FORMAT_FLAGS)


def flags_of(values: Mapping[str, Any]) -> dict[str, bool | None]:
    """The three format flags from a (nested) values mapping; None when absent."""
    cluster = values.get("cluster") or {}
    out: dict[str, bool | None] = {}
    for flag in C.FORMAT_FLAGS:
        raw = cluster.get(flag) if isinstance(cluster, Mapping) else None
        out[flag] = _truthy(raw) if raw is not None else None
    return out


def _truthy(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    return str(raw).strip().lower() in ("true", "1", "yes", "on")


def flags_set(values: Mapping[str, Any]) -> list[str]:
    """Names of the format flags that are true."""
    return [f for f, v in flags_of(values).items() if v]


def safe_flags() -> dict[str, bool]:
    """The three flags false, as ``--set`` keys: passed explicitly on every upgrade, whatever the values say."""
    return {k: False for k in FLAG_KEYS}


def install_values(cluster: Cluster) -> dict[str, Any]:
    """``--set`` values of the first install (DOMAIN.md stage 3): format flags true for the first start."""
    spec: CurvineSpec = cluster.curvine
    values: dict[str, Any] = {k: True for k in FLAG_KEYS}
    values.update(sizing_values(spec))
    values.update({
        "master.storage.meta.storageClass": spec.master_storage_class,
        "master.storage.meta.size": spec.master_meta_size,
        "master.storage.journal.storageClass": spec.master_storage_class,
        "master.storage.journal.size": spec.master_journal_size,
        "master.nodeSelector.sagemaker\\.amazonaws\\.com/compute-type": "hyperpod",
        "worker.storage.dataDirs[0].name": "data1",
        "worker.storage.dataDirs[0].type": "SSD",
        "worker.storage.dataDirs[0].enabled": True,
        "worker.storage.dataDirs[0].storageClass": "",
        "worker.storage.dataDirs[0].hostPath": spec.worker_host_path,
        "worker.storage.dataDirs[0].mountPath": "/data/data1",
    })
    return values


def sizing_values(spec: CurvineSpec) -> dict[str, Any]:
    return {
        "master.replicas": spec.master_replicas,
        "worker.replicas": spec.worker_replicas,
        "worker.storage.dataDirs[0].size": spec.worker_size,
    }


def get_path(values: Mapping[str, Any], dotted: str) -> Any:
    """Read ``worker.storage.dataDirs[0].size`` style paths from nested values; None when absent."""
    node: Any = values
    for part in dotted.replace("\\.", "\0").split("."):
        part = part.replace("\0", ".")
        index = None
        if part.endswith("]") and "[" in part:
            part, idx = part[:-1].split("[", 1)
            index = int(idx)
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
        if index is not None:
            if not isinstance(node, list) or index >= len(node):
                return None
            node = node[index]
    return node


def set_path(values: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = values
    parts = dotted.replace("\\.", "\0").split(".")
    for i, raw in enumerate(parts):
        part = raw.replace("\0", ".")
        last = i == len(parts) - 1
        if part.endswith("]") and "[" in part:
            name, idx = part[:-1].split("[", 1)
            lst = node.setdefault(name, [])
            while len(lst) <= int(idx):
                lst.append({})
            if last:
                lst[int(idx)] = value
            else:
                node = lst[int(idx)]
        elif last:
            node[part] = value
        else:
            node = node.setdefault(part, {})


def merged_values(current: Mapping[str, Any], overrides: Mapping[str, Any],
                  chart_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What an ``upgrade --reuse-values --set ...`` will deploy: chart defaults < current values < overrides.

    (helm's --reuse-values keeps the release's values; new chart keys take their defaults.)
    """
    import copy

    result = _deep_merge(copy.deepcopy(dict(chart_defaults or {})), copy.deepcopy(dict(current)))
    for key, value in overrides.items():
        set_path(result, key, value)
    return result


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def overrides_setting_flags(overrides: Mapping[str, Any]) -> list[str]:
    """Override keys that would set a format flag true (refused even with approval)."""
    return [k for k in overrides if k in FLAG_KEYS and _truthy(overrides[k])]


def newest_safe_revision(revisions: Iterable[tuple[int, Mapping[str, Any]]], before: int) -> int | None:
    """The newest revision older than ``before`` whose stored values have every format flag false.

    Never a revision with a flag true: rolling back to the install revision (flags true) would re-format the
    master and the workers on their next start.
    """
    safe = [rev for rev, values in revisions if rev < before and not flags_set(values)]
    return max(safe) if safe else None
