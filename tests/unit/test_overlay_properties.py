"""Property tests of the one L2 overlay value: over generated live Deployments,
``violations(apply(patch(x))) == []`` and ``patch(x) == []`` exactly when ``violations(x) == []``.

hypothesis is not in the venv, so the generator is hand-rolled and seeded (every case is reproducible from its
seed, printed on failure). The patch is applied by a small RFC 6902 applier written here (jsonpatch is not in the
venv either), independent of the code under test: it fails on a path that does not exist and on a failed
``test`` op, as the API server does.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from kvfleet.fleet import constants as C
from kvfleet.fleet import overlay as ov
from kvfleet.fleet.endpoint_spec import l2_patch, l2_violations
from kvfleet.fleet.inventory import Endpoint, Settings

S = Settings()
EP = Endpoint(name="chat", namespace="retail", lob="retail", cluster="c", model="qwen2-7b",
              instance_type="ml.g6e.4xlarge")
OVERLAY = ov.desired_overlay(EP, S)
CASES = 600


# ---- an RFC 6902 applier ---------------------------------------------------------------------------------------


class PatchFailed(Exception):
    pass


def _token(raw: str) -> str:
    return raw.replace("~1", "/").replace("~0", "~")


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    parts = [_token(p) for p in path.split("/")[1:]]
    node = doc
    for p in parts[:-1]:
        if isinstance(node, list):
            if not p.isdigit() or int(p) >= len(node):
                raise PatchFailed(f"no {p} in {path}")
            node = node[int(p)]
        elif isinstance(node, dict) and p in node:
            node = node[p]
        else:
            raise PatchFailed(f"no {p} in {path}")
    return node, parts[-1]


def _get(parent: Any, key: str, path: str) -> Any:
    if isinstance(parent, list):
        if not key.isdigit() or int(key) >= len(parent):
            raise PatchFailed(f"no item at {path}")
        return parent[int(key)]
    if not isinstance(parent, dict) or key not in parent:
        raise PatchFailed(f"no member at {path}")
    return parent[key]


def _add(parent: Any, key: str, value: Any, path: str) -> None:
    if isinstance(parent, list):
        if key == "-":
            parent.append(value)
        elif key.isdigit() and int(key) <= len(parent):
            parent.insert(int(key), value)
        else:
            raise PatchFailed(f"bad index {path}")
    elif isinstance(parent, dict):
        parent[key] = value
    else:
        raise PatchFailed(f"no container at {path}")


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for op in ops:
        parent, key = _parent(doc, op["path"])
        if op["op"] == "test":
            if _get(parent, key, op["path"]) != op["value"]:
                raise PatchFailed(f"test failed at {op['path']}")
        elif op["op"] == "remove":
            _get(parent, key, op["path"])
            del parent[int(key) if isinstance(parent, list) else key]
        elif op["op"] == "replace":
            _get(parent, key, op["path"])
            parent[int(key) if isinstance(parent, list) else key] = copy.deepcopy(op["value"])
        elif op["op"] == "add":
            _add(parent, key, copy.deepcopy(op["value"]), op["path"])
        else:
            raise PatchFailed(f"unsupported op {op['op']}")
    return doc


# ---- the generator ---------------------------------------------------------------------------------------------

OPERATOR_ENV: list[dict[str, Any]] = [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "LMCACHE_USE_EXPERIMENTAL", "value": "True"}, {"name": C.ENV_LOCAL_CPU, "value": "True"},
                {"name": C.ENV_MAX_LOCAL_CPU_SIZE, "value": "20"}, {"name": C.ENV_CHUNK_SIZE, "value": "256"}]


def _url_entries(rng: random.Random, good: bool) -> list[dict[str, Any]]:
    choice = "ours" if good else rng.choice(["operator", "ours", "none", "wrong", "dup_operator_first", "dup_ours_first", "dup3",
                         "valuefrom"])
    options: dict[str, list[dict[str, Any]]]
    ours, theirs = {"name": C.ENV_REMOTE_URL, "value": S.l2_url}, {"name": C.ENV_REMOTE_URL,
                                                                   "value": C.OPERATOR_L2_URL}
    wrong = {"name": C.ENV_REMOTE_URL, "value": "fs://localhost:0/mnt/other/"}
    options = {"operator": [theirs], "ours": [ours], "none": [], "wrong": [wrong],
            "dup_operator_first": [theirs, ours], "dup_ours_first": [ours, theirs], "dup3": [ours, wrong, ours],
            "valuefrom": [{"name": C.ENV_REMOTE_URL, "valueFrom": {"configMapKeyRef": {"name": "x", "key": "u"}}}],
            }
    return options[choice]


def _entry(rng: random.Random, name: str, good: str, bad: str, ok: bool) -> list[dict[str, Any]]:
    if ok:
        return rng.choice([[{"name": name, "value": good}],
                           [{"name": name, "value": bad}, {"name": name, "value": good}]])  # the last wins
    return rng.choice([[{"name": name, "value": good}], [], [{"name": name, "value": bad}],
                       [{"name": name, "value": bad}, {"name": name, "value": good}],
                       [{"name": name, "value": good}, {"name": name, "value": bad}]])


def _env(rng: random.Random, good: bool) -> list[dict[str, Any]] | None:
    env: list[dict[str, Any]] = [copy.deepcopy(e) for e in OPERATOR_ENV if rng.random() < 0.8]
    env += _url_entries(rng, good)
    env += _entry(rng, C.ENV_REMOTE_SERDE, S.serde, "cachegen", good)
    env += _entry(rng, C.ENV_HASHSEED, S.hash_seed, "1", good)
    rng.shuffle(env)  # the env in any order
    return None if not env and rng.random() < 0.5 else env


def _volumes(rng: random.Random, good: bool) -> list[dict[str, Any]] | None:
    vols: list[dict[str, Any]] = [{"name": "model-weights", "emptyDir": {}}] if rng.random() < 0.7 else []
    l2 = "ok" if good else rng.choice(["ok", "absent", "wrong_claim", "read_only", "host_path"])
    vol: dict[str, Any] | None = {"ok": {"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": C.CURVINE_PVC}},
           "wrong_claim": {"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": "someone-elses-pvc"}},
           "read_only": {"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": C.CURVINE_PVC,
                                                                            "readOnly": True}},
           "host_path": {"name": C.L2_VOLUME_NAME, "hostPath": {"path": "/mnt/nvme"}}}.get(l2)
    if vol:
        vols.insert(rng.randint(0, len(vols)), vol)
    return None if not vols and rng.random() < 0.5 else vols


def _mounts(rng: random.Random, good: bool) -> list[dict[str, Any]] | None:
    mounts: list[dict[str, Any]] = [{"name": "model-weights", "mountPath": "/opt/ml/model"}] \
        if rng.random() < 0.7 else []
    l2 = "ok" if good else rng.choice(["ok", "absent", "other_path", "read_only", "other_volume_at_path"])
    choices: dict[str, dict[str, Any]] = {
         "ok": {"name": C.L2_VOLUME_NAME, "mountPath": C.L2_MOUNT_PATH},
         "other_path": {"name": C.L2_VOLUME_NAME, "mountPath": "/data"},
         "read_only": {"name": C.L2_VOLUME_NAME, "mountPath": C.L2_MOUNT_PATH, "readOnly": True},
         "other_volume_at_path": {"name": "model-weights", "mountPath": C.L2_MOUNT_PATH}}
    m = choices.get(l2)
    if m:
        mounts.insert(rng.randint(0, len(mounts)), m)
    return None if not mounts and rng.random() < 0.5 else mounts


def _with(d: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is not None:
        d[key] = value
    return d


def live_deployment(rng: random.Random) -> dict[str, Any]:
    """A live Deployment as the operator renders it, then disturbed: env in any order, duplicate or foreign URL
    entries, wrong seed or serde, the wrong claim, a missing or read-only mount, extra and init containers."""
    good = rng.random() < 0.2  # a converged one now and then, still in any order and with any sidecars
    vllm = _with(_with({"name": EP.name, "image": EP.image}, "env", _env(rng, good)), "volumeMounts",
                 _mounts(rng, good))
    sidecars = [{"name": n, "image": f"{n}:1", "env": [{"name": C.ENV_REMOTE_URL, "value": C.OPERATOR_L2_URL}]}
                for n in ("reverse-proxy", "otel-collector") if rng.random() < 0.5]
    containers = [vllm, *sidecars]
    if rng.random() < 0.3:  # the vLLM container is not always first
        rng.shuffle(containers)
    spec = _with({"containers": containers}, "volumes", _volumes(rng, good))
    if rng.random() < 0.4:
        spec["initContainers"] = [{"name": "model-download", "image": "init:1",
                                   "env": [{"name": C.ENV_HASHSEED, "value": "7"}]}]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": EP.name, "namespace": EP.namespace},
            "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": EP.name}}, "spec": spec}}}


def operator_rendered() -> dict[str, Any]:
    """Exactly what the operator renders before kvfleet: its URL entry, CR env, no volume, no mount."""
    env = [*copy.deepcopy(OPERATOR_ENV), {"name": C.ENV_REMOTE_URL, "value": C.OPERATOR_L2_URL},
           {"name": C.ENV_CHUNK_SIZE, "value": "256"}, {"name": C.ENV_HASHSEED, "value": S.hash_seed},
           {"name": C.ENV_REMOTE_SERDE, "value": S.serde}]
    spec = {"containers": [{"name": EP.name, "image": EP.image, "env": env,
                            "volumeMounts": [{"name": "model-weights", "mountPath": "/opt/ml/model"}]}],
            "volumes": [{"name": "model-weights", "emptyDir": {}}]}
    return {"metadata": {"name": EP.name}, "spec": {"template": {"spec": spec}}}


def _template(dep: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


# ---- the properties --------------------------------------------------------------------------------------------


def _check(dep: dict[str, Any], seed: object) -> list[dict[str, Any]]:
    found = ov.violations(OVERLAY, _template(dep))
    ops = ov.json_patch(OVERLAY, dep)
    assert (ops == []) == (found == []), f"seed {seed}: violations {found} but patch {ops}"
    fixed = apply_patch(dep, ops)
    assert ov.violations(OVERLAY, _template(fixed)) == [], f"seed {seed}: still wrong after {ops}"
    assert ov.json_patch(OVERLAY, fixed) == [], f"seed {seed}: not idempotent"
    before, after = _template(dep), _template(fixed)
    assert before.get("initContainers") == after.get("initContainers"), f"seed {seed}: init containers touched"
    assert [c for c in before["containers"] if c["name"] != EP.name] == \
        [c for c in after["containers"] if c["name"] != EP.name], f"seed {seed}: another container touched"
    return ops


def test_the_patch_fixes_every_generated_deployment_and_is_empty_exactly_when_nothing_is_wrong() -> None:
    seen_clean = seen_dirty = 0
    for seed in range(CASES):
        dep = live_deployment(random.Random(seed))
        ops = _check(dep, seed)
        seen_clean += not ops
        seen_dirty += bool(ops)
    assert seen_clean >= CASES // 10 and seen_dirty >= CASES // 2  # the generator reaches both sides of the property


def test_an_operator_rendered_deployment_gets_the_whole_overlay() -> None:
    dep = operator_rendered()
    kinds = {v.kind for v in ov.violations(OVERLAY, _template(dep))}
    assert kinds == {"operator_l2_url", "patch_lost_to_reconcile"}
    fixed = apply_patch(dep, _check(dep, "operator"))
    vllm = _template(fixed)["containers"][0]
    assert [e["value"] for e in vllm["env"] if e["name"] == C.ENV_REMOTE_URL] == [S.l2_url]
    assert {"name": C.L2_VOLUME_NAME, "mountPath": C.L2_MOUNT_PATH} in vllm["volumeMounts"]


def test_the_wrong_claim_is_flagged_and_patched_the_reproduced_bug() -> None:
    """An L2 volume pointing at the wrong claim was flagged by l2_violations, but l2_patch returned no
    operation, so patch_wave paused the operator, scaled to 0, applied nothing and raised."""
    dep = apply_patch(operator_rendered(), l2_patch(operator_rendered(), S))
    _template(dep)["volumes"][1]["persistentVolumeClaim"]["claimName"] = "someone-elses-pvc"
    assert [v.field for v in l2_violations(_template(dep), EP.name, S)] == [f"volumes[{C.L2_VOLUME_NAME}]"]
    ops = l2_patch(dep, S)
    assert {"op": "replace", "path": "/spec/template/spec/volumes/1",
            "value": {"name": C.L2_VOLUME_NAME, "persistentVolumeClaim": {"claimName": C.CURVINE_PVC}}} in ops
    assert l2_violations(_template(apply_patch(dep, ops)), EP.name, S) == []


def test_a_concurrent_rerender_makes_the_patch_fail_instead_of_editing_the_wrong_entry() -> None:
    checked = 0
    for seed in range(100):
        dep = live_deployment(random.Random(seed))
        ops = ov.json_patch(OVERLAY, dep)
        if not any(op["op"] in ("replace", "remove") and "/env/" in op["path"] for op in ops):
            continue
        moved = copy.deepcopy(dep)
        vllm = next(c for c in _template(moved)["containers"] if c["name"] == EP.name)
        vllm["env"].insert(0, {"name": "INSERTED_BY_RERENDER", "value": "1"})
        guards = [op for op in ops if op["op"] == "test" and "/env/" in op["path"]]
        assert guards, f"seed {seed}: an env edit without a test op"
        if all(_get(*_parent(moved, g["path"]), g["path"]) == g["value"] for g in guards):
            continue  # identical neighbours: the shift is invisible (and harmless) here
        checked += 1
        with pytest.raises(PatchFailed):
            apply_patch(moved, ops)
    assert checked >= 30


def test_the_kyverno_mutation_and_the_precheck_are_the_same_value() -> None:
    kyv = ov.kyverno_mutation(ov.overlay_for(ov.KYVERNO_CONTAINER, S))
    (container,) = kyv["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [r.entry for r in OVERLAY.env]
    assert container["volumeMounts"] == [OVERLAY.mount] and kyv["spec"]["template"]["spec"]["volumes"] == [
        OVERLAY.volume]
    assert OVERLAY.agree_env == (C.ENV_REMOTE_URL, C.ENV_REMOTE_SERDE, C.ENV_HASHSEED, C.ENV_CHUNK_SIZE)
