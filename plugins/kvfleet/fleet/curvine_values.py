"""Curvine chart values: what kvfleet installs, and the format-flag rules every Curvine action obeys.

Pure. Used by the Curvine stage (install, flip, hazard fix), the upgrade and scale-out workflows (gates,
rollback target) and the drift check (``format_flag_set``).

Why it matters (docs/reference/curvine.md#format-flags): a Curvine master that *starts* with ``cluster.formatMaster``
wipes its metadata and journal; a worker that starts with ``formatWorker`` deletes its cache dirs. The flags must be
true for the very first start only, and false for every start after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kvfleet.fleet import constants as C
from kvfleet.fleet.inventory import Cluster, CurvineSpec

FLAG_KEYS = tuple(f"cluster.{f}" for f in C.FORMAT_FLAGS)
# Worker placement (docs/reference/curvine.md#worker-placement): the real chart's worker StatefulSet has no nodeSelector
# and only a *preferred* pod anti-affinity by default (curvine-helm curvine-runtime/templates/worker-statefulset.yaml
# and _helpers.tpl "curvine.workerAntiAffinity", chart 0.2.0). kvfleet sets both: workers on HyperPod GPU nodes only
# (where /opt/dlami/nvme is the instance NVMe), and at most one worker per node (two workers on one node would
# share its hostPath). Facts: tests/conformance/facts/curvine_chart_values.yaml.
COMPUTE_TYPE_LABEL = "sagemaker.amazonaws.com/compute-type"
COMPUTE_TYPE_VALUE = "hyperpod"
WORKER_NODE_SELECTOR_KEY = "worker.nodeSelector." + COMPUTE_TYPE_LABEL.replace(".", "\\.")
WORKER_ANTI_AFFINITY = {"worker.antiAffinity.enabled": True, "worker.antiAffinity.type": "required"}


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


# Both Curvine charts are installed and upgraded without their RBAC objects (the CSI driver's cluster-wide
# ClusterRoles, the runtime chart's Role): a cluster admin applies them once with the kvfleet-bootstrap bundle
# (kvfleet.fleet.bootstrap_bundle), so kvfleet's identity never writes a role and needs no escalate or bind.
NO_CHART_RBAC: dict[str, bool] = {"rbac.create": False}


def safe_flags() -> dict[str, bool]:
    """The three flags false, as dotted keys (written to a values file): passed explicitly on every upgrade,
    whatever the release's values say."""
    return {k: False for k in FLAG_KEYS}


def install_values(cluster: Cluster) -> dict[str, Any]:
    """Values of the first install (docs/reference/curvine.md#format-flags): format flags true for the first start."""
    spec: CurvineSpec = cluster.curvine
    values: dict[str, Any] = {k: True for k in FLAG_KEYS}
    values.update(sizing_values(cluster))
    values.update(NO_CHART_RBAC)
    values.update({
        "master.storage.meta.storageClass": spec.master.storage_class,
        "master.storage.meta.size": spec.master.meta_size,
        "master.storage.journal.storageClass": spec.master.storage_class,
        "master.storage.journal.size": spec.master.journal_size,
        "master.nodeSelector." + COMPUTE_TYPE_LABEL.replace(".", "\\."): COMPUTE_TYPE_VALUE,
        **placement_values(),
        "worker.storage.dataDirs[0].name": "data1",
        "worker.storage.dataDirs[0].type": "SSD",
        "worker.storage.dataDirs[0].enabled": True,
        "worker.storage.dataDirs[0].storageClass": "",
        "worker.storage.dataDirs[0].hostPath": spec.worker.host_path,
        "worker.storage.dataDirs[0].mountPath": "/data/data1",
    })
    return values


def placement_values() -> dict[str, Any]:
    """Workers pinned to HyperPod GPU nodes, one per node (required pod anti-affinity on the hostname)."""
    return {WORKER_NODE_SELECTOR_KEY: COMPUTE_TYPE_VALUE, **WORKER_ANTI_AFFINITY}


def sizing_values(cluster: Cluster) -> dict[str, Any]:
    return {
        "master.replicas": cluster.curvine.master.replicas,
        "worker.replicas": cluster.curvine_workers,
        "worker.storage.dataDirs[0].size": cluster.curvine.worker.size,
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


# ---- the format-flag class: no path may set a flag --------------------------------------------------------------
#
# Three layers, each enough on its own for the cases it sees:
# 1. user overrides reach helm only as a YAML values file kvfleet writes (``-f``), never ``--set``: helm's strvals
#    parser splits a ``--set`` value on commas and reads backslash escapes
#    (docs/reference/kubernetes.md#helm-set-parsing), so ``config.log.level=INFO,cluster.formatMaster=true`` would
#    set two keys; a YAML string is one string;
# 2. an override is refused when any key on its path or any text in its value mentions a format flag
#    (``refuse_format_overrides`` below: case-insensitive, at any depth, dotted or nested);
# 3. before an upgrade, scale-out or rollback, what helm would deploy is rendered and its flags are read from the
#    rendered objects themselves (``rendered_format_findings``): the ConfigMap's TOML (``format_master = ...``,
#    the key Curvine reads) and every container's env and args.

_KEY_SAFE = re.compile(r"^[A-Za-z0-9_\-/.]+(\[\d+\])*$")  # one path segment: a values key, optionally indexed
_FLAG_WORDS = ("master", "worker", "journal", "cluster")


def _alnum(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _mentions_format(text: str) -> bool:
    """Whether ``text`` names a format flag in any spelling: ``cluster.formatMaster``, ``format_worker``,
    ``CURVINE_FORMAT_MASTER``, ``cluster.form\\atMaster`` (a backslash escape), any case. Punctuation and escapes
    are ignored, so no spelling gets through by splitting the words."""
    flat = _alnum(text)
    return "format" in flat and any(w in flat for w in _FLAG_WORDS)


def split_key(dotted: str) -> list[str]:
    """A dotted override key as path segments (``\\.`` keeps a dot inside a segment, as helm's keys do)."""
    return [p.replace("\0", ".") for p in str(dotted).replace("\\.", "\0").split(".")]


def _walk(values: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (key path, leaf value) of a nested mapping; dotted keys are split; list items are indexed."""
    if isinstance(values, Mapping):
        if not values and path:
            yield path, values
        for key, value in values.items():
            yield from _walk(value, path + tuple(split_key(str(key))))
    elif isinstance(values, list | tuple | set):
        if not values:
            yield path, values
        for i, value in enumerate(values):
            yield from _walk(value, (*path[:-1], f"{path[-1]}[{i}]") if path else (f"[{i}]",))
    else:
        yield path, values


def format_override_problems(overrides: Mapping[str, Any]) -> list[str]:
    """Why each offending override is refused; empty when every override is acceptable.

    Refused: a key path that touches a format flag at any depth and in any case (``cluster.formatMaster``,
    ``{"cluster": {"FormatWorker": ...}}``, ``configOverrides.master.format_master``) — whatever its value, even
    ``false`` (kvfleet forces the flags false itself); a key segment helm or kvfleet could read as more than one
    key (``,``, ``=``, spaces, quotes, an empty segment); and a value whose text mentions a format flag
    (``"INFO,cluster.formatMaster=true"``, ``"INFO\\,cluster.formatMaster=true"``, an env var
    ``CURVINE_FORMAT_WORKER``), which is how a comma in a ``--set`` value used to set the flag.
    """
    problems: list[str] = []
    for path, value in _walk(dict(overrides)):
        key = ".".join(s.replace(".", "\\.") for s in path)
        if any(_mentions_format(seg) or "format" in seg.lower() for seg in path):
            problems.append(f"key {key!r} touches a Curvine format flag (cluster.*format* at any depth)")
            continue
        bad = [seg for seg in path if not _KEY_SAFE.match(seg)]
        if bad:
            problems.append(f"key {key!r} has the segment {bad[0]!r}: a values key is letters, digits, '_', '-', '.', "
                            "'/' and an optional [index]; ',', '=', spaces and quotes are refused (helm would read "
                            "them as more keys)")
            continue
        if isinstance(value, str | bytes) and _mentions_format(value.decode() if isinstance(value, bytes) else value):
            problems.append(f"value of {key!r} ({value!r}) names a Curvine format flag; a comma or an escape in it "
                            "would set that flag through helm's --set parser")
    return problems


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys (``worker.storage.dataDirs[0].size``, ``\\.`` for a literal dot) as the nested mapping a YAML
    values file carries; nested mappings in the input are merged, later keys win (sorted for a stable file)."""
    out: dict[str, Any] = {}
    for key in sorted(values, key=str):
        value = values[key]
        if isinstance(value, Mapping):
            sub = nested(value)
            node = get_path(out, str(key))
            if isinstance(node, dict):
                _deep_merge(node, sub)
                continue
            value = sub
        set_path(out, str(key), value)
    return out


# Rendered objects. The real chart renders the flags into the ConfigMap's TOML (curvine-runtime
# templates/configmap.yaml: ``format_master = {{ .Values.cluster.formatMaster | default false }}``); the sandbox's
# stand-in also renders them into the containers' env. Any key or env var or arg naming a format flag must be
# exactly false; anything else (true, "1", empty, a valueFrom, a value helm rendered as ``<no value>``) is refused.
_TOML_FORMAT = re.compile(r"^\s*\"?([A-Za-z0-9_.\-]*format[A-Za-z0-9_.\-]*)\"?\s*=\s*(.*?)\s*(#.*)?$", re.IGNORECASE)
_POD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}


def _pod_spec(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    kind = doc.get("kind")
    if kind == "Pod":
        return doc.get("spec") or {}
    if kind == "CronJob":
        return ((((doc.get("spec") or {}).get("jobTemplate") or {}).get("spec") or {}).get("template") or {}) \
            .get("spec") or {}
    if kind in _POD_KINDS:
        return ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
    return None


def _is_false(text: Any) -> bool:
    return str(text).strip().strip("'\"").lower() == "false"


def rendered_format_findings(docs: Iterable[Mapping[str, Any] | None]) -> list[str]:
    """Every place in rendered Kubernetes objects where a format flag is not false, as ``Kind/name where: what``."""
    found: list[str] = []
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        ref = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        if doc.get("kind") == "ConfigMap":
            found += _toml_findings(ref, doc.get("data") or {})
        spec = _pod_spec(doc)
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])] if spec else []:
            found += _container_findings(f"{ref} container {container.get('name')}", container)
    return found


def _toml_findings(ref: str, data: Mapping[str, Any]) -> list[str]:
    found = []
    for name, text in sorted(data.items()):
        for line in str(text).splitlines():
            m = _TOML_FORMAT.match(line)
            if m and _mentions_format(m.group(1)) and not _is_false(m.group(2)):
                found.append(f"{ref} {name}: {line.strip()}")
    return found


def _container_findings(where: str, container: Mapping[str, Any]) -> list[str]:
    found = []
    for env in container.get("env") or []:
        name = str(env.get("name") or "")
        if _mentions_format(name) and ("valueFrom" in env or not _is_false(env.get("value"))):
            shown = env.get("value") if "valueFrom" not in env else f"valueFrom {env['valueFrom']}"
            found.append(f"{where} env {name}={shown}")
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, arg in enumerate(argv):
        if not _mentions_format(arg.split("=", 1)[0]):
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
        if not _is_false(value):
            found.append(f"{where} arg {arg!r}" + ("" if "=" in arg else f" {value!r}"))
    return found

def worker_node_selector() -> dict[str, str]:
    """The node labels kvfleet pins Curvine workers to (``worker.nodeSelector`` in its install values)."""
    return {COMPUTE_TYPE_LABEL: COMPUTE_TYPE_VALUE}


def placement_problems(docs: Iterable[Mapping[str, Any] | None]) -> list[str]:
    """What is wrong with the rendered worker StatefulSet's placement: it must carry kvfleet's nodeSelector (HyperPod
    GPU nodes, where the NVMe is) and a REQUIRED pod anti-affinity on ``kubernetes.io/hostname`` (one worker per
    node: two would share the node's hostPath)."""
    workers = [d for d in docs if isinstance(d, Mapping) and d.get("kind") == "StatefulSet"
               and (str((d.get("metadata") or {}).get("name") or "").endswith("-worker")
                    or ((d.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/component") == "worker")]
    if not workers:
        return ["no worker StatefulSet rendered"]
    problems = []
    for sts in workers:
        name = (sts.get("metadata") or {}).get("name")
        spec = _pod_spec(sts) or {}
        selector = spec.get("nodeSelector") or {}
        for label, value in worker_node_selector().items():
            if selector.get(label) != value:
                problems.append(f"StatefulSet/{name}: nodeSelector {label}={selector.get(label)!r} (want {value!r})")
        anti = ((spec.get("affinity") or {}).get("podAntiAffinity") or {})
        required = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
        if not any(t.get("topologyKey") == "kubernetes.io/hostname" for t in required if isinstance(t, Mapping)):
            problems.append(f"StatefulSet/{name}: no required pod anti-affinity on kubernetes.io/hostname (has "
                            f"{sorted(anti) or 'none'})")
    return problems


def flatten(values: Any, prefix: str = "") -> dict[str, Any]:
    """Nested values as dotted paths (lists indexed: ``worker.storage.dataDirs[0].size``)."""
    out: dict[str, Any] = {}
    if isinstance(values, dict):
        if not values and prefix:
            out[prefix] = {}
        for key, value in values.items():
            name = str(key).replace(".", "\\.")
            out.update(flatten(value, f"{prefix}.{name}" if prefix else name))
    elif isinstance(values, list) and values and all(isinstance(v, dict) for v in values):
        for i, value in enumerate(values):
            out.update(flatten(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = values
    return out


def values_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A readable diff of two values trees, one dotted key per line (``~`` changed, ``+`` added, ``-`` removed)."""
    a, b = flatten(before), flatten(after)
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in a:
            lines.append(f"+ {key}: {b[key]!r}")
        elif key not in b:
            lines.append(f"- {key}: {a[key]!r}")
        elif a[key] != b[key]:
            lines.append(f"~ {key}: {a[key]!r} -> {b[key]!r}")
    return "\n".join(lines) if lines else "(no value changes)"
