"""What kvfleet needs from Airflow's task context: the run key, the trigger and who pulled it; whether a lease
holder's run is still running; and the per-cluster ``StageContext`` a task body works with.

Called by every task function in ``kvfleet.airflow``. Kept apart so the stages never import Airflow. Light at
import (the DAG callbacks import it): the inventory, the stages and the history store load on first use.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvfleet.history.keys import StepKey

if TYPE_CHECKING:
    from kvfleet.fleet.inventory import Inventory
    from kvfleet.fleet.pinning import Pinned
    from kvfleet.settings import Settings
    from kvfleet.stages.base import StageContext

log = logging.getLogger(__name__)
RUNNING_STATES = frozenset({"running", "queued"})


@dataclass(frozen=True)
class RunInfo:
    run_key: str
    dag_id: str
    run_id: str
    trigger: str  # schedule | manual | backfill | asset | test
    triggered_by: str | None
    task_id: str
    map_index: int

    @property
    def step_key(self) -> StepKey:
        return StepKey(self.run_key, self.task_id, self.map_index)

    @property
    def actor(self) -> str:
        return self.triggered_by or f"airflow:{self.trigger}"


def _trigger(dag_run: Any) -> str:
    run_type = str(getattr(dag_run, "run_type", "manual") or "manual").lower().split(".")[-1]
    return {"scheduled": "schedule"}.get(run_type, run_type)


def dag_run_facts(context: Any) -> dict[str, Any]:
    """What a DAG-level callback knows about its run. Airflow 3.3 gives DAG callbacks either the full context
    (``dag_run``, ``ti``, ``params``...) or, when the server sent no task instance, only ``dag``, ``run_id``
    and ``reason``; this works with both."""
    dag_run = context.get("dag_run")
    dag = context.get("dag")
    dag_id = getattr(dag_run, "dag_id", None) or getattr(dag, "dag_id", None) or "unknown"
    run_id = getattr(dag_run, "run_id", None) or context.get("run_id") or "unknown"
    params = context.get("params")
    if not params:
        params = getattr(dag_run, "conf", None) or {}
    try:
        params = dict(params)
    except (TypeError, ValueError):
        params = {}
    return {"run_key": f"{dag_id}/{run_id}", "dag_id": str(dag_id), "run_id": str(run_id),
            "trigger": _trigger(dag_run) if dag_run is not None else "unknown",
            "triggered_by": getattr(dag_run, "triggering_user_name", None), "params": params}


def run_info(context: dict[str, Any] | None = None) -> RunInfo:
    if context is None:
        from airflow.sdk import get_current_context

        context = dict(get_current_context())
    dag_run = context["dag_run"]
    ti = context["ti"]
    trigger = _trigger(dag_run)
    user = getattr(dag_run, "triggering_user_name", None)
    map_index = getattr(ti, "map_index", -1)
    return RunInfo(
        run_key=f"{dag_run.dag_id}/{dag_run.run_id}",
        dag_id=dag_run.dag_id,
        run_id=dag_run.run_id,
        trigger=trigger,
        triggered_by=user,
        task_id=ti.task_id,
        map_index=-1 if map_index is None else int(map_index),
    )


def airflow_run_alive(holder: str) -> bool | None:
    """Lease liveness from Airflow itself: is the holder's run (``dag_id/run_id``) still running? None when it
    cannot tell (not an Airflow run key, or no Airflow task context)."""
    from kvfleet.history.leases import run_key_of

    key = run_key_of(holder)
    if "/" not in key:
        return None
    dag_id, run_id = key.split("/", 1)
    try:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        state = RuntimeTaskInstance.get_dagrun_state(dag_id=dag_id, run_id=run_id)
    except Exception as exc:  # no supervisor, unknown run: the ttl decides
        log.debug("run state of %s unknown: %s", key, exc)
        return None
    return str(state).lower().split(".")[-1] in RUNNING_STATES


def pin_inventory(fleet: str, settings: Settings | None = None) -> Pinned:
    """The inventory at ``fleet`` (a run's ``fleet`` Param), read, validated and pinned by the run's first task.
    Only the configured inventory paths are read (``KVFLEET_FLEET_PATHS``, by default the directory of
    ``KVFLEET_FLEET``): a run naming any other file on the worker is refused (ConfigError) first."""
    from kvfleet.fleet.pinning import pin
    from kvfleet.settings import load_settings

    return pin((settings or load_settings()).check_fleet_path(fleet))


def run_inventory(run_key: str) -> Inventory:
    """The inventory this run pinned when it started (``runs.inventory_sha256``), never the file as it is now;
    a PermanentError naming the run when it has none."""
    from kvfleet.errors import InventoryError, PermanentError
    from kvfleet.fleet.pinning import Pinned, inventory_of
    from kvfleet.history.runs import Runs

    pinned = Runs().pinned(run_key)
    if pinned is None:
        raise PermanentError(f"run {run_key}: the history store holds no pinned inventory for this run; its first "
                             "task pins the inventory when the run starts: clear that task (or trigger a new run) "
                             "to pin it again")
    try:
        return inventory_of(Pinned(**pinned))
    except InventoryError as exc:
        raise InventoryError([f"run {run_key}: {p}" for p in exc.problems]) from None


def narrowed(inventory: Inventory, *, lobs: Iterable[str] | None = (), clusters: Iterable[str] | None = (),
             endpoints: Iterable[str] | None = ()) -> Inventory:
    """``inventory`` narrowed to a run's scope (empty: all); unknown or ambiguous names: an InventoryError. A scope
    may hold several clusters of one name (two accounts' ``ml-prod``): the DAGs map their tasks over cluster keys,
    and an endpoint's ``ref`` names its cluster by key where the name is shared."""
    return inventory.select(lobs=list(lobs or ()) or None, clusters=list(clusters or ()) or None,
                            endpoints=list(endpoints or ()) or None)


def scoped(run_key: str, *, lobs: Iterable[str] | None = (), clusters: Iterable[str] | None = (),
           endpoints: Iterable[str] | None = ()) -> Inventory:
    """The run's pinned inventory (:func:`run_inventory`) narrowed to its scope."""
    return narrowed(run_inventory(run_key), lobs=lobs, clusters=clusters, endpoints=endpoints)


def scoped_inventory(params: Mapping[str, Any]) -> Inventory:
    """``scoped`` for the running task's run, from a DAG's Params (``lobs``, ``clusters``, ``endpoints``): the
    drift check, the hit verification and the Curvine DAGs. The rollout parses its Params into a
    ``RolloutRequest`` instead."""
    return scoped(run_info().run_key, lobs=params.get("lobs"), clusters=params.get("clusters"),
                  endpoints=params.get("endpoints"))


def cluster_context(cluster: str, *, lobs: Iterable[str] | None = (), clusters: Iterable[str] | None = (),
                    endpoints: Iterable[str] | None = (), dry_run: bool = False,
                    aws_conn_id: str = "aws_default") -> StageContext:
    """One cluster's stage context inside a running task: the run's identity, its pinned inventory, the history
    store, a SIGTERM handler (waits end promptly), and lease liveness from Airflow."""
    from kvfleet.clients.identity import identity_for
    from kvfleet.clients.kube import install_sigterm_handler
    from kvfleet.history.repos import HistoryRepos
    from kvfleet.settings import load_settings
    from kvfleet.stages.base import StageContext

    info = run_info()
    settings = load_settings()
    inv = scoped(info.run_key, lobs=lobs, clusters=clusters, endpoints=endpoints)
    cl = inv.cluster(cluster)
    _label_map_index(cl.key)
    install_sigterm_handler()
    # The session in the cluster's account is named after the run, and tagged with it and the run's LOBs there.
    identity = identity_for(inv, cl, conn_id=aws_conn_id, run=(info.dag_id, info.run_id))
    return StageContext(inventory=inv, cluster=cl, step_key=info.step_key, actor=info.actor,
                        dry_run=dry_run, history=HistoryRepos.on(), aws_conn_id=aws_conn_id, identity=identity,
                        holder_alive=airflow_run_alive, settings=settings)


def _label_map_index(key: str) -> None:
    """Name this mapped task instance by its cluster's key in Airflow (the DAGs' ``map_index_template``, rendered
    from the task's context when it ends: Airflow's documented way to label a mapped TaskFlow task)."""
    from airflow.sdk import get_current_context

    from kvfleet.airflow.params import MAP_LABEL

    try:
        context: Any = get_current_context()
    except RuntimeError:  # not inside a task (a test or the CLI): nothing is labelled
        return
    context[MAP_LABEL] = key


def stage_context(cluster: str, params: Mapping[str, Any]) -> StageContext:
    """``cluster_context`` from a DAG's Params (scope, ``dry_run``, ``aws_conn_id``), for the DAGs other than
    the rollout."""
    return cluster_context(cluster, lobs=params.get("lobs"), clusters=params.get("clusters"),
                           endpoints=params.get("endpoints"), dry_run=bool(params.get("dry_run")),
                           aws_conn_id=params.get("aws_conn_id") or "aws_default")
