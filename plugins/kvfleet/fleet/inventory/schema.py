"""The inventory's models (pydantic v2, frozen): the one place a key of the fleet file is declared, and the values
the rest of kvfleet and the twin read (what a key implies, such as the L2 injection a cluster runs or the size of an
endpoint's model, is a property computed on access, so a ``model_copy`` stays consistent).

``Inventory`` mirrors the YAML a platform team writes (``settings``, ``lobs``, ``clusters``, ``endpoints``,
``prices``); ``clusters``, ``endpoints``, ``lobs`` and ``addons`` take a list of items with ``name`` or a mapping
keyed by name, and the model normalises both to the list. Every field carries its type, default, bounds and a
description: the JSON Schema (``kvfleet schema``) and the key table of docs/inventory.md
(``python -m kvfleet.fleet.inventory_doc``) are generated from it.

Validation reports *every* problem at once. A field's check (:mod:`.fields`) raises the kvfleet message; pydantic
collects them across the whole document, and :func:`.loader.validate_document` maps each error's location to the
YAML path a user reads (:mod:`.messages`). The checks across objects (:mod:`.rules`) are ``Inventory``'s model
validator; it runs even when fields failed, on the clusters and endpoints that did validate, so a document's field
errors and its cross-reference errors come in one list.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    computed_field,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from kvfleet.errors import InventoryError
from kvfleet.fleet import constants as C
from kvfleet.fleet import models
from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT, ClusterRef, ambiguity, candidates, matches
from kvfleet.fleet.inventory.base import AccountName, Bool, Text, UpdateStrategy, _described, _Model, named_items
from kvfleet.fleet.inventory.derived import ModelSize, model_size, resolve_l2_injection
from kvfleet.fleet.inventory.fields import (
    _account_id,
    _addon_name,
    _addon_version,
    _chart,
    _chart_version,
    _choice,
    _configuration,
    _conn_id,
    _enum,
    _env_name,
    _env_value,
    _external_id,
    _fs_path,
    _gpu_instance_type,
    _hash_seed,
    _host_path,
    _image,
    _instance_type,
    _int,
    _l2_url,
    _model_id,
    _model_name,
    _name,
    _namespace,
    _node_recovery,
    _number,
    _prefix_entry,
    _price,
    _price_key,
    _private_range,
    _region,
    _role_arn,
    _size,
    _sns_arn,
    _storage_class,
    _text,
    _webhook,
)
from kvfleet.fleet.inventory.messages import Found, again, left_out
from kvfleet.fleet.inventory.policy import Policy
from kvfleet.fleet.inventory.rules import Parts, cross_checks
from kvfleet.fleet.inventory.vocabulary import (
    DEFAULT_IMAGE,
    DEFAULT_MODEL_ID,
    DEFAULT_WORKER_HOST_PATH,
    DNS_LABEL,
    HOST_PATH_PREFIXES,
    HYPERPOD_NAME,
    L2_INJECTION_CHOICES,
    LMCACHE_LOG_FORMATS,
    MAX_MODEL_PARAMS_B,
    NAMED,
    SIZE,
    UPDATE_STRATEGY_HELP,
    WORKLOADS,
    _fail,
    show,
)
from kvfleet.fleet.shared_rules import repo_url_problem

# ---- the model ----------------------------------------------------------------------------------------------------


class Notify(_Model):
    sns_topic_arn: Annotated[str | None, _text(max_len=1024, allow_empty=True, check=_sns_arn)] = _described(
        "An SNS topic that also receives this LOB's notifications (arn:aws:sns:<region>:<account>:<topic>).",
        default=None)
    webhook_url: Annotated[str | None, _text(max_len=2048, allow_empty=True, check=_webhook)] = _described(
        "An http(s) URL that also receives this LOB's notifications (JSON POST). A host in a loopback, link-local "
        "or private range is refused unless settings.webhook_private_ranges holds it.", default=None)


class Account(_Model):
    name: Annotated[str, _name(DNS_LABEL, "account name")] = _described(
        "The inventory's name for the account (DNS-1123 label); clusters and LOBs name it in `account`.")
    id: Annotated[str, BeforeValidator(_account_id)] = _described("The 12-digit AWS account id (quoted).")
    role_arn: Annotated[str | None, _text(max_len=2048, check=_role_arn, numbers=False)] = _described(
        "The IAM role of this account kvfleet assumes from its base identity (required unless aws_conn_id is set).",
        default=None)
    external_id: Annotated[str | None, _text(max_len=1224, check=_external_id, numbers=False)] = _described(
        "The external id the role's trust policy asks for (sts:ExternalId).", default=None)
    aws_conn_id: Annotated[str | None, _text(max_len=250, check=_conn_id, numbers=False)] = _described(
        "An Airflow AWS connection used for this account instead of the base identity.", default=None)
    session_duration_s: Annotated[int, _int(900, 43200)] = _described(
        "Seconds an assumed-role session lasts (STS: 900-43200; the role's own maximum may be lower).", default=3600)


class Lob(_Model):
    name: Annotated[str, _name(DNS_LABEL, "line-of-business name")] = _described(
        "The line of business (DNS-1123 label); endpoints name it in `lob`.")
    account: AccountName = _described("The account its endpoints' clusters are looked for in first (a bare cluster "
                                      "name that several accounts have).", default=None)
    description: Annotated[str, _text(max_len=1000, allow_empty=True)] = _described("Free text.", default="")
    remediate_drift: Bool = _described("Drift on this LOB's endpoints is fixed automatically.", default=False)
    notify: Notify = _described("Where this LOB's notifications also go (both keys optional).",
                                default_factory=Notify)
    policy: Policy = _described("The least a rollout of this LOB may ask for (a run may ask for more).",
                                default_factory=Policy)


class Settings(_Model):
    wave_size: Annotated[int, _int(1, 500)] = _described(
        "Endpoints per cluster per wave after the canary wave.", default=3)
    chunk_size: Annotated[int, _int(16, 4096)] = _described(
        "LMCache chunk size in tokens: prompts shorter than one chunk never reach L2.", default=C.CHUNK_SIZE)
    l2_url: Annotated[str, _text(max_len=1024, check=_l2_url)] = _described(
        f"LMCache's remote URL: an fs:// URL under the Curvine mount {C.L2_MOUNT_PATH}/.", default=C.L2_URL)
    serde: Annotated[str, _choice(("naive",))] = _described(
        "LMCache's remote serde (cachegen has a bug under the fs connector).", default=C.L2_SERDE)
    hash_seed: Annotated[str, BeforeValidator(_hash_seed)] = _described(
        "PYTHONHASHSEED on every pod: one fixed integer string in 0–4294967295, so LMCache keys match across pods.",
        default=C.PYTHONHASHSEED)
    lmcache_log_format: Annotated[str, _choice(LMCACHE_LOG_FORMATS)] = _described(
        "The LMCache release whose log lines verification reads.", default="0.3.9")
    operator_pause_threshold_minutes: Annotated[int, _int(1, 1440)] = _described(
        "Drift reports an operator paused longer than this.", default=30)
    curvine_host_path_prefixes: Annotated[list[Annotated[str, BeforeValidator(_prefix_entry)]],
                                          Field(min_length=1, max_length=20)] = _described(
        "Directories a Curvine worker's host_path may live under (a node directory kvfleet mounts into pods).",
        default_factory=lambda: list(HOST_PATH_PREFIXES))
    webhook_private_ranges: Annotated[list[Annotated[str, BeforeValidator(_private_range)]],
                                      Field(max_length=50)] = _described(
        "Private, loopback or link-local networks (CIDR) a LOB's webhook_url may point into; none by default.",
        default_factory=list)


class TieredStorage(_Model):
    mode: Annotated[str, _choice(C.TIERED_MODES)] = _described(
        "HyperPod managed tiered storage (the L1 CPU tier).", default="Enable")
    memory_percent: Annotated[int, _int(
        C.MEMORY_PERCENT_MIN, C.MEMORY_PERCENT_MAX, " (HyperPod accepts 20–100)")] = _described(
        "InstanceMemoryAllocationPercentage: host memory given to the L1 tier.", default=C.MEMORY_PERCENT_DEFAULT)


class GpuNodes(_Model):
    count: Annotated[int, _int(1, 10000)] = _described("GPU nodes of the cluster.")
    instance_type: Annotated[str, _text(check=_gpu_instance_type)] = _described(
        "Their SageMaker instance type (kvfleet must know its GPUs).", default="ml.g6e.4xlarge")


class CurvineMaster(_Model):
    replicas: Annotated[int, _int(1, 7, odd=True)] = _described(
        "Curvine masters (Raft: odd).", default=1)
    storage_class: Annotated[str, _text(check=_storage_class)] = _described(
        "StorageClass of the masters' volumes.", default="ebs-sc")
    meta_size: Annotated[str, _text(check=_size)] = _described("Metadata volume size.", default="10Gi")
    journal_size: Annotated[str, _text(check=_size)] = _described("Journal volume size.", default="50Gi")


class CurvineWorker(_Model):
    replicas: Annotated[int | None, _int(1, 1000)] = _described(
        "Workers; by default one per GPU node (the cluster's gpu_nodes.count).", default=None)
    host_path: Annotated[str, _text(max_len=4096, check=_host_path)] = _described(
        "The node directory (NVMe) a worker stores blocks in; under settings.curvine_host_path_prefixes.",
        default=DEFAULT_WORKER_HOST_PATH)
    size: Annotated[str, _text(check=_size)] = _described("Capacity per worker (L2 = size × workers).",
                                                          default="100Gi")

    def capacity(self, workers: int) -> str:
        """The L2 capacity as the sources state it: the size per worker × N workers."""
        m = SIZE.fullmatch(self.size)
        return f"{self.size} × {workers}" + (f" = {int(m.group(1)) * workers}{m.group(2)}" if m else "")


class CurvineSpec(_Model):
    chart: Annotated[str, _text(check=_chart)] = _described("Helm chart of Curvine.", default="curvine")
    csi_chart: Annotated[str, _text(check=_chart)] = _described("Helm chart of Curvine's CSI driver.",
                                                                default="curvine-csi")
    allow_insecure_repo: Bool = _described("Accept an http:// repo_url.", default=False)
    repo_url: Annotated[str, _text(max_len=2048)] = _described(
        "The charts' repository (https://).", default="https://curvineio.github.io/helm-charts")
    version: Annotated[str, _text(check=_chart_version)] = _described("Chart version (SemVer 2).",
                                                                      default=C.CURVINE_CHART_VERSION)
    namespace: Annotated[str, _text(check=_namespace)] = _described("Namespace of Curvine (not a kube- one).",
                                                                    default=C.CURVINE_NAMESPACE)
    master: CurvineMaster = _described("Curvine masters.", default_factory=CurvineMaster)
    worker: CurvineWorker = _described("Curvine workers.", default_factory=CurvineWorker)
    storage_class: Annotated[str, _text(check=_storage_class)] = _described(
        "The StorageClass pods mount L2 through.", default=C.CURVINE_STORAGE_CLASS)
    fs_path: Annotated[str, _text(max_len=4096, check=_fs_path)] = _described("Curvine path of the L2 cache.",
                                                                              default="/l2cache")
    scale_out: Annotated[str, _choice(("report", "auto"))] = _described(
        "report: the scheduled path only reports capacity; auto: it may add workers.", default="report")

    @field_validator("repo_url")
    @classmethod
    def _repo_rule(cls, value: str, info: ValidationInfo) -> str:
        """The chart-repository rule the environment's mirror overrides obey too (``kvfleet.fleet.shared_rules``)."""
        problem = repo_url_problem(value, allow_http=info.data.get("allow_insecure_repo", False), shown=show(value),
                                   allowance="set allow_insecure_repo: true beside it")
        if problem:
            raise _fail(problem)
        return value


class AddonSpec(_Model):
    name: Annotated[str, _enum(_addon_name, C.ADDON_ORDER)] = _described(
        "An EKS add-on kvfleet manages.")
    version: Annotated[str | None, _text(allow_empty=True, check=_addon_version)] = _described(
        "Its version (v + SemVer); none: whatever is installed.", default=None)
    configuration: Annotated[dict[str, Any] | None, BeforeValidator(_configuration)] = _described(
        "Its configurationValues (JSON).", default=None)


class Cluster(_Model):
    name: Annotated[str, _name(HYPERPOD_NAME, "HyperPod cluster name")] = _described(
        "The HyperPod cluster's name (letters, digits, '-', at most 63).")
    region: Annotated[str, _text(check=_region)] = _described("Its AWS region, e.g. us-east-1.")
    production: Bool = _described("A production cluster: `auto` L2 injection is kyverno, Curvine upgrades ask for "
                                  "approval.", default=False)
    tiered_storage: TieredStorage = _described("HyperPod managed tiered storage (L1).",
                                               default_factory=TieredStorage)
    node_recovery: Annotated[str | None, _enum(_node_recovery, C.NODE_RECOVERY_VALUES)] = _described(
        "Declared: stage 1 reconciles the cluster to it; absent: the live value is kept.", default=None)
    gpu_nodes: GpuNodes = _described("The cluster's GPU nodes: {count, instance_type}.")
    account: AccountName = _described("Its account (declared in `accounts`); none: the base identity's own.",
                                      default=None)
    _account_id: str = PrivateAttr(DEFAULT_ACCOUNT)  # the account's id, set when the inventory is validated
    # What the file asks (its key is `l2_injection`); the property `l2_injection` is what the cluster runs.
    l2_injection_asked: Annotated[str, _choice(L2_INJECTION_CHOICES)] = Field(
        "auto", alias="l2_injection",
        description="How the L2 mount reaches operator pods: auto (kyverno on production, else patch), patch, kyverno.")
    update_strategy: UpdateStrategy = _described(
        f"How patch mode changes a Deployment, the default of its endpoints: {UPDATE_STRATEGY_HELP}.", default=None)
    ebs_storage_class: Annotated[str, _text(check=_storage_class)] = _described(
        "The EBS StorageClass of the cluster.", default="ebs-sc")
    curvine: CurvineSpec = _described("Curvine (L2) on this cluster.", default_factory=CurvineSpec)
    addons: list[AddonSpec] = _described("EKS add-ons: a list with `name`, or a mapping keyed by name.",
                                          default_factory=list)

    @field_validator("addons", mode="before")
    @classmethod
    def _both_spellings(cls, value: Any) -> Any:
        return named_items(value)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def l2_injection(self) -> str:
        """What the cluster runs: patch | kyverno (`auto` resolved, see ``l2_injection_reason``)."""
        return resolve_l2_injection(self.l2_injection_asked, self.production)[0]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def l2_injection_reason(self) -> str:
        return resolve_l2_injection(self.l2_injection_asked, self.production)[1]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def curvine_workers(self) -> int:
        """Curvine workers: `curvine.worker.replicas`, else one per GPU node (docs/reference/curvine.md)."""
        declared = self.curvine.worker.replicas
        return declared if declared is not None else max(1, self.gpu_nodes.count)

    @property
    def ref(self) -> ClusterRef:
        """The cluster's identity across the fleet (``kvfleet.fleet.cluster_ref``)."""
        return ClusterRef(self._account_id, self.region, self.name)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def key(self) -> str:
        """``account/region/name``: the account's 12-digit id, or ``default`` for the base identity's own."""
        return self.ref.key

    def addon(self, name: str) -> AddonSpec:
        return next((a for a in self.addons if a.name == name), AddonSpec(name=name))


class Endpoint(_Model):
    name: Annotated[str, _name(DNS_LABEL, "Kubernetes object name")] = _described(
        "The endpoint (a Kubernetes object name and the SageMaker endpoint name).")
    namespace: Annotated[str, _text(check=_namespace)] = _described(
        "Its namespace (not a kube- one).", default="default")
    lob: Text = _described("Its line of business (declared in `lobs`).")
    cluster: Text = _described("Its cluster (declared in `clusters`).")
    model: Annotated[str, _text(check=_model_name)] = _described(
        "The CRD's modelName; a catalogue name sizes the model.")
    instance_type: Annotated[str, _text(check=_instance_type)] = _described(
        "SageMaker instance type of its replicas: the cluster's gpu_nodes.instance_type.")
    replicas: Annotated[int, _int(0, 1000)] = _described("Replicas (1 GPU each).", default=2)
    routing: Annotated[str, _choice(C.ROUTING_STRATEGIES)] = _described(
        "Intelligent routing strategy.", default="prefixaware")
    l1: Bool = _described("LMCache's local CPU tier.", default=True)
    l2: Bool = _described("The shared Curvine tier.", default=True)
    image: Annotated[str, _text(max_len=512, check=_image)] = _described("The worker image.", default=DEFAULT_IMAGE)
    model_id: Annotated[str, _text(check=_model_id)] = _described("Hugging Face model id the operator downloads.",
                                                                  default=DEFAULT_MODEL_ID)
    env: Annotated[dict[Annotated[str, BeforeValidator(_env_name)], Annotated[str, BeforeValidator(_env_value)]],
                   Field(max_length=200)] = _described("Extra worker environment (string values).",
                                                       default_factory=dict)
    update_strategy: UpdateStrategy = _described("This endpoint's update strategy (wins over the cluster's).",
                                                 default=None)
    workload: Annotated[str | None, _choice(WORKLOADS, nullable=True)] = _described(
        "What the traffic is; validate warns when routing contradicts it.", default=None)
    model_params_b: Annotated[float | None, _number(MAX_MODEL_PARAMS_B, "write the parameter count in billions, "
                                                    "e.g. 7.62 for a 7B model")] = _described(
        "Parameters in billions (else the catalogue's).", default=None)
    dtype: Annotated[str | None, _choice(models.DTYPES, True)] = _described(
        "Weights' dtype, with model_params_b (else the catalogue's).", default=None)

    # The key of the cluster `cluster` names, set on validation ("": it named none, or several); None: an endpoint
    # built outside an inventory, judged by what it names.
    _cluster_key: str | None = PrivateAttr(None)
    # The cluster as its reference names it (``ref``), set on validation; None: the cluster as written.
    _ref_cluster: str | None = PrivateAttr(None)

    def on(self, cluster: Cluster) -> bool:
        """Whether this endpoint is on ``cluster``: by the key its reference resolved to."""
        return self._cluster_key == cluster.key if self._cluster_key is not None else matches(self.cluster, cluster)

    @property
    def size(self) -> ModelSize:
        """The served model's size: the declared one, else the catalogue's (``derived.model_size``)."""
        return model_size(self)

    @property
    def key(self) -> str:
        """Unique within a cluster: namespace/name."""
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> str:
        """``cluster:namespace/name``, unique within the fleet: the cluster as the endpoint names it, or its key
        ``account/region/name`` where the fleet has several clusters of that name (two accounts' ``ml-prod``)."""
        return f"{self._ref_cluster or self.cluster}:{self.namespace}/{self.name}"


class Inventory(_Model):
    """The whole inventory file."""  # the JSON Schema's description; validated, it carries `source` and `warnings`

    _source: str = PrivateAttr("fleet.yaml")
    _warnings: tuple[str, ...] = PrivateAttr(())
    settings: Settings = _described("Fleet-wide settings.", default_factory=Settings)
    accounts: list[Account] = _described("AWS accounts the clusters are in: a list with `name`, or a mapping keyed by "
                                         "name (none: every cluster in the base identity's own).",
                                         default_factory=list)
    lobs: list[Lob] = _described("Lines of business: a list with `name`, or a mapping keyed by name.",
                                 default_factory=list)
    clusters: list[Cluster] = _described("HyperPod clusters: a list with `name`, or a mapping keyed by name.",
                                         default_factory=list)
    endpoints: list[Endpoint] = _described("Inference endpoints: a list with `name`, or a mapping keyed by name.",
                                           default_factory=list)
    prices: Annotated[dict[Annotated[str, BeforeValidator(_price_key)], Annotated[float, BeforeValidator(_price)]],
                      Field(max_length=500)] = _described("USD per instance-hour by instance type (optional).",
                                                          default_factory=dict)

    @field_validator(*NAMED, mode="before")
    @classmethod
    def _both_spellings(cls, value: Any) -> Any:
        return named_items(value)

    @model_validator(mode="wrap")
    @classmethod
    def _cross_checks(cls, data: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Inventory:
        """Field errors and the checks across objects, in one ValidationError (see the module docstring)."""
        try:
            fleet: Inventory | None = handler(data)
            errors: list[Any] = []
        except ValidationError as exc:
            fleet, errors = None, list(exc.errors())
        found = Found()
        if isinstance(data, dict):
            context = info.context if isinstance(info.context, dict) else {}
            doc = normalised(data)
            found = cross_checks(doc, _parts(doc, fleet), str(context.get("source", "fleet.yaml")))
            if fleet is not None:
                fleet._source, fleet._warnings = str(context.get("source", "fleet.yaml")), tuple(found.warnings)
        if errors or found.problems:
            errors = left_out(errors) if fleet is None else errors
            raise ValidationError.from_exception_data(cls.__name__, [again(e) for e in errors] + [
                InitErrorDetails(type=_fail(msg), loc=loc, input=None) for loc, msg in found.problems])
        assert fleet is not None
        return fleet

    @property
    def source(self) -> str:
        return self._source

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._warnings

    def cluster(self, name: str) -> Cluster:
        """The cluster ``name`` names: its key, or a bare name only one cluster has. KeyError(name) when none;
        InventoryError listing the candidates' keys when several."""
        found = candidates(name, self.clusters)
        if len(found) > 1:
            raise InventoryError([f"{self.source}: cluster {ambiguity(name, found)}"])
        if not found:
            raise KeyError(name)
        return found[0]

    def lob(self, name: str) -> Lob:
        return {x.name: x for x in self.lobs}[name]

    def endpoints_of(self, cluster: str) -> tuple[Endpoint, ...]:
        exact = [c for c in self.clusters if c.key == cluster]  # a key is never resolved again
        try:
            cl = exact[0] if exact else self.cluster(cluster)
        except KeyError:
            return tuple(e for e in self.endpoints if e.cluster == cluster)
        return tuple(e for e in self.endpoints if e.on(cl))

    def update_strategy(self, ep: Endpoint) -> tuple[str, str]:
        """(the strategy asked for an endpoint, where it is set): its own value wins over its cluster's."""
        if ep.update_strategy is not None:
            return ep.update_strategy, "endpoint"
        cl = next((c for c in self.clusters if ep.on(c)), None)
        return ("auto", "default") if cl is None else (cl.update_strategy or "auto", "cluster")

    def select(self, *, lobs: list[str] | None = None, clusters: list[str] | None = None,
               endpoints: list[str] | None = None) -> Inventory:
        """The same inventory narrowed to a scope. Unknown names are an InventoryError naming them."""
        named = {c.key for c in self.clusters} | {c.name for c in self.clusters}
        problems = [f"{self.source}: unknown {kind} {name!r}; known: {', '.join(sorted(known)) or 'none'}"
                    for kind, wanted, known in (
                        ("lob", lobs, {x.name for x in self.lobs}),
                        ("cluster", [c for c in clusters or [] if not candidates(c, self.clusters)], named),
                        ("endpoint", endpoints, {e.name for e in self.endpoints} | {e.ref for e in self.endpoints}))
                    for name in wanted or [] if name not in known]
        chosen = {name: candidates(name, self.clusters) for name in clusters or []}
        problems += [f"{self.source}: cluster {ambiguity(n, found)}" for n, found in chosen.items() if len(found) > 1]
        if problems:
            raise InventoryError(problems)
        keys = {c.key for found in chosen.values() for c in found}
        cls = [c for c in self.clusters if not clusters or c.key in keys]
        eps = [e for e in self.endpoints if (not lobs or e.lob in lobs) and (not clusters or any(e.on(c) for c in cls))
               and (not endpoints or e.name in endpoints or e.ref in endpoints)]
        cls = [c for c in cls if not lobs or any(e.on(c) for e in eps)]
        return self.model_copy(update={"clusters": cls, "endpoints": eps})


def normalised(data: dict[str, Any]) -> dict[str, Any]:
    """The document with its named collections as lists (what the paths of messages are read against)."""
    out = {k: named_items(v) if k in NAMED else v for k, v in data.items()}
    if isinstance(out.get("clusters"), list):
        out["clusters"] = [{**c, "addons": named_items(c["addons"])} if isinstance(c, dict) and "addons" in c else c
                           for c in out["clusters"]]
    return out


def _validated(model: type[_Model], raw: Any) -> Any:
    """``raw`` validated, or None when any of its fields failed: such an object is left out of the checks across
    objects (its field errors say so), never completed with made-up values."""
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def _parts(data: dict[str, Any], fleet: Inventory | None) -> Parts:
    """What the cross checks read: the whole model, or, when fields failed, each item that validated."""
    if fleet is not None:
        return Parts(fleet.settings, list(fleet.lobs), list(fleet.clusters), list(fleet.endpoints),
                     list(fleet.accounts))
    raw = {k: v if isinstance(v := data.get(k), list) else [] for k in NAMED}
    return Parts(_validated(Settings, data.get("settings")), [_validated(Lob, x) for x in raw["lobs"]],
                 [_validated(Cluster, x) for x in raw["clusters"]],
                 [_validated(Endpoint, x) for x in raw["endpoints"]], [_validated(Account, x) for x in raw["accounts"]])
