"""The AWS session factory kvfleet's processes run with: boto3 sessions that share one botocore data loader.

Each new boto3 session builds its own botocore loader, and the first client of a service decodes that service's
model JSON, its paginators and the endpoint rules again: about 0.13 s of CPU for a SageMaker client, where a
client of a session sharing the loader takes about 0.01 s (measured on botocore 1.44.8). A process that builds
clients again and again (``dag.test()``, so ``kvfleet demo`` and the test suite, and the triggerer, whose
trigger threads build their own) paid it each time. Airflow's AWS provider already shares one loader between
its async sessions for the same reason (``airflow/providers/amazon/aws/hooks/base_aws.py``, ``_loader``,
apache-airflow-providers-amazon 9.39.0; boto/botocore#3078); this does the same for the boto3 sessions of the
AWS hook.

How it is chosen: Airflow's documented ``[aws] session_factory`` option (``AIRFLOW__AWS__SESSION_FACTORY=
kvfleet.clients.aws_session.SharedLoaderSessionFactory``), read once when the provider's ``base_aws`` module is
imported. ``kvfleet_local.env.airflow_env`` sets it for the demo, ``make up`` and the suite; a deployment sets it
in its Airflow configuration (docs/operations.md). Without it, nothing changes but the CPU each client costs.

What is shared: the loader's decoded, read-only model data. botocore already shares it between the clients of
one session (``botocore/loaders.py``, ``instance_cache``), and never between credentials: every session keeps
its own credentials, region, config and event hooks.

The one internal: a boto3 session exposes its botocore session only as ``_session`` (boto3 1.44.8,
``boto3/session.py``); ``register_component("data_loader", ...)`` is botocore's public component registry.
``tests/unit/test_aws_session.py`` pins both.

Nothing in kvfleet imports this module: ``base_aws`` imports it while it is itself being imported (its last line
resolves the factory), so this module may import from ``base_aws`` only what is defined above that line.
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
import botocore.loaders
from airflow.providers.amazon.aws.hooks.base_aws import BaseSessionFactory

_lock = threading.Lock()
_shared: botocore.loaders.Loader | None = None


def shared_loader() -> botocore.loaders.Loader:
    """The process's one loader, with botocore's search paths and boto3's own data directory (which a boto3
    session adds to its loader for resource models)."""
    global _shared
    with _lock:
        if _shared is None:
            loader = botocore.loaders.create_loader()
            probe = boto3.session.Session()._session.get_component("data_loader")
            for path in probe.search_paths:
                if path not in loader.search_paths:
                    loader.search_paths.append(path)
            _shared = loader
        return _shared


def share_loader(session: Any) -> Any:
    """``session`` (a boto3 session) with its botocore session using the shared loader; returned for chaining.
    Anything else (an aiobotocore session of a deferrable hook) is returned unchanged."""
    if isinstance(session, boto3.session.Session):
        session._session.register_component("data_loader", shared_loader())
    return session


class SharedLoaderSessionFactory(BaseSessionFactory):
    """Airflow's session factory, unchanged but for the shared loader (the module docstring)."""

    def create_session(self, deferrable: bool = False) -> Any:
        return share_loader(super().create_session(deferrable=deferrable))
