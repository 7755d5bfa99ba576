"""The checks across fields and objects (references, duplicates, GPU capacity, update strategies, model sizes,
webhook targets, host paths under their prefixes), run by ``Inventory``'s model validator on what validated."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from kvfleet.fleet import hardware, models
from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT, ambiguity, candidates
from kvfleet.fleet.inventory.derived import gpu_demand, replica_fit
from kvfleet.fleet.inventory.fields import _unnormal
from kvfleet.fleet.inventory.messages import Found, Loc, yaml_path
from kvfleet.fleet.inventory.vocabulary import (
    ACCOUNT_ID,
    DEFAULT_WORKER_HOST_PATH,
    ROLE_ARN,
    WORKLOAD_ROUTING,
    WORKLOAD_WHY,
    key_text,
    safe_url,
    show,
)

if TYPE_CHECKING:
    from kvfleet.fleet.inventory.schema import Account, Cluster, Endpoint, Lob, Settings

def _as_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # What resolvers also take as IPv4: 2130706433, 0x7f.1, 127.1 (inet_aton's forms)
        if not re.fullmatch(r"[0-9a-fA-FxX.]+", host, re.ASCII) or not any(c.isdigit() for c in host):
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address):
        return _embedded_v4(ip) or ip
    return ip


_V4_IN_V6: Final = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))  # compatible, NAT64


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped ::ffff:a.b.c.d, compatible ::a.b.c.d, NAT64 64:ff9b::a.b.c.d,
    6to4 2002:aabb:ccdd::), which the network may route to that IPv4 address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _V4_IN_V6) and int(ip) > 1:  # :: and ::1 stay themselves
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def webhook_target_problem(url: str, allowed: Iterable[str]) -> str | None:
    """A webhook into the instance metadata service, a link-local, loopback or private address is refused: kvfleet
    posts from the Airflow workers, inside the network. A private range the inventory lists is allowed."""
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return None  # refused already as not an http(s) URL
    if not host.isascii():  # full-width or circled digits, ideographic dots: resolvers fold them to an address
        return (f"{safe_url(url)} has a host name that is not ASCII: write it as ASCII (an IDN in its xn-- form), "
                "so that the address it names can be checked")
    ip = ipaddress.ip_address("127.0.0.1") if host == "localhost" or host.endswith(".localhost") else _as_ip(host)
    if ip is None or (ip.is_global and not ip.is_multicast):
        return None
    if any(ip in ipaddress.ip_network(net, strict=False) for net in allowed):
        return None
    what = ("the instance metadata service" if str(ip) == "169.254.169.254" else "a link-local address"
            if ip.is_link_local else "a loopback address" if ip.is_loopback else "a private or reserved address")
    return (f"{safe_url(url)} points at {what} ({ip}): the Airflow workers would post the fleet's notifications "
            "inside their own network; use a public endpoint, or list its private range (CIDR) in "
            "settings.webhook_private_ranges")


# Text fields the cross checks may read as written when they failed (a reference, a name, a type compared as text);
# a required one is validated with its stand-in, then given back as written (model_copy does not validate).

@dataclass(frozen=True)
class Parts:
    """What of the document validated, item by item (None: an item whose fields failed)."""

    settings: Settings | None
    lobs: list[Lob | None]
    clusters: list[Cluster | None]
    eps: list[Endpoint | None]
    accounts: list[Account | None]


class _Checks:
    """One pass over the normalised document and what of it validated; collects problems and warnings."""

    def __init__(self, data: dict[str, Any], parts: Parts, source: str) -> None:
        self.data, self.source = data, source
        self.found = Found()
        self.raw_lobs, self.raw_clusters, self.raw_eps, self.raw_accounts = (
            _listed(data, k) for k in ("lobs", "clusters", "endpoints", "accounts"))
        self.settings, self.lobs, self.clusters, self.eps = parts.settings, parts.lobs, parts.clusters, parts.eps
        self.accounts = parts.accounts
        self.failed: set[str] = set()  # cluster names whose endpoints are not resolved (see _endpoint_refs)

    def problem(self, loc: Loc, msg: str) -> None:
        self.found.problems.append((loc, msg))

    def warn(self, loc: Loc, msg: str) -> None:
        self.found.warnings.append(f"{self.source}: {yaml_path(loc, self.data)}: {msg}")

    def label(self, i: int) -> str:
        return yaml_path(("endpoints", i), self.data)


def _listed(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def _raw_str(body: Any, key: str, default: str = "") -> str:
    value = body.get(key, default) if isinstance(body, dict) else default
    return value if isinstance(value, str) else str(value) if isinstance(value, int) and not isinstance(
        value, bool) and value.bit_length() <= 64 else ""


def _unique_names(k: _Checks, items: list[Any], loc: Loc, what: str) -> None:
    seen: dict[str, int] = {}
    for i, body in enumerate(items):
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            continue
        if name in seen:
            where = yaml_path((*loc, f"[{seen[name]}]"), k.data)
            k.problem((*loc, f"[{i}]"), f"duplicate {what} {show(name)} (also at {where}); each name may appear "
                      "once — merge the two entries or rename one")
        else:
            seen[name] = i


def _account_checks(k: _Checks) -> None:
    """Accounts named and numbered once, each role in its own account."""
    _unique_names(k, k.raw_accounts, ("accounts",), "account")
    by_name: dict[str, Account] = {}
    first: dict[str, int] = {}
    for ai, acct in enumerate(k.accounts):
        if acct is None:
            continue
        if acct.name == DEFAULT_ACCOUNT or ACCOUNT_ID.fullmatch(acct.name):
            k.problem(("accounts", ai, "name"), f"{show(acct.name)} is what a cluster key says for "
                      f"{'the base identity' if acct.name == DEFAULT_ACCOUNT else 'an account id'}; name the account "
                      "with a word, e.g. retail-prod")
            continue
        by_name.setdefault(acct.name, acct)
        if acct.id in first:
            where = yaml_path(("accounts", first[acct.id]), k.data)
            k.problem(("accounts", ai, "id"), f"{acct.id} is also the id of {where}; declare each account once "
                      "(merge the two entries)")
        first.setdefault(acct.id, ai)
        m = ROLE_ARN.fullmatch(acct.role_arn or "")
        if m and m.group(2) != acct.id:
            k.problem(("accounts", ai, "role_arn"), f"{show(acct.role_arn)} is a role of account {m.group(2)}, not of "
                      f"{acct.id}: kvfleet assumes a role in the account it reaches; use arn:aws:iam::{acct.id}:role/…")
    _account_refs(k, by_name)


def _account_refs(k: _Checks, by_name: dict[str, Account]) -> None:
    """Each cluster's and LOB's account declared, a cluster's reachable; each cluster given its account's id."""
    declared = sorted({n for b in k.raw_accounts if isinstance(b, dict) and isinstance(n := b.get("name"), str)})
    for kind, items in (("lobs", k.lobs), ("clusters", k.clusters)):
        for i, item in enumerate(items):
            name = getattr(item, "account", None)
            if name is None:
                continue
            if name not in declared:
                k.problem((kind, i, "account"), f"{show(name)} is not a declared account; declared: "
                          f"{', '.join(declared[:20]) or 'none'} (add it under accounts, or remove the key for the "
                          "base identity's own account)")
                continue
            acct = by_name.get(name)
            if acct is None and kind == "clusters":  # its account failed: its key is unknown
                k.failed.add(item.name)  # type: ignore[union-attr]
            if acct is not None and kind == "clusters":
                item._account_id = acct.id  # type: ignore[union-attr]
                if not acct.role_arn and not acct.aws_conn_id:
                    k.problem((kind, i, "account"), f"{name}: account {acct.id} has neither role_arn nor "
                              "aws_conn_id, so kvfleet has no way into it; add the role kvfleet assumes there "
                              f"(accounts.{name}.role_arn)")


def _unique_clusters(k: _Checks) -> None:
    """A HyperPod cluster's name is unique within one account and region: two entries with the same all three."""
    seen: dict[tuple[str, str, str], int] = {}
    for i, body in enumerate(k.raw_clusters):
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            continue
        key = (_raw_str(body, "account"), _raw_str(body, "region"), name)
        if key in seen:
            k.failed.add(name)  # which of the two an endpoint is on cannot be told
            where = yaml_path(("clusters", f"[{seen[key]}]"), k.data)
            k.problem(("clusters", f"[{i}]"), f"duplicate cluster {show(name)} (also at {where}); a cluster is "
                      "declared once per account and region — merge the two entries or rename one")
        else:
            seen[key] = i


def _cluster_checks(k: _Checks) -> None:
    prefixes = k.settings.curvine_host_path_prefixes if k.settings else None
    for ci, cl in enumerate(k.clusters):
        body = k.raw_clusters[ci]
        if isinstance(body, dict) and isinstance(body.get("addons"), list):
            _unique_names(k, body["addons"], ("clusters", ci, "addons"), "add-on")
        if cl is None:
            continue
        if cl.l2_injection_asked == "patch" and cl.production:
            k.warn(("clusters", ci, "l2_injection"), "patch on a production cluster: the operator re-renders its "
                   "Deployments (a CR edit, an operator upgrade, a deleted Deployment) and each re-render drops the "
                   "patch until drift notices; the sources recommend a mutating webhook or a Kyverno ClusterPolicy "
                   "for long-lived production. Set l2_injection: kyverno, or remove the key (auto: kyverno on "
                   "production clusters).")
        _worker_count(k, ci, cl)
        hp = cl.curvine.worker.host_path
        if _unnormal(hp.rstrip("/")) and hp != "/":
            k.problem(("clusters", ci, "curvine", "worker", "host_path"), f"{show(hp)} has an empty, '.' or '..' "
                      f"segment; write the directory once, plainly, e.g. {DEFAULT_WORKER_HOST_PATH}")
        elif prefixes and not any(hp.rstrip("/").startswith(p + "/") for p in prefixes):
            k.problem(("clusters", ci, "curvine", "worker", "host_path"), f"{show(hp)} is not a directory below "
                      f"{', '.join(prefixes)} (settings.curvine_host_path_prefixes): a worker mounts this node "
                      f"directory, so it must be one kept for data; use e.g. {DEFAULT_WORKER_HOST_PATH}, or add its "
                      "parent to settings.curvine_host_path_prefixes")


def _worker_count(k: _Checks, ci: int, cl: Cluster) -> None:
    declared, nodes, w = cl.curvine.worker.replicas, cl.gpu_nodes.count, cl.curvine.worker
    if declared is None or declared == nodes:
        return
    text = (f"is below the cluster's {nodes} GPU nodes: pods on the {nodes - declared} nodes without a worker "
            f"write their KV blocks over the network, and L2 holds {w.size} × {declared} instead of × {nodes} (the "
            "sources put a worker on every GPU node)" if declared < nodes else
            f"is above the cluster's {nodes} GPU nodes: with one worker per node the extra {declared - nodes} would "
            "stay Pending")
    k.warn(("clusters", ci, "curvine", "worker", "replicas"), f"{declared} {text}. Remove worker.replicas to follow "
           f"the GPU node count, or set it to {nodes}.")


def _lob_checks(k: _Checks) -> None:
    _unique_names(k, k.raw_lobs, ("lobs",), "line of business")
    allowed = k.settings.webhook_private_ranges if k.settings else None
    for li, lob in enumerate(k.lobs):
        if lob is None or allowed is None or not lob.notify.webhook_url:
            continue
        problem = webhook_target_problem(lob.notify.webhook_url, allowed)
        if problem:
            k.problem(("lobs", li, "notify", "webhook_url"), problem)


def _endpoint_refs(k: _Checks) -> list[int]:
    """References, duplicates and endpoint names, read from the raw document (so an endpoint with a bad field is
    still checked); the indexes of the endpoints that are not duplicates."""
    clusters = sorted({n for b in k.raw_clusters if isinstance(b, dict) and isinstance(n := b.get("name"), str)})
    lobs = sorted({n for b in k.raw_lobs if isinstance(b, dict) and isinstance(n := b.get("name"), str)})
    valid = [c for c in k.clusters if c is not None]
    # A name with a cluster that failed (its fields, its account, or declared twice): its endpoints are not
    # resolved, so that neither a wrong cluster nor a knock-on error is reported.
    failed = k.failed | {n for ci, b in enumerate(k.raw_clusters) if isinstance(b, dict) and isinstance(
        n := b.get("name"), str) and (ci >= len(k.clusters) or k.clusters[ci] is None)}
    keys = sorted(c.key for c in valid)
    shared = Counter(c.name for c in valid)
    lob_account = {lob.name: lob.account for lob in k.lobs if lob is not None}
    seen: dict[tuple[str, str, str], int] = {}
    named: dict[tuple[str, str], tuple[int, str]] = {}
    unique = []
    for i, body in enumerate(k.raw_eps):
        cluster, lob, name = _raw_str(body, "cluster"), _raw_str(body, "lob"), _raw_str(body, "name")
        namespace = _raw_str(body, "namespace", "default")
        left = cluster.split("/")[-1] in failed
        found = candidates(cluster, valid, account=lob_account.get(lob)) if cluster and not left else []
        on = cluster  # the key of the cluster it is on, when the reference resolves (messages quote it as written)
        if i < len(k.eps) and (ep := k.eps[i]) is not None:
            ep._cluster_key = found[0].key if len(found) == 1 else ""  # "": on no cluster
            # Its reference names the cluster by key where the fleet holds the name more than once (Endpoint.ref)
            ep._ref_cluster = found[0].key if len(found) == 1 and shared.get(found[0].name, 0) > 1 else cluster
        if len(found) > 1:
            k.problem(("endpoints", i, "cluster"), f"{ambiguity(cluster, found)} (or give its line of business the "
                      "account: lobs.<name>.account)")
        elif found:
            on = found[0].key
        elif cluster and not left:
            shown = keys if "/" in cluster else clusters
            k.problem(("endpoints", i, "cluster"), f"{show(cluster)} is not a declared cluster; declared: "
                      f"{', '.join(shown[:20]) or 'none'}")
        if lob and lob not in lobs:
            k.problem(("endpoints", i, "lob"), f"{show(lob)} is not a declared line of business; declared: "
                      f"{', '.join(lobs[:20]) or 'none'}")
        key = (on, namespace, name)
        if key in seen:
            k.problem(("endpoints", f"[{i}]({key_text(name)})" if name else f"[{i}]"),
                      f"duplicate endpoint {namespace}/{name} on cluster {cluster} (also at {k.label(seen[key])}); "
                      "rename one or move it to another namespace")
            continue
        seen[key] = i
        unique.append(i)
        other = named.get((on, name))
        if other is not None and name:
            # The CR's spec.endpointName is the name, and names a SageMaker endpoint: unique per AWS account and
            # region (docs/reference/hyperpod.md), and one cluster is one account and region.
            k.problem(("endpoints", i, "name"), f"{show(name)} is also the endpoint at {k.label(other[0])} (namespace "
                      f"{other[1]}) on cluster {cluster}; kvfleet sets the CR's endpointName to the name, and that "
                      "names a SageMaker endpoint, unique per AWS account and region (the CRD: \"Name of a SageMaker "
                      "endpoint to be created\"), so two namespaces cannot both use it; rename one")
        else:
            named[(on, name)] = (i, namespace)
    return unique


def _endpoint_checks(k: _Checks, unique: list[int]) -> None:
    by_key = {c.key: c for c in k.clusters if c is not None}
    for i in unique:
        ep = k.eps[i] if i < len(k.eps) else None
        if ep is None:
            continue
        cl = by_key.get(ep._cluster_key or "")
        if cl and ep.instance_type != cl.gpu_nodes.instance_type and ep.instance_type.startswith("ml.") \
                and cl.gpu_nodes.instance_type.startswith("ml."):
            want = cl.gpu_nodes.instance_type
            k.problem(("endpoints", i, "instance_type"), f"{show(ep.instance_type)} but cluster {ep.cluster}'s GPU "
                      f"nodes are {want} (gpu_nodes.instance_type): the operator schedules a replica only on nodes "
                      f"of its instanceType, so none would start; use {want}")
        _model_checks(k, i, ep, k.raw_eps[i])
        _routing_advice(k, i, ep)
        if cl and ep.l2 and cl.gpu_nodes.count < 2:
            # A warning: L2 still serves one pod's restarts, but cross-node reuse cannot exist.
            k.warn(("endpoints", i, "l2"), f"true on cluster {ep.cluster} with {cl.gpu_nodes.count} GPU node; "
                   "cross-node reuse needs at least 2 nodes, so verification will be 'unverifiable'. Add a node or "
                   "set l2: false.")
        asked = ep.update_strategy or (cl.update_strategy if cl else None) or "auto"
        if asked == "rolling" and ep.replicas < 2:
            where = "" if ep.update_strategy else f" (from clusters.{ep.cluster}.update_strategy)"
            k.problem(("endpoints", i, "update_strategy"), f"rolling{where} with replicas {ep.replicas}: a rolling "
                      "update keeps N-1 replicas serving, which is 0 here; set update_strategy: surge (needs a "
                      "spare GPU) or scale-to-zero on this endpoint, or raise replicas to 2")


def _model_checks(k: _Checks, i: int, ep: Endpoint, body: Any) -> None:
    by_name, by_id = models.lookup(ep.model), models.lookup(ep.model_id)
    loc: Loc = ("endpoints", i, "model")
    if by_name and by_id and by_name is not by_id and ep.model_params_b is None:
        id_where = "model_id" if isinstance(body, dict) and "model_id" in body else "model_id (the default)"
        k.warn(loc, f"{show(ep.model)} is the catalogue's {by_name.hf_id}, but {id_where} {show(ep.model_id)} is what "
               f"the operator downloads ({by_id.hf_id}); the GPU memory check uses {by_name.key}. Set model_id: "
               f"{by_name.hf_id} if that is the model served.")
    size = ep.size
    if ep.model_params_b is not None and size.dtype is None:
        k.problem(("endpoints", i, "dtype"), f"is required with model_params_b (the bytes per parameter); add one of "
                  f"{', '.join(models.DTYPES)}, e.g. dtype: bf16")
        return
    if size.params_b is None:
        k.warn(loc, f"{show(ep.model)} (model_id {show(ep.model_id)}) is not in kvfleet's model catalogue "
               f"({', '.join(models.known_names())}), so whether it fits the GPUs of one replica is not checked; add "
               "model_params_b (billions) and dtype to the endpoint.")
        return
    f = replica_fit(ep.instance_type, size.params_b, size.dtype)
    if f is None or f.fits:
        return
    what = (f"{size.catalogue_model} ({size.params_b:g} B parameters, {size.dtype}, catalogue)" if size.catalogue_model
            else f"a {size.params_b:g} B-parameter model in {size.dtype}")
    bigger = [t for t in hardware.known_types() if (s := hardware.gpu_shape(t)) and
              models.fit(size.params_b, size.dtype or "bf16", s, hardware.GPUS_PER_REPLICA).fits]
    families = sorted({t.split(".")[1] for t in bigger})
    k.problem(("endpoints", i, "model_params_b" if size.catalogue_model is None else "model"),
              f"{what} needs {f.weights_gib:.1f} GiB ({f.weights_gib * models.GIB / 1e9:.1f} GB) of GPU memory for "
              f"its weights alone, but one replica on {ep.instance_type} gets {f.describe()} and vLLM uses "
              f"{models.VLLM_GPU_MEMORY_UTILIZATION:g} of it ({f.usable_gib:.1f} GiB), leaving no room for the KV "
              f"cache (kvfleet asks {hardware.GPUS_PER_REPLICA} GPU per replica); use an instance type whose GPU "
              "holds it" + (f" ({', '.join(families)})" if families else "") + ", a smaller model, or a smaller dtype")


def _routing_advice(k: _Checks, i: int, ep: Endpoint) -> None:
    """Warn when the routing strategy contradicts what the sources advise for the endpoint's workload."""
    if ep.workload is None or ep.routing in WORKLOAD_ROUTING[ep.workload]:
        return
    advised = WORKLOAD_ROUTING[ep.workload]
    k.warn(("endpoints", i, "routing"), f"{ep.routing} for workload {ep.workload}; the sources advise "
           f"{WORKLOAD_WHY[ep.workload]}. Set routing: {advised[0]}"
           + (f" (or {' or '.join(advised[1:])})" if len(advised) > 1 else "")
           + ", or change workload if it does not describe the traffic. Note that the operator refuses a change of "
           "routing on an existing endpoint (intelligentRoutingSpec: \"Adding this configuration to an existing "
           "deployment will be rejected\").")


def _capacity_checks(k: _Checks, unique: list[int]) -> None:
    eps = [ep for i in unique if i < len(k.eps) and (ep := k.eps[i]) is not None]
    for ci, cl in enumerate(k.clusters):
        shape = hardware.gpu_shape(cl.gpu_nodes.instance_type) if cl else None
        if cl is None or shape is None:
            continue
        mine = [e for e in eps if e.on(cl)]
        needed, available = gpu_demand(cl, mine)
        if needed <= available:
            continue
        top = sorted(mine, key=lambda e: -e.replicas)[:5]
        detail = ", ".join(f"{e.namespace}/{e.name} {e.replicas}" for e in top)
        k.problem(("clusters", ci, "gpu_nodes"), f"GPU overcommit: the endpoints need {needed} GPUs ({len(mine)} "
                  f"endpoints, replicas × {hardware.GPUS_PER_REPLICA} GPU each: {detail}"
                  f"{', …' if len(mine) > 5 else ''}) but {cl.gpu_nodes.count} × {cl.gpu_nodes.instance_type} nodes "
                  f"have {available} GPUs ({shape.gpus} {shape.gpu} per node); replicas beyond {available} would "
                  "stay Pending and the rollout end in DeploymentFailed — lower replicas or raise gpu_nodes.count to "
                  f"{-(-needed // shape.gpus)}")


def cross_checks(data: dict[str, Any], parts: Parts, source: str) -> Found:
    """The checks across fields and objects, on what validated (``parts``)."""
    k = _Checks(data, parts, source)
    if not k.raw_clusters:
        k.problem(("clusters",), "no cluster declared; declare at least one")
    _account_checks(k)
    _unique_clusters(k)
    _lob_checks(k)
    _cluster_checks(k)
    unique = _endpoint_refs(k)
    _endpoint_checks(k, unique)
    _capacity_checks(k, unique)
    return k.found
