"""DAG Params with JSON-schema validation, so the trigger form in the UI is usable and bad input is refused
before anything changes. Imported by the DAG files (cheap: no I/O)."""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import Param

DEFAULT_FLEET = os.environ.get("KVFLEET_FLEET", "fleet.example.yaml")

_NAMES = {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9][-A-Za-z0-9:/._]*$"}}


def fleet_param() -> Param:
    return Param(DEFAULT_FLEET, type="string", minLength=1, title="Fleet inventory",
                 description="Path of the fleet inventory YAML (inside the Airflow image or on a shared volume).")


def scope_params() -> dict[str, Param]:
    return {
        "lobs": Param([], **_NAMES, title="Lines of business", description="Empty means all."),
        "clusters": Param([], **_NAMES, title="Clusters", description="Empty means all."),
        "endpoints": Param([], **_NAMES, title="Endpoints",
                           description="Names or cluster:namespace/name refs. Empty means all."),
    }


def rollout_params() -> dict[str, Any]:
    return {
        "fleet": fleet_param(),
        **scope_params(),
        "dry_run": Param(False, type="boolean", title="Dry run",
                         description="Observe and print the diff of what would change; change nothing."),
        "wave_size": Param(3, type="integer", minimum=1, maximum=500, title="Wave size",
                           description="Endpoints per cluster per wave, after the canary wave."),
        "max_parallel_clusters": Param(4, type="integer", minimum=1, maximum=64, title="Parallel clusters"),
        "canary": Param(True, type="boolean", title="Canary wave",
                        description="One endpoint per LOB per cluster goes first."),
        "bake_minutes": Param(0, type="number", minimum=0, maximum=1440, title="Bake time (minutes)",
                              description="Wait after each wave before the verification gate."),
        "gate": Param("verify", type="string", enum=["verify", "none"], title="Gate between waves"),
        "approval": Param("none", type="string", enum=["none", "after_canary", "every_wave"],
                          title="Human approval"),
        "remediate_drift": Param(False, type="boolean", title="Remediate drift found on the way"),
        "speedup_tolerance": Param(
            0.25, type="number", minimum=0, maximum=1, title="Speedup tolerance",
            description="How far below the published TTFT-speedup curve a fully-hitting endpoint may be and still "
                        "pass (0.25 = 25 %). The hit ratio is always required."),
        "lock_wait_minutes": Param(10, type="number", minimum=0, maximum=720, title="Cluster lock wait (minutes)",
                                   description="How long to wait for another run's lease on a cluster before failing."),
        "prompt_tokens": Param(2000, type="integer", minimum=512, maximum=32768,
                               title="Verification prompt length (tokens)"),
    }
