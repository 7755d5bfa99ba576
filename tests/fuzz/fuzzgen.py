"""Seeded generators of hostile inventories and admin bodies, and an independent validity check.

Everything is a pure function of a seed (``random.Random(seed)``), so a failing case replays from the seed kept in
``tests/data/fuzz_seeds.json``. An inventory case is ``(case_id, text, expect, field)``:

- ``expect`` is ``"refuse"`` when the mutation is invalid by construction, ``"any"`` when it may be valid (the
  independent check in :func:`independent_problems` then decides whether an acceptance was right);
- ``field`` is a word the refusal must name (the mutated key), or ``None`` for a document-level refusal
  (alias bomb, a duplicate key, a forbidden tag), where the message names the line instead.
"""

from __future__ import annotations

import copy
import random
import re
from typing import Any

import yaml

# A small valid fleet: 2 clusters (single-GPU and 4-GPU nodes), 2 LOBs, 4 endpoints.
BASE: dict[str, Any] = {
    "settings": {"wave_size": 3, "chunk_size": 256, "hash_seed": "0", "operator_pause_threshold_minutes": 30},
    "lobs": [{"name": "retail", "description": "shop"}, {"name": "support", "remediate_drift": True}],
    "clusters": [
        {"name": "c1", "region": "us-east-1", "gpu_nodes": {"count": 4, "instance_type": "ml.g5.4xlarge"},
         "tiered_storage": {"mode": "Enable", "memory_percent": 20}, "l2_injection": "patch",
         "curvine": {"version": "0.3.2-alpha", "worker": {"replicas": 2, "host_path": "/opt/dlami/nvme/cv",
                                                          "size": "100Gi"},
                     "master": {"replicas": 1, "storage_class": "ebs-sc", "meta_size": "10Gi"}}},
        {"name": "c2", "region": "us-west-2", "gpu_nodes": {"count": 2, "instance_type": "ml.g6e.12xlarge"},
         "l2_injection": "kyverno", "ebs_storage_class": "ebs-sc"},
    ],
    "endpoints": [
        {"name": "chat", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
         "instance_type": "ml.g5.4xlarge", "replicas": 2, "routing": "prefixaware"},
        {"name": "rag", "namespace": "retail", "lob": "retail", "cluster": "c1", "model": "qwen2-7b",
         "instance_type": "ml.g5.4xlarge", "replicas": 1, "env": {"VLLM_LOG": "1"}},
        {"name": "help", "namespace": "support", "lob": "support", "cluster": "c2", "model": "llama3-8b",
         "instance_type": "ml.g6e.12xlarge", "replicas": 4, "image": "lmcache/vllm-openai:v0.3.9",
         "model_id": "meta-llama/Meta-Llama-3-8B-Instruct"},
        {"name": "chat", "namespace": "support", "lob": "support", "cluster": "c2", "model": "qwen2-7b",
         "instance_type": "ml.g6e.12xlarge", "replicas": 2, "l2": False},
    ],
}

# Each field kvfleet reads, with values that must be refused there (by construction).
BAD_VALUES: list[tuple[tuple[Any, ...], list[Any]]] = [
    (("settings", "hash_seed"), ["random", "-1", "4294967296", "1.5", " 0", "0x10", True, [], "٣"]),
    (("settings", "wave_size"), [0, 501, -1, "3", 3.0, True, None, 2**80]),
    (("settings", "chunk_size"), [15, 4097]),
    (("settings", "l2_url"), ["fs://localhost:0/mnt/curvine/../../etc/", "redis://x", "s3://b/"]),
    (("settings", "serde"), ["cachegen", 1]),
    (("clusters", 0, "gpu_nodes", "count"), [0, 10001, "4", 1.5, False]),
    (("clusters", 0, "gpu_nodes", "instance_type"), ["g5.4xlarge", "ml.x1.large", "ml.g5.4xlarge ", "ml.G5.4XL"]),
    (("clusters", 0, "tiered_storage", "memory_percent"), [19, 101, "20", None]),
    (("clusters", 0, "tiered_storage", "mode"), ["enable", "On", True]),
    (("clusters", 0, "region"), ["us-east", "US-EAST-1", "", 1]),
    (("clusters", 0, "l2_injection"), ["webhook", ["patch"]]),
    (("clusters", 0, "curvine", "version"), ["1.2", "latest", "v0.3", "-0.3.2", "0.3.2,cluster.formatMaster=true"]),
    (("clusters", 0, "curvine", "repo_url"), ["http://charts.example.com", "ftp://x/y", "https://u:p@h/x",
                                              "https://h/x?a=b", "-https://h", "https://h x"]),
    (("clusters", 0, "curvine", "chart"), ["-curvine", "Curvine", "curvine,x=y"]),
    (("clusters", 0, "curvine", "worker", "host_path"), ["/opt/../etc", "relative/path", "-/x", "/a,b", "/a=b",
                                                          "/a{b}", "/a[0]", "/a\\b", "/a b", ".."]),
    (("clusters", 0, "curvine", "master", "storage_class"), ["Ebs_SC", "-ebs", "ebs,x=1", "a" * 254, "ebs.", ""]),
    (("clusters", 0, "curvine", "worker", "size"), ["100G", "100gi", "-1Gi", "100Gi,x=1", 100]),
    (("clusters", 0, "curvine", "master", "replicas"), [2, 0, 9]),
    (("clusters", 0, "curvine", "fs_path"), ["/l2/../x", "l2cache"]),
    (("clusters", 1, "ebs_storage_class"), ["EBS", "ebs_sc", "-x"]),
    (("endpoints", 0, "replicas"), [-1, 1001, "2", 2.5, True]),
    (("endpoints", 0, "replicas"), [4, 50]),  # GPU overcommit on c1 (4 single-GPU nodes, 1 used by rag)
    (("endpoints", 2, "replicas"), [7, 9]),  # GPU overcommit on c2 (2 × 4 GPUs, 2 used by the other endpoint)
    (("endpoints", 0, "routing"), ["prefix-aware", "fast", None, 7]),
    (("endpoints", 0, "name"), ["Chat", "chat_1", "-chat", "x" * 64, "", "retaіl"]),
    (("endpoints", 0, "namespace"), ["Retail", "support"]),  # "support": chat in two namespaces on... c1? no: see below
    (("endpoints", 0, "image"), ["img/UPPER:1", "img:", "a b", "-img", "img@sha256:zz", "img:" + "t" * 129]),
    (("endpoints", 0, "model_id"), ["a/b/c", "-x/y", "x--y/z", "x/y..z", "a" * 97]),
    (("endpoints", 0, "model"), ["qwen2.7b", "-q", "q" * 64]),
    (("endpoints", 0, "instance_type"), ["ml.g6e.12xlarge", "g5"]),  # not the cluster's GPU node type
    (("endpoints", 0, "lob"), ["ghost"]),
    (("endpoints", 0, "cluster"), ["c9"]),
    (("endpoints", 1, "env"), [{"1BAD": "x"}, {"A-B": "x"}, {"A.B": "x"}, {"PYTHONHASHSEED": "random"},
                               {"LMCACHE_REMOTE_URL": "fs://x/"}, {"OK": {"nested": 1}}, {"OK": True},
                               {"": "x"}, {"É": "x"}, ["A=1"]]),
    (("lobs", 0, "description"), [{"a": 1}, ["x"]]),
    (("lobs", 1, "remediate_drift"), ["yes", 1]),
]

# Values of every type, swapped into a random leaf: the result may be valid (a string into a description).
SWAPS: list[Any] = [True, False, None, 0, -1, 3.5, float("inf"), 2**70, "x", "", "🙂" * 3, "a" * 300, [], {},
                    [1, [2, [3]]], {"k": {"k": "v"}}, "\u202eevil", "null", "0x1F"]


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, (*path, k)) or [(*path, k)]
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, (*path, i)) or [(*path, i)]
    return out


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    node: Any = doc
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[path[-1]] = value


def _dump(doc: Any) -> str:
    return str(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False, width=10_000))


def _field_word(path: tuple[Any, ...]) -> str:
    return next(str(p) for p in reversed(path) if isinstance(p, str))


def inventory_case(seed: int) -> tuple[str, str, str, str | None]:  # noqa: C901 (one branch per kind)
    """One hostile inventory from ``seed``: (case id, text, expect, field the refusal must name)."""
    rng = random.Random(seed)
    doc = copy.deepcopy(BASE)
    kind = rng.choice(["bad", "bad", "bad", "swap", "swap", "dup", "unknown", "structure", "yaml", "unicode"])
    if kind == "bad":
        path, values = rng.choice(BAD_VALUES)
        value = rng.choice(values)
        if path == ("endpoints", 0, "namespace") and value == "support":
            path = ("endpoints", 3, "cluster")
            value = "c1"  # chat/retail and chat/support on c1: one endpointName in two namespaces
            _set(doc, ("endpoints", 3, "instance_type"), "ml.g5.4xlarge")
            _set(doc, ("endpoints", 3, "replicas"), 1)
            return f"bad:{seed}:endpointName", _dump(_with(doc, path, value)), "refuse", "name"
        return f"bad:{seed}:{'.'.join(map(str, path))}", _dump(_with(doc, path, value)), "refuse", _field_word(path)
    if kind == "swap":
        path = rng.choice(_leaves(doc))
        return f"swap:{seed}:{'.'.join(map(str, path))}", _dump(_with(doc, path, rng.choice(SWAPS))), "any", \
            _field_word(path)
    if kind == "dup":
        which = rng.choice(["lob", "cluster", "key", "endpoint", "nested-key"])
        if which == "lob":
            doc["lobs"].append(dict(doc["lobs"][0]))
            return f"dup:{seed}:lob", _dump(doc), "refuse", "retail"
        if which == "cluster":
            doc["clusters"].append(copy.deepcopy(doc["clusters"][1]))
            return f"dup:{seed}:cluster", _dump(doc), "refuse", "c2"
        if which == "endpoint":
            doc["endpoints"].append(dict(doc["endpoints"][1], replicas=0))
            return f"dup:{seed}:endpoint", _dump(doc), "refuse", "duplicate"
        text = _dump(doc)
        if which == "key":
            return f"dup:{seed}:key", text + "settings: {wave_size: 4}\n", "refuse", "duplicate key"
        text = text.replace("  wave_size: 3\n", "  wave_size: 3\n  wave_size: 9\n", 1)
        return f"dup:{seed}:nested-key", text, "refuse", "duplicate key"
    if kind == "unknown":
        path = rng.choice([p for p in _leaves(doc) if isinstance(p[-1], str) and p[0] != "settings"
                           and "env" not in p])  # env is a free mapping: any valid name is a valid key
        _set(doc, (*path[:-1], rng.choice(["replica", "Name", "gpu", "__class__", "ñ"])), 1)
        return f"unknown:{seed}:{'.'.join(map(str, path[:-1]))}", _dump(doc), "refuse", "unknown field"
    if kind == "structure":
        which = rng.choice(["deep", "wide", "long", "toplist", "scalar", "empty", "bigint", "many-eps"])
        if which == "deep":
            n = rng.choice([49, 60, 500, 5000])
            return f"structure:{seed}:deep{n}", _dump(doc) + "x: " + "[" * n + "]" * n + "\n", "refuse", None
        if which == "wide":
            n = rng.choice([1000, 5000, 20000])
            return f"structure:{seed}:wide{n}", _dump(doc) + "x: [" + ",".join(["1"] * n) + "]\n", "refuse", None
        if which == "long":
            n = rng.choice([300, 70_000, 300_000])
            _set(doc, ("lobs", 0, "description"), "d" * n)
            return f"structure:{seed}:long{n}", _dump(doc), "any" if n < 1000 else "refuse", \
                "description" if n < 65536 else None
        if which == "toplist":
            return f"structure:{seed}:toplist", "- a\n- b\n", "refuse", "top level"
        if which == "scalar":
            return f"structure:{seed}:scalar", rng.choice(["42\n", "'text'\n", "~\n", "\n"]), "refuse", None
        if which == "empty":
            return f"structure:{seed}:empty", "", "refuse", "clusters"
        if which == "bigint":
            n = rng.choice([30, 5000, 20000])
            return f"structure:{seed}:bigint{n}", _dump(doc).replace("wave_size: 3", "wave_size: " + "9" * n), \
                "refuse", None
        n = rng.choice([40, 200])
        doc["endpoints"] = [dict(doc["endpoints"][0], name=f"e{i}", replicas=0) for i in range(n)]
        return f"structure:{seed}:endpoints{n}", _dump(doc), "any", None
    if kind == "yaml":
        which = rng.choice(["bomb", "bomb-env", "recursive", "python-tag", "binary", "set", "timestamp", "merge",
                            "nan", "anchor-ok", "garbled", "tab", "nul", "bom"])
        text = _dump(doc)
        if which in ("bomb", "bomb-env"):
            levels = rng.choice([6, 9, 12])
            lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
            lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
            head = "\n".join("# " + ln if False else ln for ln in lines)
            target = "wave_size: 3" if which == "bomb" else "env: {VLLM_LOG: '1'}"
            body = text.replace(target, target.split(":")[0] + f": *a{levels - 1}", 1)
            body = body.replace("env:\n      VLLM_LOG: '1'", f"env: *a{levels - 1}", 1)
            return f"yaml:{seed}:{which}{levels}", "x_anchors:\n" + _indent(head) + "\n" + body, "refuse", None
        if which == "recursive":
            return f"yaml:{seed}:recursive", text + "x: &r [*r]\n", "refuse", None
        if which == "python-tag":
            return f"yaml:{seed}:python-tag", text.replace("hash_seed: '0'", "hash_seed: !!python/object/apply:os.getpid []"), \
                "refuse", None
        if which == "binary":
            return f"yaml:{seed}:binary", text.replace("hash_seed: '0'", "hash_seed: !!binary aGVsbG8="), \
                "refuse", "hash_seed"
        if which == "set":
            return f"yaml:{seed}:set", text.replace("env:\n", "env: !!set {A: null}\n  x_:\n", 1), "refuse", None
        if which == "timestamp":
            return f"yaml:{seed}:timestamp", text.replace("hash_seed: '0'", "hash_seed: 2001-12-14"), "refuse", \
                "hash_seed"
        if which == "merge":
            merged = "x_base: &b {wave_size: 3}\nsettings:\n  <<: *b\n  hash_seed: '0'\n"
            rest = text.split("lobs:", 1)[1]
            return f"yaml:{seed}:merge", merged + "lobs:" + rest, "refuse", "x_base"
        if which == "nan":
            return f"yaml:{seed}:nan", text.replace("wave_size: 3", "wave_size: .nan"), "refuse", "wave_size"
        if which == "anchor-ok":
            t = text.replace("region: us-east-1", "region: &r us-east-1", 1)
            return f"yaml:{seed}:anchor-ok", t, "any", None
        if which == "garbled":
            cut = rng.randrange(1, len(text))
            return f"yaml:{seed}:garbled{cut}", text[:cut] + rng.choice(["{", "[", ": :", "'", "\"", "&", "*x"]), \
                "any", None
        if which == "tab":
            return f"yaml:{seed}:tab", text.replace("  wave_size", "\twave_size", 1), "refuse", None
        if which == "nul":
            return f"yaml:{seed}:nul", text.replace("shop", "sh\x00op"), "refuse", None
        return f"yaml:{seed}:bom", "\ufeff" + text, "any", None
    # unicode: names and values from outside ASCII
    path = rng.choice([("endpoints", 0, "name"), ("lobs", 0, "name"), ("clusters", 0, "name"),
                       ("endpoints", 0, "namespace"), ("settings", "hash_seed"), ("endpoints", 2, "image")])
    value = rng.choice(["ｃｈａｔ", "chat\u200b", "çhat", "chat\u202e", "𝟘", "١٢", "chat\n"])
    return f"unicode:{seed}:{'.'.join(map(str, path))}", _dump(_with(doc, path, value)), "refuse", _field_word(path)


def _indent(text: str) -> str:
    return "\n".join("  " + line.split(": ", 1)[0] + ": " + line.split(": ", 1)[1] for line in text.splitlines())


def _with(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    _set(doc, path, value)
    return doc


# ------------------------------------------------------------------------------------------------------------
# The independent check: written from the README / docs/reference rules, not from kvfleet's code.
# ------------------------------------------------------------------------------------------------------------

GPUS = {"ml.g5.4xlarge": 1, "ml.g5.12xlarge": 4, "ml.g6e.4xlarge": 1, "ml.g6e.12xlarge": 4, "ml.p5.48xlarge": 8}
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def independent_problems(doc: Any) -> list[str]:  # noqa: C901 (one rule per line)
    """What is wrong with an accepted document, by rules restated here; [] when it is valid."""
    bad: list[str] = []
    doc = _digits(doc)

    def need(ok: bool, what: str) -> None:
        if not ok:
            bad.append(what)

    if not isinstance(doc, dict):
        return ["not a mapping"]
    need(set(doc) <= {"settings", "lobs", "clusters", "endpoints"}, "top-level keys")
    s = doc.get("settings") or {}
    need(isinstance(s, dict), "settings mapping")
    if isinstance(s, dict):
        ws = s.get("wave_size", 3)
        need(type(ws) is int and 1 <= ws <= 500, "wave_size")
        cs = s.get("chunk_size", 256)
        need(type(cs) is int and 16 <= cs <= 4096, "chunk_size")
        seed = s.get("hash_seed", "0")
        seed = str(seed) if type(seed) is int else seed
        need(isinstance(seed, str) and seed.isascii() and seed.isdigit() and int(seed) <= 4294967295, "hash_seed")
    lobs = doc.get("lobs") or []
    lob_names = [x.get("name") for x in lobs if isinstance(x, dict)] if isinstance(lobs, list) else list(lobs)
    need(len(lob_names) == len(set(map(str, lob_names))), "duplicate lob")
    for x in lobs if isinstance(lobs, list) else []:
        need(isinstance(x, dict) and isinstance(x.get("name"), str) and LABEL.fullmatch(x["name"]) is not None,
             "lob name")
        if isinstance(x, dict):
            need(isinstance(x.get("description", ""), str) or type(x.get("description")) is int, "lob description")
            need(type(x.get("remediate_drift", False)) is bool, "remediate_drift")
    clusters = doc.get("clusters") or []
    need(isinstance(clusters, list) and len(clusters) >= 1, "clusters")
    gpus: dict[str, tuple[str, int]] = {}
    for c in clusters if isinstance(clusters, list) else []:
        if not isinstance(c, dict):
            bad.append("cluster mapping")
            continue
        name = c.get("name")
        need(isinstance(name, str) and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", name) is not None,
             "cluster name")
        need(name not in gpus, "duplicate cluster")
        need(isinstance(c.get("region"), str) and re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", c["region"]) is not None,
             "region")
        g = c.get("gpu_nodes") or {}
        count, itype = (g.get("count"), g.get("instance_type")) if isinstance(g, dict) else (None, None)
        need(type(count) is int and 1 <= count <= 10000, "gpu count")
        need(itype in GPUS, "gpu instance type")
        if type(count) is int and itype in GPUS:
            gpus[str(name)] = (itype, count * GPUS[itype])
        ts = c.get("tiered_storage") or {}
        need(isinstance(ts, dict) and ts.get("mode", "Enable") in ("Enable", "Disable"), "tiered mode")
        mp = ts.get("memory_percent", 20) if isinstance(ts, dict) else None
        need(type(mp) is int and 20 <= mp <= 100, "memory_percent")
        need(c.get("l2_injection", "patch") in ("patch", "kyverno"), "l2_injection")
        esc = c.get("ebs_storage_class", "ebs-sc")
        esc = str(esc) if type(esc) is int else esc
        need(isinstance(esc, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", esc) is not None,
             "ebs_storage_class")
        cv = c.get("curvine") or {}
        if isinstance(cv, dict):
            hp = ((cv.get("worker") or {}).get("host_path", "/x"))
            need(isinstance(hp, str) and hp.startswith("/") and ".." not in hp.split("/")
                 and not set(hp) & set(",={}[]\\ "), "host_path")
            ver = cv.get("version", "0.3.2-alpha")
            need(isinstance(ver, str) and re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", ver) is not None,
                 "chart version")
            need(str(cv.get("repo_url", "https://x")).startswith("https://"), "repo_url")
            sc = (cv.get("master") or {}).get("storage_class", "ebs-sc")
            need(isinstance(sc, str) and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", sc) is not None,
                 "storage_class")
            mr = (cv.get("master") or {}).get("replicas", 1)
            need(type(mr) is int and mr in (1, 3, 5, 7), "master replicas")
    used: dict[str, int] = {}
    names: dict[tuple[str, str], str] = {}
    eps = doc.get("endpoints") or []
    for e in eps if isinstance(eps, list) else []:
        if not isinstance(e, dict):
            bad.append("endpoint mapping")
            continue
        for key in ("name", "namespace", "lob", "cluster", "model", "instance_type"):
            need(isinstance(e.get(key, "default" if key == "namespace" else None), str), f"endpoint {key}")
        name, ns, cl = e.get("name"), e.get("namespace", "default"), e.get("cluster")
        need(isinstance(name, str) and LABEL.fullmatch(name) is not None, "endpoint name")
        need(isinstance(ns, str) and LABEL.fullmatch(ns) is not None, "endpoint namespace")
        need(e.get("lob") in lob_names, "endpoint lob")
        need(cl in gpus, "endpoint cluster")
        if cl in gpus:
            need(e.get("instance_type") == gpus[cl][0], "endpoint instance type = node type")
        reps = e.get("replicas", 2)
        need(type(reps) is int and 0 <= reps <= 1000, "replicas")
        if type(reps) is int and isinstance(cl, str):
            used[cl] = used.get(cl, 0) + reps
        ep_key = (str(cl), str(name))
        need(ep_key not in names, "endpointName twice on one cluster")
        names[ep_key] = str(ns)
        need(e.get("routing", "prefixaware") in ("prefixaware", "kvaware", "session", "roundrobin"), "routing")
        need(type(e.get("l1", True)) is bool and type(e.get("l2", True)) is bool, "l1/l2")
        img = e.get("image", "x/y:z")
        need(isinstance(img, str) and re.fullmatch(r"[a-z0-9./:_@-]+", img.split(":")[0] if ":" in img else img)
             is not None and " " not in img, "image")
        env = e.get("env") or {}
        need(isinstance(env, dict), "env mapping")
        for k, v in (env.items() if isinstance(env, dict) else []):
            need(isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) is not None, "env name")
            need(k not in ("PYTHONHASHSEED", "LMCACHE_REMOTE_URL", "LMCACHE_REMOTE_SERDE", "LMCACHE_CHUNK_SIZE"),
                 "reserved env")
            need(isinstance(v, str | int | float) and not isinstance(v, bool), "env value")
    for cl, (_, available) in gpus.items():
        need(used.get(cl, 0) <= available, f"GPU capacity of {cl}")
    return bad


STRING_FIELDS = {"name", "namespace", "lob", "cluster", "model", "instance_type", "image", "model_id", "region",
                 "storage_class", "ebs_storage_class", "description", "hash_seed", "version"}


def _digits(node: Any, key: str = "") -> Any:
    """A whole number in a string field is that number's digits (kvfleet's documented reading of `name: 0`)."""
    if isinstance(node, dict):
        return {k: _digits(v, k if isinstance(k, str) else "") for k, v in node.items()}
    if isinstance(node, list):
        return [_digits(v, key) for v in node]
    if type(node) is int and key in STRING_FIELDS:
        return str(node)
    return node


# ------------------------------------------------------------------------------------------------------------
# Admin API bodies
# ------------------------------------------------------------------------------------------------------------

ADMIN_BAD: list[dict[str, Any]] = [
    {"kind": "l2_read_penalty", "ms": [1]}, {"kind": "l2_read_penalty", "ms": "5"},
    {"kind": "l2_read_penalty", "ms": True}, {"kind": "l2_read_penalty", "ms": -1},
    {"kind": "l2_read_penalty", "ms": 1e308}, {"kind": "l2_read_penalty"},
    {"kind": "lose_node", "node": "no-such-node"}, {"kind": "lose_node", "node": 7},
    {"kind": "lose_node", "node": ["a"]}, {"kind": "lose_node"}, {"kind": "lose_node", "node": ""},
    {"kind": "kill_pod", "namespace": None, "name": "x"}, {"kind": "kill_pod", "namespace": {}, "name": []},
    {"kind": "api_error_rate", "rate": True}, {"kind": "api_error_rate", "rate": 1.5},
    {"kind": "api_error_rate", "rate": "0.5"}, {"kind": "api_error_rate", "rate": None},
    {"kind": "api_error_rate", "rate": 0.5, "target": ["kube"]}, {"kind": "api_error_rate", "rate": 2**80},
    {"kind": "api_latency", "seconds": 61}, {"kind": "api_latency", "seconds": False},
    {"kind": "api_latency", "seconds": 1, "extra": 1}, {"kind": 5}, {"kind": None}, {"kind": "nope"},
    {"kind": ["clear"]}, {}, {"kind": "clear", "cluster": 3}, {"kind": "clear", "cluster": "ghost"},
    {"kind": "lose_node", "node": "x", "cluster": "*"},
]


def admin_case(seed: int, cluster: str) -> tuple[str, Any]:
    """One hostile ``POST /fault`` body (a JSON value, not always an object) from ``seed``."""
    rng = random.Random(seed)
    body: Any = copy.deepcopy(rng.choice(ADMIN_BAD))
    roll = rng.random()
    if isinstance(body, dict) and "cluster" not in body:
        body["cluster"] = cluster
    if roll < 0.1:
        body = rng.choice([[body], "text", 1, None, True, [[[]]]])
    elif roll < 0.2 and isinstance(body, dict):
        # values of the wrong type or range for every one of these fields (0 or 3.5 would be a valid ms)
        body[rng.choice(["ms", "rate", "node", "kind"])] = rng.choice(
            [True, False, None, "", [], {}, [1, [2]], 2**70, -1, float("nan"), float("inf")])
    return f"admin:{seed}", body
