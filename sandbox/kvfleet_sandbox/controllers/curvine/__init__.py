"""Curvine, simulated, in two parts: ``model`` (master and workers, format flags, L2 availability, block
placement, pod logs; no HTTP code) and ``master_http`` (the master's web API through the API server's pod proxy).
See ``model``'s docstring for what is simulated and why.

Attached to every cluster twin by ``kvfleet_sandbox.runtime`` (``attach(twin)``); the probe hooks are
``twin.services["curvine"]``, the :class:`CurvineSimulation`.
"""

from __future__ import annotations

from kvfleet_sandbox.controllers.curvine.master_http import CurvineMasterApi
from kvfleet_sandbox.controllers.curvine.model import (
    BLOCK_SIZE,
    ENV_FAULT,
    ENV_FORMAT_JOURNAL,
    ENV_FORMAT_MASTER,
    ENV_FORMAT_WORKER,
    CurvineSimulation,
    component_of,
    config_of,
    data_dir_sizes,
    size_bytes,
)
from kvfleet_sandbox.twin import ClusterTwin


def attach(twin: ClusterTwin) -> CurvineSimulation:
    sim = CurvineSimulation(twin)
    CurvineMasterApi(sim)
    return sim


__all__ = ["BLOCK_SIZE", "ENV_FAULT", "ENV_FORMAT_JOURNAL", "ENV_FORMAT_MASTER", "ENV_FORMAT_WORKER",
           "CurvineMasterApi", "CurvineSimulation", "attach", "component_of", "config_of", "data_dir_sizes",
           "size_bytes"]
