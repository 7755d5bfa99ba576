"""DAG Params with JSON-schema validation, so the trigger form in the UI is usable and bad input is refused
before anything changes. Every Param of every kvfleet DAG is defined here (the DAG files only reference these
functions), with its default, a title, a description and, where numeric, its range: the Airflow trigger form
shows all of them.

Imported by the DAG files at parse time, so it stays light: ``airflow.sdk``, the standard library and
``kvfleet.settings`` (pydantic-settings), no I/O. The settings are read when a Param is made, i.e. when a DAG
file is parsed, never at import. The constants at the end are the DAG shapes that the DAG files need at parse time
(and the task bodies, which import heavier modules, must agree with; ``tests/dags/test_dag_integrity.py`` checks
it).
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

from airflow.sdk import Param

from kvfleet.settings import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)

_NAMES: dict[str, Any] = {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9][-A-Za-z0-9:/._]*$"}}

# DAG shapes needed at parse time (kvfleet.airflow.rollout reads WAVE_SLOTS from here; kvfleet.airflow.curvine's task
# ids equal the Curvine ones).
WAVE_SLOTS = 5
# What Airflow shows for a per-cluster mapped task instead of its index: the cluster's key account/region/name, which
# the task puts in its context once it knows the cluster (``kvfleet.airflow.context.cluster_context``); before
# that, the cluster as the task was given it.
MAP_LABEL = "kvfleet_cluster"
MAP_INDEX_TEMPLATE = "{{ " + MAP_LABEL + " | default(task.op_kwargs.get('cluster', ''), true) }}"
CURVINE_APPROVE_TASK = "approve"
CURVINE_NO_APPROVAL_TASK = "no_approval"


def _copy(param: Param, memo: dict[int, Any] | None = None) -> Param:
    """A deep copy of ``param`` that copies its value and shares the rest (its schema, which nothing mutates, as
    ``Param.__copy__`` shares it). Not through ``Param.__init__``: the value was checked to be JSON when ``param``
    was made, and a copy of it still is."""
    new = Param.__new__(Param)
    vars(new).update({k: v for k, v in vars(param).items() if k != "__deepcopy__"})
    new.value = copy.deepcopy(param.value, memo)
    return new


def _copied_cheaply(params: dict[str, Any]) -> dict[str, Any]:
    """``params``, each able to deep-copy itself without walking its schema.

    Airflow deep-copies the DAG's whole ParamsDict at every ``__init__`` level of every operator
    (airflow/sdk/bases/operator.py ``_get_parent_defaults``, called by ``BaseOperatorMeta._apply_defaults``;
    task SDK 1.3.2): a ``@task`` has four levels and a wave gate three, so the rollout's 14 operators copy its 15
    Params 52 times, about 15,000 ``copy.deepcopy`` calls for each parse before this, and every copy but the
    outermost level's is thrown away. ``copy.deepcopy`` uses a ``__deepcopy__`` found on the instance, so each
    Param gets one: the copies are equal in every attribute and independent in value, the Params stay of
    Airflow's own class (which is what the serializer accepts), and the serialized DAGs are the same
    (``tests/dags/test_dag_integrity.py`` checks all three, on every task of every DAG).

    The one place the shortcut shows: ``Param.dump()`` of a DAG-level Param lists every attribute, this one too,
    and is then not JSON. Airflow 3.3.2 never dumps a DAG file's own Params: the API and the trigger form read the
    serialized DAG (``SerializedParam``), the serializer reads named attributes (``_serialize_param``), and the
    HITL operator dumps its task-level ParamsDict (values only). Copies do not carry the shortcut."""
    for param in params.values():
        if isinstance(param, Param):
            vars(param)["__deepcopy__"] = functools.partial(_copy, param)
    return params


def default_fleet() -> str:
    """``KVFLEET_FLEET``, read now. A bad setting does not hide the DAGs: the Param gets the model's default, this
    logs the error, and every task fails on it (permanently) when it builds its settings."""
    try:
        return load_settings().fleet
    except ConfigError as exc:
        log.error("kvfleet: %s", exc)
        return str(Settings.model_fields["fleet"].default)


def drift_watch_quiet_s() -> float:
    """``KVFLEET_DRIFT_WATCH_QUIET_S``, read now (the drift watch's trigger is made when its DAG file is parsed);
    a bad setting: logged, and the model's default."""
    try:
        return load_settings().drift_watch_quiet_s
    except ConfigError as exc:
        log.error("kvfleet: %s", exc)
        return float(Settings.model_fields["drift_watch_quiet_s"].default)


def fleet_param() -> Param:
    return Param(default_fleet(), type="string", minLength=1, title="Fleet inventory",
                 description="Path of the fleet inventory YAML (inside the Airflow image or on a shared volume). "
                             "Only the configured inventory paths are read (KVFLEET_FLEET_PATHS, by default the "
                             "directory of KVFLEET_FLEET); any other file is refused.")


def scope_params() -> dict[str, Param]:
    return {
        "lobs": Param([], **_NAMES, title="Lines of business",
                      description="LOB names from the inventory. Empty means all."),
        "clusters": Param([], **_NAMES, title="Clusters",
                          description="Cluster names from the inventory. Empty means all."),
        "endpoints": Param([], **_NAMES, title="Endpoints",
                           description="Names or cluster:namespace/name refs. Empty means all."),
    }


def _dry_run(description: str) -> Param:
    return Param(False, type="boolean", title="Dry run", description=description)


def _lock_wait(default: int, maximum: int, title: str) -> Param:
    return Param(default, type="number", minimum=0, maximum=maximum, title=title,
                 description=f"How long to wait for another run's lease on a cluster before failing (0 to "
                             f"{maximum} minutes; 0: fail at once).")


def _prompt_tokens(title: str) -> Param:
    return Param(2000, type="integer", minimum=512, maximum=32768, title=title,
                 description="Tokens of the fresh verification prompt (512 to 32,768). At least two 256-token "
                             "chunks: shorter prompts never write L2.")


def rollout_params() -> dict[str, Any]:
    return _copied_cheaply({
        "fleet": fleet_param(),
        **scope_params(),
        "dry_run": _dry_run("Observe and print the diff of what would change; change nothing."),
        "wave_size": Param(3, type="integer", minimum=1, maximum=500, title="Wave size",
                           description="Endpoints per cluster per wave, after the canary wave (1 to 500)."),
        "max_parallel_clusters": Param(4, type="integer", minimum=1, maximum=64, title="Parallel clusters",
                                       description="Clusters rolled out at the same time (1 to 64)."),
        "canary": Param(True, type="boolean", title="Canary wave",
                        description="One endpoint per LOB per cluster goes first."),
        "bake_minutes": Param(0, type="number", minimum=0, maximum=1440, title="Bake time (minutes)",
                              description="Wait after each wave before the verification gate (0 to 1,440 "
                                          "minutes)."),
        "gate": Param("verify", type="string", enum=["verify", "none"], title="Gate between waves",
                      description="verify: a wave goes on only on verified cross-pod hits; none: no gate."),
        "approval": Param("none", type="string", enum=["none", "after_canary", "every_wave"],
                          title="Human approval",
                          description="Ask a human in Required Actions after the canary wave, after every wave, "
                                      "or never (an inconclusive verification always asks)."),
        "remediate_drift": Param(False, type="boolean", title="Remediate drift found on the way",
                                 description="Fix drift found on the rollout's clusters with the rollout's own "
                                             "reconcilers; off: only record it."),
        "speedup_tolerance": Param(
            0.25, type="number", minimum=0, maximum=1, title="Speedup tolerance",
            description="How far below the published TTFT-speedup curve a fully-hitting endpoint may be and still "
                        "pass (0 to 1; 0.25 = 25 %). The hit ratio is always required."),
        "lock_wait_minutes": _lock_wait(10, 720, "Cluster lock wait (minutes)"),
        "prompt_tokens": _prompt_tokens("Verification prompt length (tokens)"),
    })


def drift_params() -> dict[str, Any]:
    return _copied_cheaply({
        "fleet": fleet_param(),
        "clusters": scope_params()["clusters"],
        "remediate": Param(False, type="boolean", title="Remediate",
                           description="Fix what the rollout's reconcilers can fix (batched safe patch, operator "
                                       "restore, format flags false with --reuse-values), under the cluster lock. "
                                       "Off: only the LOBs with remediate_drift in the inventory are fixed."),
    })


def verification_params() -> dict[str, Any]:
    return _copied_cheaply({
        "fleet": fleet_param(),
        **scope_params(),
        "prompt_tokens": _prompt_tokens("Prompt length (tokens)"),
        "sweep": Param(False, type="boolean", title="Sweep 500…3,000 tokens",
                       description="Record the endpoint's speedup curve beside the published one."),
        "max_parallel": Param(8, type="integer", minimum=1, maximum=32, title="Endpoints verified at once",
                              description="Per cluster, endpoints whose pods share no node are verified at the "
                                          "same time, at most this many (1 to 32; 1: one at a time). Endpoints "
                                          "sharing a node never are."),
    })


def curvine_upgrade_params() -> dict[str, Any]:
    return _copied_cheaply({
        "fleet": fleet_param(),
        "clusters": scope_params()["clusters"],
        "version": Param("", type="string", title="Target chart version",
                         description="The curvine chart version to upgrade to, e.g. 0.3.3-alpha."),
        "overrides": Param({}, type="object", title="Extra value overrides",
                           description="Dotted keys to values, e.g. {\"config.log.level\": \"DEBUG\"}; kvfleet "
                                       "writes them to a values file (-f), never --set. Any key or value touching a "
                                       "format flag (cluster.*format*) is refused, even with approval."),
        "dry_run": _dry_run("Run every gate and print the exact helm command and values diff; change nothing."),
        "approval": Param("auto", type="string", enum=["auto", "always", "never"], title="Human approval",
                          description="auto: required when a selected cluster is production in the inventory."),
        "rollback": Param(True, type="boolean", title="Roll back on failure",
                          description="To the newest earlier revision with every format flag false; never to one "
                                      "with a flag true."),
        "timeout_minutes": Param(15, type="number", minimum=1, maximum=240, title="Rollout timeout (minutes)",
                                 description="How long helm waits for the upgraded release to be ready (1 to 240 "
                                             "minutes)."),
        "expired_files_allowance": Param(0, type="integer", minimum=0, maximum=1_000_000,
                                         title="Files allowed to expire",
                                         description="Post-check: files after >= files before - this (0 to "
                                                     "1,000,000; Curvine TTL). LMCache writes L2 without a TTL."),
        "l2_check": Param("file", type="string", enum=["file", "endpoint"], title="L2-still-serves check",
                          description="file: re-read files written before; endpoint: stage 5 on one endpoint."),
        "lock_wait_minutes": _lock_wait(0, 120, "Wait for the cluster lock (minutes)"),
    })


def curvine_scale_out_params() -> dict[str, Any]:
    return _copied_cheaply({
        "fleet": fleet_param(),
        "clusters": scope_params()["clusters"],
        "target_workers": Param(None, type=["null", "integer"], minimum=1, maximum=1000, title="Target worker count",
                                description="On demand (1 to 1,000). Empty (and all_eligible off): detect, as the "
                                            "schedule does."),
        "all_eligible": Param(False, type="boolean", title="One worker per eligible GPU node",
                              description="On demand: scale to one Curvine worker per GPU node with NVMe."),
        "allow_scale_in": Param(False, type="boolean", title="Allow scale-in",
                                description="Dropping workers drops their cached KV blocks (recomputable, a TTFT "
                                            "hit)."),
        "threshold_percent": Param(80, type="number", minimum=1, maximum=100, title="fs_used/capacity threshold (%)",
                                   description="Scale out when Curvine's fs_used/capacity stays above this (1 to "
                                               "100 %)."),
        "dry_run": _dry_run("Print the exact helm command and values diff; change nothing."),
        "timeout_minutes": Param(15, type="number", minimum=1, maximum=240, title="Timeout (minutes)",
                                 description="How long helm waits for the new workers to be ready (1 to 240 "
                                             "minutes)."),
        "lock_wait_minutes": _lock_wait(0, 120, "Wait for the cluster lock (minutes)"),
    })
