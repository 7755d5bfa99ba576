"""The running sandbox: one AWS emulator, one Kubernetes API per inventory cluster, controllers attached.

Called from ``kvfleet sandbox up`` (through :mod:`kvfleet_sandbox.cli`, in a detached child or in the
foreground), from the demo (``kvfleet_local.demo``, as a process) and from the integration-test fixtures
(``tests/integration/conftest.py``).
It turns an inventory into the fleet a platform team would already have *before* kvfleet touches it:

- per cluster, a :class:`KubeStore` served by a :class:`KubeApiServer` on 127.0.0.1, pre-filled with what a
  fresh HyperPod-on-EKS cluster carries (GPU Nodes named after the HyperPod instances, the EBS StorageClass and
  CSI driver, ``aws-node`` and ``ebs-csi-controller``), an EKS cluster ``<cluster>-eks`` whose endpoint is that
  server, and a HyperPod cluster with one ``gpu-workers`` instance group and *no* tiered storage (stage 1 of
  kvfleet enables it);
- one :class:`AwsEmulator` for all of them, on the sandbox's scaled model clock;
- a :class:`ClusterTwin` per cluster with every module of ``CONTROLLER_MODULES`` attached;
- the admin endpoint (:mod:`kvfleet_sandbox.admin`) for request counters and fault injection from other
  processes;
- ``state_dir/kubeconfig``, ``state_dir/env`` and ``state_dir/ports.json``.

Identities, as on EKS: each API server speaks TLS with a per-sandbox CA (published as the EKS cluster's
``certificateAuthority.data``) and refuses anonymous requests. kvfleet's AWS access key (``exports()``) maps to
the Kubernetes groups of ``k8s/rbac/eks-access-entry.json``, and what that group may do is what
``k8s/rbac/*.yaml`` grants: the bootstrap applies those files as a cluster admin applies the kvfleet-bootstrap
bundle before the first rollout (``_bootstrap_rbac``; the per-namespace RoleBindings of
``endpoint-namespaces.yaml`` are generated for *this* inventory, and ``curvine-rbac.yaml`` is placed in each
cluster's Curvine namespace). The sandbox's own admin (``system:masters``) holds a static token:
``state_dir/kubeconfig``, the controllers (which write to the store directly) and ``eks_token`` for tests.
Without ``k8s/rbac`` (an installed package), kvfleet's identity is mapped to ``system:masters`` and a warning
says RBAC is not enforced.

Product code never imports this module: it reaches the sandbox through the exported environment only.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import logging
import random
import re
import shlex
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from kvfleet.fleet.constants import NODE_RECOVERY_DEFAULT
from kvfleet.fleet.inventory import Cluster, Inventory
from kvfleet_sandbox.admin import AdminServer
from kvfleet_sandbox.aws import AwsEmulator
from kvfleet_sandbox.aws_iam_enforce import attach_kvfleet_policies, policy_files_found
from kvfleet_sandbox.aws_prereqs import account_of, seed_prerequisites
from kvfleet_sandbox.aws_sts import ASSUMED_KEY_PREFIX
from kvfleet_sandbox.controllers import CONTROLLER_MODULES, MODULE_NAMES
from kvfleet_sandbox.fleet_reader import read_fleet
from kvfleet_sandbox.kube import KubeApiServer, KubeStore
from kvfleet_sandbox.kube.auth import Authenticator, UserInfo, presigned_token
from kvfleet_sandbox.kube.tls import TlsMaterial, make_tls
from kvfleet_sandbox.twin import Clock, ClusterTwin, SandboxSettings, gpus_per_instance

log = logging.getLogger(__name__)

GPU_GROUP = "gpu-workers"
EBS_PROVISIONER = "ebs.csi.aws.com"
KUBELET_VERSION = "v1.31.7-eks-473151a"
# The EKS token format (aws-iam-authenticator): "k8s-aws-v1." + base64url(presigned STS GetCallerIdentity URL).
# The emulator checks its shape (kube.auth) and maps the access key; nothing here is a real signature.
TOKEN_PREFIX = "k8s-aws-v1."
KVFLEET_ACCESS_KEY = "sandbox"  # what exports() gives kvfleet as AWS_ACCESS_KEY_ID
ADMIN_ACCESS_KEY = "sandbox-admin"  # EKS-shaped tokens of the sandbox's admin (eks_token)
ADMIN = UserInfo("kubernetes-admin", ("system:masters",))
RBAC_DIR = Path(__file__).resolve().parents[2] / "k8s" / "rbac"
# kvfleet's ClusterPolicy as the bootstrap bundle carries it (rendered for fleet.example.yaml's settings)
KYVERNO_POLICY = Path(__file__).resolve().parents[2] / "k8s" / "kyverno" / "curvine-l2-policy.yaml"
RBAC_GROUP = "rbac.authorization.k8s.io"
CURVINE_RBAC_FILE = "curvine-rbac.yaml"

# vCPUs by size suffix (AWS instance type docs) and GiB of memory per vCPU by family.
_VCPUS = {"xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "12xlarge": 48, "16xlarge": 64,
          "24xlarge": 96, "48xlarge": 192}
_GIB_PER_VCPU = {"g5": 4, "g6": 4, "g6e": 8, "p4d": 12, "p5": 10}


def eks_name_of(cluster: str) -> str:
    return f"{cluster}-eks"


def account_key(account: str) -> str:
    """The static access key (and secret) of an account kvfleet reaches through its own Airflow connection."""
    return f"sandbox-{account}"


class ClusterMap(dict[str, Any]):
    """The sandbox's per-cluster objects (twins, servers) keyed by the cluster's key ``account/region/name``, so two
    accounts' ``ml-prod`` coexist. Looked up by the key, or by a bare name that only one cluster has (what a
    single-account fleet's callers write); a bare name several clusters have is a ``KeyError`` listing their keys."""

    def resolve(self, text: str) -> str:
        if dict.__contains__(self, text):
            return text
        found = [key for key in dict.keys(self) if key.rsplit("/", 1)[-1] == text]
        if len(found) == 1:
            return found[0]
        if found:
            raise KeyError(f"{text!r} names {len(found)} clusters ({', '.join(sorted(found))}); write the "
                           "cluster's key account/region/name")
        raise KeyError(f"no cluster {text!r} in the sandbox; it has {', '.join(self) or 'none'}")

    def __getitem__(self, text: str) -> Any:
        return dict.__getitem__(self, self.resolve(text))

    def __contains__(self, text: object) -> bool:
        try:
            return isinstance(text, str) and bool(self.resolve(text))
        except KeyError:
            return False

    def get(self, text: str, default: Any = None) -> Any:
        try:
            return self[text]
        except KeyError:
            return default

    def label(self, key: str) -> str:
        """How the sandbox names a cluster in its files and answers: the bare name when no other cluster has it
        (single-account fleets read as before), else the key."""
        name = key.rsplit("/", 1)[-1]
        return name if sum(k.rsplit("/", 1)[-1] == name for k in dict.keys(self)) == 1 else key


def eks_token(region: str) -> str:
    """An EKS bearer token of the sandbox's admin (``system:masters``), valid 15 minutes like a real one: for
    tests and tools that talk to the emulator with the Python client."""
    return presigned_token(ADMIN_ACCESS_KEY, region)


@dataclass
class Sandbox:
    """A started sandbox; :meth:`stop` ends everything it started and is safe to call twice."""

    inventory: Inventory  # read from the fleet file, or the one a caller passed in
    settings: SandboxSettings
    state_dir: Path
    clock: Clock
    aws: AwsEmulator
    twins: ClusterMap  # ClusterTwin by cluster key (a unique bare name finds it too)
    servers: ClusterMap  # KubeApiServer by cluster key
    admin: AdminServer
    kubeconfig: Path
    env_file: Path
    ports_file: Path
    tls: TlsMaterial | None = None
    admin_token: str = ""
    rbac_enforced: bool = False
    iam_enforced: bool = False  # kvfleet's AWS calls are authorized by its IAM policies (_attach_iam)

    def twin(self, cluster: str) -> ClusterTwin:
        """The twin of ``cluster``: its key, or a bare name only one cluster has (ambiguous: a KeyError)."""
        twin: ClusterTwin = self.twins[cluster]
        return twin

    def exports(self) -> dict[str, str]:
        """What a process outside the sandbox needs to reach it (see the module docstring of cli.py)."""
        region = self.inventory.clusters[0].region if self.inventory.clusters else "us-east-1"
        conn = {"conn_type": "aws", "login": "sandbox", "password": "sandbox",
                "extra": {"endpoint_url": self.aws.url, "region_name": region}}
        env = {
            "AWS_ENDPOINT_URL": self.aws.url,
            "AWS_ACCESS_KEY_ID": "sandbox",
            "AWS_SECRET_ACCESS_KEY": "sandbox",
            "AWS_DEFAULT_REGION": region,
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn, sort_keys=True),
            **self._account_connections(region),
            "KVFLEET_SANDBOX_ADMIN": self.admin.url,
            "KVFLEET_SANDBOX_STATE": str(self.state_dir),
            "KUBECONFIG": str(self.kubeconfig),
        }
        # Registered by the curvine controller when it serves the stand-in charts; absent until it does.
        repo = next((t.services["chart_repo_url"] for t in self.twins.values() if "chart_repo_url" in t.services),
                    None)
        if repo:
            env["KVFLEET_HELM_REPO_CURVINE"] = str(repo)
            env["KVFLEET_HELM_REPO_KYVERNO"] = str(repo)  # the same repository serves the Kyverno stand-in
            # The stand-in repository is plain http on 127.0.0.1: allowed explicitly, by the same rule as the
            # inventory's allow_insecure_repo (kvfleet refuses an http override without it).
            env["KVFLEET_HELM_REPO_ALLOW_INSECURE"] = "true"
        return env

    def _account_connections(self, region: str) -> dict[str, str]:
        """``AIRFLOW_CONN_<AWS_CONN_ID>`` of each account the inventory reaches through its own connection: the
        shape of ``AIRFLOW_CONN_AWS_DEFAULT``, with that account's static key (``account_key``)."""
        env = {}
        for account in self.inventory.accounts:
            if account.aws_conn_id:
                key = account_key(account.id)
                conn = {"conn_type": "aws", "login": key, "password": key,
                        "extra": {"endpoint_url": self.aws.url, "region_name": region}}
                env[f"AIRFLOW_CONN_{account.aws_conn_id.upper()}"] = json.dumps(conn, sort_keys=True)
        return env

    def ports(self) -> list[int]:
        """Every port the sandbox listens on, including servers controllers registered as ``*_url`` services
        (the curvine chart repository), so ``sandbox down`` can prove all of them closed."""
        ports = [self.aws.port, self.admin.port, *(s.port for s in self.servers.values())]
        for twin in self.twins.values():
            for key, value in twin.services.items():
                url = urlsplit(value) if key.endswith("_url") and isinstance(value, str) else None
                if url is not None and url.hostname in ("127.0.0.1", "localhost") and url.port:
                    ports.append(url.port)
        return sorted({p for p in ports if p})

    def describe(self) -> dict[str, Any]:
        """What ports.json records and ``sandbox status`` / the admin ``GET /clusters`` report."""
        clusters = {}
        for key, twin in self.twins.items():
            hp = self.aws.hyperpod_cluster(twin.name, account=twin.account) or {}
            clusters[self.twins.label(key)] = {
                "key": key,
                "account": twin.account or self.aws.account_id,
                "region": twin.region,
                "eks_name": twin.eks_name,
                "kube_url": self.servers[key].https_url,
                "hyperpod_arn": hp.get("ClusterArn"),
                "instance_type": twin.gpu_instance_type,
                "gpu_nodes": len(twin.gpu_nodes),
                "controllers": [type(c).__module__ for c in twin.controllers],
                "services": sorted(twin.services),
            }
        return {"aws_url": self.aws.url, "admin_url": self.admin.url, "ports": self.ports(),
                "time_scale": self.settings.time_scale, "clusters": clusters, "rbac_enforced": self.rbac_enforced,
                "iam_enforced": self.iam_enforced}

    def write_state_files(self) -> None:
        self.ports_file.write_text(json.dumps(self.describe(), indent=2, sort_keys=True) + "\n")
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.exports().items())]
        self.env_file.write_text("# kvfleet sandbox: source this file\n" + "\n".join(lines) + "\n")

    def stop(self) -> None:
        # AWS first, so its pending transitions are cancelled rather than fired into stopping controllers; then
        # the clock, which wakes every controller and AWS timer sleeping on model time.
        self.aws.stop()
        self.clock.stop()
        for twin in self.twins.values():
            try:
                twin.stop()
            except Exception:  # one broken controller must not leave servers listening
                log.exception("stopping the controllers of %s failed", twin.name)
        self.admin.stop()
        for server in self.servers.values():
            server.stop()


def start_sandbox(
    fleet: str | Path | Inventory,
    state_dir: str | Path,
    settings: SandboxSettings | None = None,
    controllers: tuple[str, ...] | None = None,
) -> Sandbox:
    """Start the twin of ``fleet`` (a fleet YAML path, read by :mod:`kvfleet_sandbox.fleet_reader`, or the product's
    ``Inventory``); on any failure, stop what was started and re-raise."""
    inventory = read_fleet(fleet) if isinstance(fleet, str | Path) else fleet
    settings = settings or SandboxSettings()
    root = Path(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    clock = Clock(settings.time_scale)
    # One delay serves UpdateCluster and the add-on transitions alike; the cluster update is the one stage 1
    # waits on, so its model time is used (60 model s = 1.2 s real at the default scale).
    aws = AwsEmulator(delay_s=settings.cluster_update_delay_s, clock=clock, seed=settings.seed)
    sandbox = Sandbox(inventory, settings, root, clock, aws, ClusterMap(), ClusterMap(), AdminServer(),
                      root / "kubeconfig",
                      root / "env", root / "ports.json", tls=make_tls(),
                      admin_token="sandbox-admin." + uuid.uuid4().hex)
    sandbox.admin.sandbox = sandbox
    try:
        aws.start()
        _seed_accounts(aws, inventory)
        for index, cluster in enumerate(inventory.clusters):
            _start_cluster(sandbox, cluster, index)
        # What `kvfleet preflight` checks a platform team has done (minus what the settings leave missing).
        seed_prerequisites(aws, inventory.clusters, omit=settings.omit_prerequisites)
        _attach_iam(sandbox)
        for cluster in inventory.clusters:  # how controllers/kyverno.py starts on each cluster
            sandbox.twins[cluster.key].services["kyverno_install"] = \
                settings.kyverno if cluster.l2_injection == "kyverno" else "crds"
        for name in controllers if controllers is not None else CONTROLLER_MODULES:
            module = _controller_module(name)
            if module is not None:
                for twin in sandbox.twins.values():
                    twin.controllers.append(module.attach(twin))
        sandbox.admin.start()
        _write_kubeconfig(sandbox)
        _wait_answering(sandbox)
        _wait_system_ready(sandbox)
        _bootstrap_policies(sandbox)
        sandbox.write_state_files()
    except BaseException:
        sandbox.stop()
        raise
    return sandbox


def _controller_module(name: str) -> Any:
    qualified = f"kvfleet_sandbox.controllers.{MODULE_NAMES.get(name, name)}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise
        log.warning("sandbox: controller module %s does not exist yet; skipped", qualified)
        return None


def _kvfleet_access_entry(sandbox: Sandbox, account: str) -> tuple[str, tuple[str, ...]]:
    """(role name, Kubernetes groups) of kvfleet's access entry (k8s/rbac/eks-access-entry.json; without k8s/rbac,
    ``system:masters`` and a warning that RBAC is not enforced). Also sets ``sandbox.rbac_enforced``."""
    role, groups = "kvfleet", ("kvfleet",)
    entry = RBAC_DIR / "eks-access-entry.json"
    if entry.is_file():
        doc = json.loads(entry.read_text())
        role = str(doc.get("principalArn", "")).rsplit("/", 1)[-1] or "kvfleet"
        groups = tuple(doc.get("kubernetesGroups") or ())
    sandbox.rbac_enforced = RBAC_DIR.is_dir() and any(RBAC_DIR.glob("*.yaml"))
    if not sandbox.rbac_enforced:
        log.warning("sandbox: %s not found: kvfleet's identity is mapped to system:masters (RBAC not enforced)",
                    RBAC_DIR)
        groups = ("system:masters",)
    return role, groups


def _authenticator(sandbox: Sandbox, cluster: Cluster) -> Authenticator:
    """Who may call the emulated cluster, as its EKS access entries decide: the sandbox's admin everywhere; in the
    base account, kvfleet's base key with its access entry's groups (or, without k8s/rbac, as an admin); in another
    account, credentials assumed into that account's declared role (the access entry is the role's: any session of
    it, while unexpired), or that account's static key when it is reached through its own connection. Credentials
    of another account map to no access entry: 401, as EKS answers an unmapped principal. The AWS emulator is the
    sandbox's STS endpoint."""
    account = account_of(cluster)
    role, groups = _kvfleet_access_entry(sandbox, account or sandbox.aws.account_id)
    identities = {ADMIN_ACCESS_KEY: ADMIN}
    if account is None:
        arn = f"arn:aws:sts::{sandbox.aws.account_id}:assumed-role/{role}/kvfleet"
        identities[KVFLEET_ACCESS_KEY] = UserInfo(arn, groups)
    declared = next((a for a in sandbox.inventory.accounts if a.id == account), None)
    return Authenticator(identities=identities, static_tokens={sandbox.admin_token: ADMIN},
                         sts_origins={sandbox.aws.url.rstrip("/")},
                         resolve_key=_account_principals(sandbox.aws, account, declared, groups))


def _account_principals(aws: AwsEmulator, account: str | None, declared: Any,
                        groups: tuple[str, ...]) -> Callable[[str], UserInfo | None] | None:
    """The EKS access entries of a cluster in ``account`` other than the base one: its declared role's sessions and
    its static key (``account_key``), each mapped to kvfleet's groups; expired sessions map to nothing."""
    if account is None or declared is None:
        return None
    role_arn, static = declared.role_arn, account_key(account) if declared.aws_conn_id else None

    def resolve(access_key: str) -> UserInfo | None:
        caller = aws.identities.resolve(access_key)
        if caller is None or caller.account != account or caller.expired():
            return None
        if access_key.startswith(ASSUMED_KEY_PREFIX) and role_arn and caller.role_arn == role_arn:
            return UserInfo(caller.arn, groups)
        if static is not None and access_key == static:
            return UserInfo(caller.arn, groups)
        return None

    return resolve


def _seed_accounts(aws: AwsEmulator, inventory: Inventory) -> None:
    """What each declared account holds before kvfleet's first run: the role kvfleet assumes (path and name from
    ``role_arn``), trusting the hub's root for ``sts:AssumeRole`` and ``sts:TagSession`` (with ``sts:ExternalId``
    when the account declares one) and allowing the account's ``session_duration_s``; the static key of an account
    reached through its own connection."""
    import boto3

    for account in inventory.accounts:
        if account.aws_conn_id:
            aws.add_account_key(account_key(account.id), account.id)
        if not account.role_arn:
            continue
        path, _, name = account.role_arn.split(":role", 1)[1].rpartition("/")
        statement: dict[str, Any] = {"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{aws.account_id}:root"},
                                     "Action": ["sts:AssumeRole", "sts:TagSession"]}
        if account.external_id:
            statement["Condition"] = {"StringEquals": {"sts:ExternalId": account.external_id}}
        key = aws.admin_key(account.id)
        iam = boto3.client("iam", endpoint_url=aws.url, region_name="us-east-1", aws_access_key_id=key,
                           aws_secret_access_key=key)
        iam.create_role(RoleName=name, Path=f"{path}/", MaxSessionDuration=max(3600, account.session_duration_s),
                        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [statement]}))


def _attach_iam(sandbox: Sandbox) -> None:
    """kvfleet's IAM policies attached to its principal in each account the fleet uses, as a platform team attaches
    k8s/iam/kvfleet-policy.json (``settings.iam_policies``, a list of files), then enforced by the AWS emulator for
    every caller but the sandbox's administrators (``AwsEmulator.admin_key``). With ``settings.iam_enforced`` False
    nothing is attached or enforced; without the files (an installed package) neither, and a warning says so."""
    files = sandbox.settings.iam_policies
    if not sandbox.settings.iam_enforced:
        return
    if not policy_files_found(files):
        log.warning("sandbox: kvfleet's IAM policy files not found (%s): IAM is not enforced", files or "k8s/iam")
        return
    attach_kvfleet_policies(sandbox.aws, sandbox.inventory, files)
    sandbox.iam_enforced = True


def _bootstrap_rbac(store: KubeStore, inventory: Inventory, cluster: Cluster) -> None:
    """The kvfleet-bootstrap bundle a cluster admin applies before kvfleet's first rollout (k8s/rbac/README.md,
    ``kvfleet bootstrap --print``): cluster.yaml, endpoints.yaml, kyverno-mode.yaml on a kyverno-mode cluster,
    endpoint-namespaces.yaml as tools/render-k8s-manifests.py renders it for this inventory (each namespace with
    its RoleBinding), and curvine-rbac.yaml (the Curvine charts' ServiceAccounts, roles and bindings, which kvfleet
    installs the charts without) in this cluster's Curvine namespace."""
    docs: list[dict[str, Any]] = []
    for path in sorted(RBAC_DIR.glob("*.yaml")):
        if path.name in ("endpoint-namespaces.yaml", CURVINE_RBAC_FILE):
            continue
        if path.name == "kyverno-mode.yaml" and cluster.l2_injection != "kyverno":
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    managed = {"app.kubernetes.io/managed-by": "kvfleet"}
    grants = [(ns, "kvfleet:endpoint-namespace", "kvfleet-endpoint")
              for ns in sorted({e.namespace for e in inventory.endpoints})]
    grants += [(cluster.curvine.namespace, "kvfleet:curvine-namespace", "kvfleet-curvine")]
    for ns, role, binding in grants:
        docs.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": managed}})
        docs.append({"apiVersion": f"{RBAC_GROUP}/v1", "kind": "RoleBinding",
                     "metadata": {"name": binding, "namespace": ns, "labels": managed},
                     "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
                     "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": "kvfleet"}]})
    docs += _curvine_rbac(cluster.curvine.namespace)
    plural = {"Namespace": ("", "namespaces"), "ServiceAccount": ("", "serviceaccounts"), "Role": (RBAC_GROUP, "roles"),
              "ClusterRole": (RBAC_GROUP, "clusterroles"), "RoleBinding": (RBAC_GROUP, "rolebindings"),
              "ClusterRoleBinding": (RBAC_GROUP, "clusterrolebindings")}
    for doc in docs:
        group, resource = plural[doc["kind"]]
        meta = doc["metadata"]
        if store.get(group, resource, meta["name"], meta.get("namespace")) is None:
            store.create(group, resource, doc)


def _bootstrap_policies(sandbox: Sandbox) -> None:
    """The bootstrap bundle's last object on a kyverno-mode cluster: kvfleet's ClusterPolicy
    (k8s/kyverno/curvine-l2-policy.yaml, rendered for fleet.example.yaml's settings; stage 4 patches it to the
    inventory's), created as the admin once Kyverno serves, as the bundle's header says. A cluster that starts
    without Kyverno (``SandboxSettings.kyverno == "chart"``) gets none: the admin applies it after the install."""
    path = KYVERNO_POLICY
    if not sandbox.rbac_enforced or not path.is_file():
        return
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for cluster in sandbox.inventory.clusters:
        store = sandbox.twins[cluster.key].store
        if cluster.l2_injection != "kyverno" or store.get(
                "apiextensions.k8s.io", "customresourcedefinitions", "clusterpolicies.kyverno.io") is None:
            continue
        for doc in docs:
            if store.get("kyverno.io", "clusterpolicies", doc["metadata"]["name"]) is None:
                store.create("kyverno.io", "clusterpolicies", doc)


def _curvine_rbac(namespace: str) -> list[dict[str, Any]]:
    """curvine-rbac.yaml (rendered for the namespace ``curvine``) placed in ``namespace``, as ``kvfleet bootstrap
    --print --cluster`` renders it for a cluster whose Curvine lives elsewhere."""
    path = RBAC_DIR / CURVINE_RBAC_FILE
    if not path.is_file():
        return []
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["namespace"] = namespace
    return docs


def _start_cluster(sandbox: Sandbox, cluster: Cluster, index: int) -> None:
    store = KubeStore(cluster.name)
    account = account_of(cluster)
    server = KubeApiServer(store, "127.0.0.1", 0, tls=sandbox.tls, authenticator=_authenticator(sandbox, cluster))
    if sandbox.rbac_enforced:
        _bootstrap_rbac(store, sandbox.inventory, cluster)
    server.start()
    sandbox.servers[cluster.key] = server
    aws = sandbox.aws
    eks = eks_name_of(cluster.name)
    aws.add_eks_cluster(eks, cluster.region, server.https_url, ca_pem=sandbox.tls.ca_pem if sandbox.tls else None,
                        account=account)
    aws.add_hyperpod_cluster(
        cluster.name,
        cluster.region,
        eks,
        [{"InstanceGroupName": GPU_GROUP, "InstanceType": cluster.gpu_nodes.instance_type,
          "InstanceCount": cluster.gpu_nodes.count}],
        # An inventory that declares no NodeRecovery (None) gets what CreateCluster leaves: Automatic.
        node_recovery=cluster.node_recovery or NODE_RECOVERY_DEFAULT,
        account=account,
        tags=dict(sandbox.settings.hyperpod_tags),
    )
    nodes = [_node(summary, cluster, i) for i, summary in
             enumerate(aws.hyperpod_nodes(cluster.name, account=account))]
    for node in nodes:
        store.create("", "nodes", node)
    _seed_eks_defaults(store, cluster, len(nodes))
    sandbox.twins[cluster.key] = ClusterTwin(
        name=cluster.name,
        eks_name=eks,
        region=cluster.region,
        store=store,
        aws=aws,
        clock=sandbox.clock,
        settings=sandbox.settings,
        gpu_instance_type=cluster.gpu_nodes.instance_type,
        gpu_nodes=[n["metadata"]["name"] for n in nodes],
        rng=random.Random(sandbox.settings.seed + index),
        account=account,
        key=cluster.key,
    )


def _capacity(instance_type: str) -> dict[str, str]:
    family, _, size = instance_type.removeprefix("ml.").partition(".")
    vcpus = _VCPUS.get(size, 8)
    mem_gib = vcpus * _GIB_PER_VCPU.get(family, 4)
    return {"cpu": str(vcpus), "memory": f"{mem_gib * 1024 * 1024}Ki", "pods": "110",
            "ephemeral-storage": "524275692Ki", "nvidia.com/gpu": str(gpus_per_instance(instance_type))}


def _node(summary: dict[str, Any], cluster: Cluster, index: int) -> dict[str, Any]:
    """A Node as HyperPod's EKS orchestration registers it: ``hyperpod-<instance id>``."""
    instance_id = summary["InstanceId"]
    name = f"hyperpod-{instance_id}"
    dns = summary.get("PrivateDnsHostname") or f"{name}.{cluster.region}.compute.internal"
    octets = re.findall(r"\d+", dns.split(".")[0])
    ip = ".".join(octets[:4]) if len(octets) >= 4 else f"10.1.{index // 250}.{index % 250 + 1}"
    zone = f"{cluster.region}{'abc'[index % 3]}"
    capacity = _capacity(cluster.gpu_nodes.instance_type)
    allocatable = dict(capacity, cpu=f"{int(capacity['cpu']) * 1000 - 90}m")
    stamp = summary["LaunchTime"].strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
    ident = hashlib.sha256(instance_id.encode()).hexdigest()
    conditions = [dict(condition, type=t, status="False", reason=f"Kubelet Has No {t}", message="")
                  for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conditions.append(dict(condition, type="Ready", status="True", reason="KubeletReady",
                           message="kubelet is posting ready status"))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": cluster.gpu_nodes.instance_type,
                "topology.kubernetes.io/region": cluster.region,
                "topology.kubernetes.io/zone": zone,
                "sagemaker.amazonaws.com/compute-type": "hyperpod",
                "sagemaker.amazonaws.com/instance-group-name": summary.get("InstanceGroupName", GPU_GROUP),
                "sagemaker.amazonaws.com/node-health-status": "Schedulable",
                "nvidia.com/gpu.present": "true",
            },
        },
        "spec": {"providerID": f"aws:///{zone}/{instance_id}"},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": dns},
                          {"type": "InternalDNS", "address": dns}],
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": KUBELET_VERSION,
                         "containerRuntimeVersion": "containerd://1.7.27", "operatingSystem": "linux",
                         "architecture": "amd64", "osImage": "Amazon Linux 2",
                         "kernelVersion": "5.10.236-227.928.amzn2.x86_64", "machineID": ident[:32],
                         "systemUUID": str(uuid.UUID(ident[:32])), "bootID": str(uuid.UUID(ident[32:]))},
        },
    }


def _seed_eks_defaults(store: KubeStore, cluster: Cluster, node_count: int) -> None:
    """What EKS and the EBS CSI add-on put in a cluster before kvfleet arrives (stage 3 checks for them)."""
    classes = [cluster.ebs_storage_class]
    if cluster.curvine.master.storage_class not in classes:
        classes.append(cluster.curvine.master.storage_class)
    for i, sc in enumerate(classes):
        store.create("storage.k8s.io", "storageclasses", {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": sc, "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true" if i == 0 else "false"}},
            "provisioner": EBS_PROVISIONER, "parameters": {"type": "gp3", "fsType": "ext4"},
            "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": True,
        })
    store.create("storage.k8s.io", "csidrivers", {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": EBS_PROVISIONER},
        "spec": {"attachRequired": True, "podInfoOnMount": False, "fsGroupPolicy": "File",
                 "volumeLifecycleModes": ["Persistent"]},
    })
    store.create("apps", "daemonsets", _workload(
        "DaemonSet", "aws-node", "602401143452.dkr.ecr.us-east-1.amazonaws.com/amazon-k8s-cni:v1.19.2",
        status={"currentNumberScheduled": node_count, "desiredNumberScheduled": node_count,
                "numberAvailable": node_count, "numberReady": node_count, "numberMisscheduled": 0,
                "updatedNumberScheduled": node_count, "observedGeneration": 1}))
    store.create("apps", "deployments", _workload(
        "Deployment", "ebs-csi-controller", "public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver:v1.41.0",
        replicas=2,
        status={"replicas": 2, "readyReplicas": 2, "availableReplicas": 2, "updatedReplicas": 2,
                "observedGeneration": 1,
                "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}]}))


def _workload(
    kind: str, name: str, image: str, *, status: dict[str, Any], replicas: int | None = None
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name, "k8s-app": name}
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"k8s-app": name}},
        "template": {"metadata": {"labels": labels}, "spec": {
            "priorityClassName": "system-node-critical",
            "containers": [{"name": name, "image": image,
                            "resources": {"requests": {"cpu": "25m", "memory": "40Mi"}}}]}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
            "spec": spec, "status": status}


def _write_kubeconfig(sandbox: Sandbox) -> None:
    """One context per cluster, named like the inventory cluster (kubectl --context ml-prod-use1 ...); a name that
    several accounts' clusters have is written as each cluster's key (--context 111111111111/us-east-1/ml-prod)."""
    clusters, users, contexts = [], [], []
    ca = base64.b64encode(sandbox.tls.ca_pem.encode()).decode() if sandbox.tls else None
    for key in sandbox.twins:
        server, name = sandbox.servers[key], sandbox.twins.label(key)
        entry: dict[str, Any] = {"server": server.https_url if ca else server.url}
        if ca:
            entry["certificate-authority-data"] = ca
        clusters.append({"name": name, "cluster": entry})
        users.append({"name": name, "user": {"token": sandbox.admin_token}})
        contexts.append({"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}})
    config = {"apiVersion": "v1", "kind": "Config", "clusters": clusters, "users": users, "contexts": contexts,
              "current-context": contexts[0]["name"] if contexts else "", "preferences": {}}
    sandbox.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
    sandbox.kubeconfig.chmod(0o600)


def _wait_answering(sandbox: Sandbox, timeout_s: float = 10.0) -> None:
    """Every server answers HTTP before the sandbox is declared up; the probes are not counted."""
    urls = [f"{s.url}/version" for s in sandbox.servers.values()] + [sandbox.aws.url, f"{sandbox.admin.url}/health"]
    for url in urls:
        headers = {"Authorization": f"Bearer {sandbox.admin_token}"} if url.endswith("/version") else {}
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s).close()
        except urllib.error.HTTPError:
            pass  # an HTTP error status is an answer (the AWS emulator refuses an unsigned GET)
    for twin in sandbox.twins.values():
        twin.store.reset_request_log()
    sandbox.aws.reset_request_log()


def _system_ready(store: KubeStore) -> bool:
    ds = (store.get("apps", "daemonsets", "aws-node", "kube-system") or {}).get("status") or {}
    deploy = store.get("apps", "deployments", "ebs-csi-controller", "kube-system") or {}
    want = (deploy.get("spec") or {}).get("replicas", 1)
    # A preinstalled Kyverno (controllers/kyverno.py) is handed over serving: its webhook configuration registered.
    kyverno_ok = store.get("apps", "deployments", "kyverno-admission-controller", "kyverno") is None or store.get(
        "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "kyverno-resource-mutating-webhook-cfg") \
        is not None
    return bool(ds.get("numberReady", 0) >= ds.get("desiredNumberScheduled", 1) > 0
                and (deploy.get("status") or {}).get("readyReplicas", 0) >= want and kyverno_ok)


def _wait_system_ready(sandbox: Sandbox, timeout_s: float = 15.0) -> None:
    """A real cluster is handed over with its system pods running; once the workloads controller owns them,
    wait for its pods to start (pod_startup_s of model time) so stage 3's prerequisite checks see them Ready."""
    deadline = time.monotonic() + timeout_s
    pending = list(sandbox.twins.values())
    while pending and time.monotonic() < deadline:
        pending = [t for t in pending if not _system_ready(t.store)]
        if pending:
            time.sleep(0.05)
    for twin in pending:
        log.warning("sandbox: kube-system workloads of %s not ready after %.0fs", twin.name, timeout_s)


def port_refuses(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on ``host:port`` any more."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect((host, port))
        except OSError:
            return True
    return False


__all__ = ["Sandbox", "SandboxSettings", "eks_name_of", "eks_token", "port_refuses", "start_sandbox"]
