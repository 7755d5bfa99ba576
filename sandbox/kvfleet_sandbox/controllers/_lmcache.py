"""LMCache as the simulated vLLM pods see it: configuration from the pod's env, chunk keys, where L2 lives, and
the exact log line formats. Private to the vLLM simulation (``controllers/vllm``); pure except for ``resolve_l2``
(which reads the store).

Everything here follows docs/reference/lmcache.md: env names and defaults (#configuration-and-environment-variables),
the fs:// URL and file layout (#fs-connector), the PYTHONHASHSEED-rooted hash chain (#pythonhashseed) and the verbatim
format strings of 0.3.9 and 0.5.6 (#log-formats).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import posixpath
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvfleet.fleet.constants import (
    ENV_CHUNK_SIZE,
    ENV_HASHSEED,
    ENV_LOCAL_CPU,
    ENV_MAX_LOCAL_CPU_SIZE,
    ENV_REMOTE_SERDE,
    ENV_REMOTE_URL,
)
from kvfleet_sandbox.kube.store import KubeStore

VERSIONS = ("0.3.9", "0.5.6")
CURVINE_CSI_DRIVER = "curvine"
# save_unfull_chunk defaults (docs/reference/lmcache.md#configuration-and-environment-variables): True in 0.3.9, False
# in 0.5.6.
SAVE_UNFULL_DEFAULT = {"0.3.9": True, "0.5.6": False}
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# --- configuration --------------------------------------------------------------------------------------------

def container_env(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The env a process in ``container`` sees, resolved like the kubelet does: entries in order, so a
    duplicated name keeps the LAST value; ``$(VAR)`` refers to earlier entries; ``fieldRef`` for the pod fields
    the operator uses (``status.hostIP`` is NODE_IP in its ``sagemaker-hyperpod://$(NODE_IP):9200``)."""
    status = pod.get("status") or {}
    fields = {"status.hostIP": status.get("hostIP", ""), "status.podIP": status.get("podIP", ""),
              "spec.nodeName": (pod.get("spec") or {}).get("nodeName", ""),
              "metadata.name": pod["metadata"].get("name", ""),
              "metadata.namespace": pod["metadata"].get("namespace", "")}
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = entry.get("name")
        if not name:
            continue
        if "value" in entry:
            env[name] = _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(entry.get("value") or ""))
        else:
            ref = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            env[name] = str(fields.get(ref, ""))
    return env


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("true", "1", "yes", "on")


def _float(value: str | None, default: float) -> float:
    try:
        return float(value) if value is not None else default
    except ValueError:
        return default


@dataclass(frozen=True)
class LmcacheConfig:
    """The keys of LMCache's config that the simulation honours, read from ``LMCACHE_<KEY>`` env vars."""

    version: str
    chunk_size: int = 256
    remote_url: str | None = None
    remote_serde: str = "naive"
    hash_seed: str | None = None  # PYTHONHASHSEED; None or "random" → a random root per process
    local_cpu: bool = True
    max_local_cpu_gb: float = 5.0
    save_unfull_chunk: bool = True

    @classmethod
    def from_env(cls, env: dict[str, str], version: str) -> LmcacheConfig:
        try:
            chunk = int(env.get(ENV_CHUNK_SIZE, "256"))
        except ValueError:
            chunk = 256
        seed = env.get(ENV_HASHSEED)
        return cls(version=version, chunk_size=max(1, chunk), remote_url=env.get(ENV_REMOTE_URL) or None,
                   remote_serde=(env.get(ENV_REMOTE_SERDE) or "naive").strip().lower(),
                   hash_seed=None if seed is None or seed.strip() == "random" else seed.strip(),
                   local_cpu=_bool(env.get(ENV_LOCAL_CPU), True),
                   max_local_cpu_gb=max(0.0, _float(env.get(ENV_MAX_LOCAL_CPU_SIZE), 5.0)),
                   save_unfull_chunk=_bool(env.get("LMCACHE_SAVE_UNFULL_CHUNK"), SAVE_UNFULL_DEFAULT[version]))

    @property
    def scheme(self) -> str | None:
        if not self.remote_url or "://" not in self.remote_url:
            return None
        return self.remote_url.split("://", 1)[0].lower()


# --- keys -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Chunk:
    start: int
    end: int
    key: str  # CacheEngineKey.to_string() of the emulated version
    file_name: str  # the fs connector's file name for that key

    @property
    def tokens(self) -> int:
        return self.end - self.start


def hash_root(seed: str | None, random_bits: int) -> bytes:
    """The root of the chunk-hash chain: from PYTHONHASHSEED when pinned, else the process's own random draw
    (vLLM's ``init_none_hash`` uses ``os.urandom(32)`` then; docs/reference/lmcache.md#pythonhashseed)."""
    if seed is not None:
        return hashlib.sha256(f"PYTHONHASHSEED={seed}".encode()).digest()
    return random_bits.to_bytes(32, "big")


def chunk_keys(tokens: Sequence[str], root: bytes, *, chunk_size: int, model_name: str, dtype: str,
               version: str, world_size: int = 1, worker_id: int = 0) -> list[Chunk]:
    """Chained hashes over ``chunk_size``-token chunks (the last one may be shorter), as LMCache keys them."""
    chunks: list[Chunk] = []
    prev = root
    for start in range(0, len(tokens), chunk_size):
        part = tokens[start:start + chunk_size]
        prev = hashlib.sha256(prev + "\x1f".join(part).encode()).digest()
        chunk_hash = int.from_bytes(prev[:8], "big")
        if version == "0.5.6":
            key = f"{model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"
            file_name = key.replace("/", "-SEP-") + ".data"
        else:
            key = f"vllm@{model_name}@{world_size}@{worker_id}@{chunk_hash:x}@{dtype}"
            file_name = key.replace("/", "-") + ".data"
        chunks.append(Chunk(start, start + len(part), key, file_name))
    return chunks


def storable(chunks: list[Chunk], total: int, config: LmcacheConfig) -> list[Chunk]:
    """The chunks LMCache writes after prefill. A prompt shorter than one chunk writes nothing
    (docs/reference/lmcache.md#chunk-size-and-short-prompts: "LMCache stores a block only past its 256-token
    chunk"); past that, the trailing partial chunk is written only
    with ``save_unfull_chunk`` (0.3.9 default True, which is how the blog's "Stored 1925 out of total 1925"
    arises; 0.5.6 default False, so a 2,000-token prompt stores 1,792)."""
    if total < config.chunk_size:
        return []
    return [c for c in chunks if c.tokens == config.chunk_size or config.save_unfull_chunk]


# --- where L2 lives -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class L2Target:
    """Where this pod's L2 files go. ``kind``: ``curvine`` (the cluster's shared Curvine namespace),
    ``node-local`` (the operator's sagemaker-hyperpod:// daemon on this node), ``pod-private`` (an fs:// path
    that is not on a Curvine mount: the container's own filesystem, lost with the pod), ``none``."""

    kind: str
    directory: str = ""  # absolute path in that store (curvine: a Curvine path) with no trailing slash
    reason: str = ""
    fails_writes: str | None = None  # an error every write raises (cachegen with fs://)

    def path_of(self, chunk: Chunk) -> str:
        return f"{self.directory}/{chunk.file_name}"


def _under(path: str, mount: str) -> str | None:
    """The part of ``path`` below ``mount`` ("" when equal), or None when not under it."""
    path, mount = posixpath.normpath(path), posixpath.normpath(mount)
    if path == mount:
        return ""
    prefix = mount.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else None


def curvine_path_of_pv(pv: dict[str, Any]) -> str | None:
    """The Curvine directory of a PV of the Curvine CSI driver: ``{fs-path}/{pv-name}``
    (docs/reference/curvine.md#pv-path: volume handle ``{cluster-id}@{fs-path}@{pv-name}``); an explicit
    ``curvine-path``/``path`` attribute wins."""
    csi = (pv.get("spec") or {}).get("csi") or {}
    if csi.get("driver") != CURVINE_CSI_DRIVER:
        return None
    attrs = csi.get("volumeAttributes") or {}
    for key in ("curvine-path", "curvinePath", "path"):
        if attrs.get(key):
            return posixpath.normpath("/" + str(attrs[key]).strip("/"))
    pv_name = pv["metadata"]["name"]
    handle = str(csi.get("volumeHandle") or "")
    parts = handle.split("@")
    fs_path = parts[1] if len(parts) == 3 else attrs.get("fs-path")
    if not fs_path:
        return None
    return posixpath.normpath("/" + str(fs_path).strip("/") + "/" + (parts[2] if len(parts) == 3 else pv_name))


def _curvine_dir_for_mount(store: KubeStore, pod: dict[str, Any], mount: dict[str, Any]) -> str | None:
    namespace = pod["metadata"].get("namespace", "default")
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    claim = ((volumes.get(mount.get("name")) or {}).get("persistentVolumeClaim") or {}).get("claimName")
    if not claim:
        return None
    pvc = store.get("", "persistentvolumeclaims", claim, namespace)
    pv_name = ((pvc or {}).get("spec") or {}).get("volumeName")
    if not pv_name or ((pvc or {}).get("status") or {}).get("phase", "Bound") != "Bound":
        return None
    pv = store.get("", "persistentvolumes", pv_name)
    base = curvine_path_of_pv(pv) if pv else None
    if base is None:
        return None
    sub = str(mount.get("subPath") or "").strip("/")
    return f"{base}/{sub}" if sub else base


def _deepest_mount(container: dict[str, Any], url_path: str) -> tuple[int, dict[str, Any], str] | None:
    """The container's volumeMount with the longest mountPath that ``url_path`` lies under: (its length, the
    mount, the rest of the path below it), as the kubelet resolves nested mounts; None if under none."""
    best: tuple[int, dict[str, Any], str] | None = None
    for mount in container.get("volumeMounts") or []:
        rest = _under(url_path, str(mount.get("mountPath", "")))
        if rest is not None and (best is None or len(mount["mountPath"]) > best[0]):
            best = (len(mount["mountPath"]), mount, rest)
    return best


def resolve_l2(store: KubeStore, pod: dict[str, Any], container: dict[str, Any], config: LmcacheConfig) -> L2Target:
    """Follow the pod's URL the way LMCache and the kubelet would: scheme → connector; for fs:// the URL path →
    the container's volumeMount it lies under → PVC → PV → Curvine path (``<fs-path>/pvc-<uid>``) + the rest."""
    scheme = config.scheme
    if scheme is None:
        return L2Target("none", reason="no LMCACHE_REMOTE_URL")
    if scheme == "sagemaker-hyperpod":
        return L2Target("node-local", "/lmcache", reason="sagemaker-hyperpod:// is the node's ai-toolkit daemon")
    if scheme != "fs":
        return L2Target("none", reason=f"remote scheme {scheme}:// is not simulated")
    parsed = urllib.parse.urlparse(config.remote_url or "")
    try:
        port = parsed.port
    except ValueError:
        port = None
    if not parsed.hostname or port is None:  # parse_remote_url asserts both (docs/reference/lmcache.md#fs-connector)
        return L2Target("none", reason=f"Invalid URL {config.remote_url}: missing host or port")
    # Several comma-separated base dirs are allowed; the simulation uses the first.
    url_path = posixpath.normpath("/" + parsed.path.split(",")[0].strip("/"))
    fails = None
    if config.remote_serde == "cachegen":
        fails = "zip() argument 2 is shorter than argument 1 (cachegen serde under the fs connector)"
    best = _deepest_mount(container, url_path)
    if best is not None:
        base = _curvine_dir_for_mount(store, pod, best[1])
        if base is not None:
            directory = posixpath.normpath(f"{base}/{best[2]}") if best[2] else base
            return L2Target("curvine", directory, reason=f"{url_path} is on Curvine volume {best[1].get('name')}",
                            fails_writes=fails)
    return L2Target("pod-private", url_path, fails_writes=fails,
                    reason=f"{url_path} is not under a Curvine volumeMount of the vLLM container")


# --- log lines (docs/reference/lmcache.md#log-formats; tests/conformance/facts/lmcache_vllm_logs.yaml) ------------

# LMCache's CustomFormatter (lmcache/logging.py, identical in 0.3.9.post2 and 0.5.6): the level colour, then
# "[%(asctime)s] LMCache %(levelname)s:" and a reset, the message, then the italic "(%(filename)s:%(lineno)d:%(name)s)".
LEVEL_COLOUR = {"DEBUG": "\x1b[1m", "INFO": "\x1b[32;20m", "WARNING": "\x1b[33;20m", "ERROR": "\x1b[31;20m",
                "CRITICAL": "\x1b[31;1m"}
RESET = "\x1b[0m"
ITALIC = "\x1b[3m"
# Where each line is logged from (file, line of the logger call, logger name), per emulated version.
LOCATIONS = {
    "0.3.9": {"lookup": ("vllm_v1_adapter.py", 1330, "lmcache.integration.vllm.vllm_v1_adapter"),
              "store": ("cache_engine.py", 303, "lmcache.v1.cache_engine"),
              "retrieve": ("cache_engine.py", 531, "lmcache.v1.cache_engine"),
              "fs_error": ("fs_connector.py", 231, "lmcache.v1.storage_backend.connector.fs_connector"),
              "engine": ("cache_engine.py", 100, "lmcache.v1.cache_engine")},
    "0.5.6": {"lookup": ("vllm_v1_adapter.py", 1476, "lmcache.integration.vllm.vllm_v1_adapter"),
              "store": ("cache_engine.py", 588, "lmcache.v1.cache_engine"),
              "retrieve": ("cache_engine.py", 985, "lmcache.v1.cache_engine"),
              "fs_error": ("fs_connector.py", 376, "lmcache.v1.storage_backend.connector.fs_connector"),
              "engine": ("cache_engine.py", 100, "lmcache.v1.cache_engine")},
}
# vLLM's decorate_logs (vllm/utils/system_utils.py _add_prefix): "(<process name> pid=<pid>) " before every line the
# engine-core process writes; without a tty (a container's log) the prefix is not coloured.
ENGINE_PROCESS = "EngineCore_DP0"
_IMAGE_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")


def version_for_image(image: str | None, default: str) -> str:
    """The emulated LMCache log format for a pod's image tag (``lmcache/vllm-openai:v0.3.9`` -> 0.3.9): tags before
    0.5 log the 0.3.9 formats, 0.5 and later the 0.5.6 ones; a tag without a version (``latest``) -> ``default``."""
    tag = (image or "").rsplit("/", 1)[-1]
    tag = tag.split("@", 1)[0].split(":", 1)[1] if ":" in tag else ""
    m = _IMAGE_VERSION.match(tag)
    if not m:
        return default if default in VERSIONS else VERSIONS[0]
    return "0.5.6" if (int(m[1]), int(m[2])) >= (0, 5) else "0.3.9"


def engine_request_id(client_id: str, suffix: str, prompt_index: int | None = 0) -> str:
    """vLLM's engine request id for a client request id: the completion endpoint runs prompt ``i`` as
    ``f"{request_id}-{i}"`` (chat passes ``None``: its one prompt keeps the id), and ``assign_request_id`` appends
    ``-`` and 8 random characters."""
    base = client_id if prompt_index is None else f"{client_id}-{prompt_index}"
    return f"{base}-{suffix[:8]}"


def stamp(when: dt.datetime, level: str, message: str, location: tuple[str, int, str] | None = None,
          pid: int | None = None) -> str:
    """One line as it reaches the container log: vLLM's process prefix (when ``pid``), LMCache's coloured prefix,
    the message, the coloured location suffix."""
    asctime = f"{when.strftime('%Y-%m-%d %H:%M:%S')},{when.microsecond // 1000:03d}"
    filename, lineno, logger = location or ("cache_engine.py", 1, "lmcache.v1.cache_engine")
    process = f"({ENGINE_PROCESS} pid={pid}) " if pid is not None else ""
    return (f"{process}{LEVEL_COLOUR.get(level, '')}[{asctime}] LMCache {level}:{RESET} {message} "
            f"{ITALIC}({filename}:{lineno}:{logger}){RESET}")


# The verbatim format strings, kept as LMCache writes them (logger.info with %-formatting).
LOOKUP_FMT = {
    "0.3.9": "Reqid: %s, Total tokens %d, LMCache hit tokens: %d, need to load: %d",
    "0.5.6": "Reqid: %s, Total tokens %d, Inference Engine computed tokens: %d, LMCache hit tokens: %d, "
             "need to load: %d",
}
STORE_FMT = {
    "0.3.9": "Stored %d out of total %d tokens. size: %.4f gb, cost %.4f ms, throughput: %.4f GB/s; "
             "offload_time: %.4f ms, put_time: %.4f ms",
    "0.5.6": "[req_id=%s] Stored %d out of total %d tokens. size: %.4f GB, cost %.4f ms, throughput: %.4f GB/s; "
             "offload_time: %.4f ms, put_time: %.4f ms",
}
RETRIEVE_FMT = {
    "0.3.9": "Retrieved %d out of %d required tokens (from %d total tokens). size: %.4f gb, cost %.4f ms, "
             "throughput: %.4f GB/s;",
    "0.5.6": "[req_id=%s] Retrieved %d out of %d required tokens (from %d total tokens). size: %.4f gb, "
             "cost %.4f ms, throughput: %.4f GB/s;",
}


def lookup_line(version: str, req_id: str, total: int, computed: int, hits: int, need: int) -> str:
    if version == "0.5.6":  # 0.5.6 logs max(need_to_allocate, 0)
        return LOOKUP_FMT[version] % (req_id, total, computed, hits, max(need, 0))
    return LOOKUP_FMT["0.3.9"] % (req_id, total, hits, need)


def store_line(version: str, req_id: str, stored: int, total: int, gb: float, ms: float, offload_ms: float,
               put_ms: float) -> str:
    throughput = gb / (ms / 1000) if ms > 0 else 0.0
    args = (stored, total, gb, ms, throughput, offload_ms, put_ms)
    if version == "0.5.6":
        return STORE_FMT[version] % (req_id, *args)
    return STORE_FMT["0.3.9"] % args


def retrieve_line(version: str, req_id: str, retrieved: int, required: int, total: int, gb: float,
                  ms: float) -> str:
    throughput = gb / (ms / 1000) if ms > 0 else 0.0
    args = (retrieved, required, total, gb, ms, throughput)
    if version == "0.5.6":
        return RETRIEVE_FMT[version] % (req_id, *args)
    return RETRIEVE_FMT["0.3.9"] % args
