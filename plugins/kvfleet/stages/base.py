"""What every reconciler shares: the per-cluster context (clients, run identity, dry run, recording) and the
shape of its outcome.

Called by the stage modules; built by the Airflow task bodies (``kvfleet.airflow``) and by `kvfleet plan
--diff`. Clients are created lazily, so a dry run that only needs AWS never builds a Kubernetes client.
A reconciler observes, diffs, acts only on the difference, verifies and records — and in a dry run it records
the exact action it would take (``ctx.plan``) instead of acting.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvfleet.fleet.inventory import Cluster, Inventory
from kvfleet.history.audit import WriteAhead
from kvfleet.history.keys import StepEvent, StepKey
from kvfleet.history.repos import HistoryRepos
from kvfleet.outcomes import Status
from kvfleet.settings import Settings, load_settings

if TYPE_CHECKING:  # imported when first used (a dry run that only needs AWS never loads the Kubernetes client)
    from kvfleet.clients.helm import Helm
    from kvfleet.clients.hyperpod import HyperPodClient
    from kvfleet.clients.identity import Identity
    from kvfleet.clients.kube import ClusterAccess

log = logging.getLogger("kvfleet")


@dataclass(frozen=True)
class Timeouts:
    """Patience per kind of wait, per try (``KVFLEET_TIMEOUT_*``); a StageContext takes them from its settings
    unless given some."""

    cluster_update_s: float = 3600.0
    addon_s: float = 1200.0
    pods_s: float = 1800.0
    pvc_s: float = 300.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Timeouts:
        return cls(cluster_update_s=settings.timeout_cluster_s, addon_s=settings.timeout_addon_s,
                   pods_s=settings.timeout_pods_s, pvc_s=settings.timeout_pvc_s)


# A StageContext built without ``timeouts`` takes them from its ``settings`` (compared by identity).
FROM_SETTINGS = Timeouts(-1.0, -1.0, -1.0, -1.0)


# What a sequence already under way still does after a stop (SIGTERM, ``clients.stop``): the steps that undo its own
# change, so a stop never leaves the fleet less available than the run found it. By the write-ahead action kind
# (``fleet.actions``): the operator restore (``RestoreOperator``), an endpoint scaled back from 0 to its recorded
# replicas (``Scale`` above 0: only the scale-to-zero sequence and its recovery scale up), an endpoint's original
# rollout strategy put back (``SetRolloutStrategy(restore=True)``); and stage 3's flip of the Curvine format flags to
# false after a first install (a ``HelmUpgrade`` whose why is ``CURVINE_FLAGS_OFF``, stages.curvine): refusing it
# would leave a release that formats its NVMe L2 at the next pod restart. Nothing forward is on the list: not the
# pause, not a patch, not another upgrade. Each of these still writes its intent and outcome rows.
#
# Why kinds at the write-ahead rather than "the restore path is exempt" at the clients: the exemption then covers
# exactly one recorded call of a named kind, in the thread that makes it (``allow_after_stop`` is a context
# variable), and ends with it; a wire-level rule (a PATCH of the operator's Deployment) would also pass a forward
# change of the same object, and a teardown-wide switch would pass whatever the teardown did next.
AFTER_STOP_KINDS = frozenset({"restore_operator", "scale_up", "restore_rollout_strategy"})
CURVINE_FLAGS_OFF = "format flags false"


def undo_after_stop(action: str, target: str) -> bool:
    """An undo step that still runs after a stop (``AFTER_STOP_KINDS``)."""
    return action in AFTER_STOP_KINDS or (action == "helm_upgrade" and target.endswith(f" {CURVINE_FLAGS_OFF}"))


@dataclass(frozen=True)
class PlannedAction:
    """One change a dry run would make: the call or command, exactly, plus a human diff when useful."""

    cluster: str
    stage: str
    action: str
    endpoint: str | None = None
    diff: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Outcome:
    """What one reconciler did on one cluster (or endpoint). Immutable: ``detail`` is a read-only view; build a
    new Outcome (``dataclasses.replace``) rather than changing one."""

    stage: str
    cluster: str
    outcome: Status
    detail: Mapping[str, Any] = field(default_factory=dict)
    endpoint: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Status(self.outcome))
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))

    def as_dict(self) -> dict[str, Any]:
        """The shape the history and XCom store (unchanged: plain str and dict)."""
        return {"stage": self.stage, "cluster": self.cluster, "endpoint": self.endpoint,
                "outcome": self.outcome.value, "detail": dict(self.detail)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        """The inverse of ``as_dict`` (an outcome kept across a deferral)."""
        return cls(d["stage"], d["cluster"], Status(d["outcome"]), dict(d.get("detail") or {}), d.get("endpoint"))


@dataclass(frozen=True)
class Pending:
    """A wait a stage leaves to its caller, after a change it just made or before one it must make: the HyperPod
    cluster back to ``InService`` (``addon`` None), an EKS add-on ``ACTIVE``, or a Kubernetes readiness check
    (``check``: the ai-toolkit daemon, the operator's controller; ``stages.readiness``).

    Stages 1 and 2 are split into ``act(ctx, progress) -> Pending | None`` and ``finish(ctx, progress) ->
    Outcome``: ``act`` makes the next change and returns what must be waited for; the caller waits — in the
    worker (``stages.converge``: the CLI, the drift remediation, the tests) or in Airflow's triggerer
    (``kvfleet.airflow.rollout``: the worker slot is given back) — and calls ``act`` again with the same
    ``progress`` (a JSON-able dict the stage keeps its decisions in, so it travels in a deferral's kwargs) until
    it returns None; then ``finish`` verifies and records. ``wait`` names the wait (a deferral's patience counts
    from the first try of the same wait); a terminal state ends it at once (PermanentError, the service's
    message) and running out of ``timeout_s`` is ConvergenceTimeout, wherever it waits."""

    wait: str
    what: str
    timeout_s: float
    addon: str | None = None
    eks: str | None = None
    # A Kubernetes readiness check instead (``stages.readiness``: its name and JSON arguments).
    check: str | None = None
    args: Mapping[str, Any] | None = None


@dataclass
class StageContext:
    inventory: Inventory
    cluster: Cluster
    step_key: StepKey | None = None
    actor: str = "kvfleet"
    dry_run: bool = False
    history: HistoryRepos | None = None
    aws_conn_id: str | None = "aws_default"
    # Who kvfleet acts as on the cluster (``kvfleet.clients.identity``); None: built from the inventory, the
    # cluster and ``aws_conn_id`` (no run: the session is not named after one).
    identity: Identity | None = None
    # Every KVFLEET_* setting, read when the context is built (``kvfleet.settings``).
    settings: Settings = field(default_factory=load_settings)
    timeouts: Timeouts = FROM_SETTINGS
    progress: Callable[[str], None] = log.info
    planned: list[PlannedAction] = field(default_factory=list)
    # Lease liveness: is the run holding a lease still running? (True / False / None: cannot tell.) Set by the
    # Airflow task bodies from Airflow's own run state; None elsewhere (then only the lease ttl decides).
    holder_alive: Callable[[str], bool | None] | None = None
    # The clock stage 5 times its probes with (seconds; vLLM's benchmark client uses time.perf_counter). A test that
    # judges a speedup hands in the twin's model clock, so the machine's load cannot decide a verdict.
    probe_clock: Callable[[], float] = time.perf_counter
    # Per-context memo of discovered names (e.g. which Deployment is the operator's controller).
    memo: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.identity is None:
            from kvfleet.clients.identity import identity_for

            self.identity = identity_for(self.inventory, self.cluster, conn_id=self.aws_conn_id)
        if self.timeouts is FROM_SETTINGS:
            self.timeouts = Timeouts.from_settings(self.settings)

    @property
    def poll_s(self) -> float:
        """How often this context's waits poll (``KVFLEET_POLL_SECONDS``)."""
        return self.settings.poll_seconds

    @cached_property
    def hyperpod(self) -> HyperPodClient:
        """The cluster's HyperPod client, once the account guard passed (``HyperPodClient.account_problem``): every
        change a stage makes, to AWS, Kubernetes or helm, goes through this client or the access built from it,
        so none is made in another account. A refusal is recorded (``account_guard``) and is a PermanentError."""
        from kvfleet.clients.factory import hyperpod_for
        from kvfleet.errors import PermanentError

        client = hyperpod_for(self.cluster.ref, self.identity)
        problem = client.account_problem(self.cluster.name)
        if problem is not None:
            self.record("account_guard", "preflight", Status.REFUSED, reason=problem,
                        identity=client.identity.describe())
            raise PermanentError(f"account guard: {problem}")
        return client

    @cached_property
    def kube(self) -> ClusterAccess:
        from kvfleet.clients.factory import kube_for

        return kube_for(self.cluster.ref, self.identity, hyperpod=self.hyperpod)

    @cached_property
    def helm(self) -> Helm:
        from kvfleet.clients.helm import Helm

        return Helm(self.kube)

    def say(self, msg: str) -> None:
        self.progress(f"[{self.cluster.name}] {msg}")

    def plan(self, stage: str, action: str, *, endpoint: str | None = None, diff: str | None = None) -> None:
        self.planned.append(PlannedAction(self.cluster.name, stage, action, endpoint, diff))
        self.say(f"DRY RUN would: {action}" + (f"\n{diff}" if diff else ""))
        # Kept in the history too, so the run's summary (another task) can print the whole diff.
        self.record(f"planned:{len(self.planned):04d}:{stage}", stage, "planned", endpoint=endpoint, action=action,
                    diff=diff)

    def record(self, step: str, stage: str, outcome: Status | str, *, endpoint: str | None = None,
               lob: str | None = None, **detail: Any) -> Outcome:
        if self.history is not None and self.step_key is not None:
            self.history.runs.record_step(self.step_key, StepEvent(step=step, stage=stage, outcome=str(outcome),
                                                              cluster=self.cluster.key, endpoint=endpoint, lob=lob,
                                                              detail=detail), actor=self.actor)
        return Outcome(stage, self.cluster.name, Status(outcome), detail, endpoint)

    @contextlib.contextmanager
    def write_ahead(self, action: str, target: str, *, endpoint: str | None = None) -> Iterator[WriteAhead | None]:
        """Wrap one mutating call: an intent row before it and an outcome row after it (``AuditLog.write_ahead``).
        Yields the handle (set ``result`` / ``detail`` for a precise outcome), or None — and records nothing —
        in a dry run or without a history store or run identity.

        After a stop (SIGTERM, ``clients.stop``) no new intent is opened: ``StopRequested`` naming the action, before
        any row or call. The undo steps of ``undo_after_stop`` are the exception: they run, recorded as usual, inside
        ``stop.allow_after_stop`` so the clients let their one call through."""
        from kvfleet.clients.stop import allow_after_stop, refuse_if_stopped

        scope: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if undo_after_stop(action, target):
            scope = allow_after_stop(f"{action} {target}")
        elif not self.dry_run:
            refuse_if_stopped(f"{action} {target}")
        with scope:
            if self.dry_run or self.history is None or self.step_key is None:
                yield None
                return
            with self.history.audit.write_ahead(self.step_key, action, target, cluster=self.cluster.key,
                                                endpoint=endpoint, actor=self.actor) as wa:
                yield wa

    def close(self) -> None:
        if "helm" in self.__dict__:
            self.helm.close()
        if "kube" in self.__dict__:
            self.kube.close()
