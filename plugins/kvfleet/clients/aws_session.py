"""The AWS session factory kvfleet's processes run with: boto3 sessions that share one botocore data loader.

Each new boto3 session builds its own botocore loader, and the first client of a service decodes that service's
model JSON, its paginators and the endpoint rules again: about 0.13 s of CPU for a SageMaker client, where a
client of a session sharing the loader takes about 0.01 s (measured on botocore 1.44.8). A process that builds
clients again and again paid it each time: ``dag.test()`` (so ``kvfleet demo`` and the test suite) and a worker
process that runs several tasks. A task process that builds its few clients once saves little; the triggerer's
deferrable waits use aiobotocore sessions, which this leaves alone. Airflow's AWS provider already shares one
loader between its async sessions for the same reason (``airflow/providers/amazon/aws/hooks/base_aws.py``,
``_loader``, apache-airflow-providers-amazon 9.39.0; boto/botocore#3078); this does the same for the boto3
sessions of the AWS hook.

How it is chosen: Airflow's documented ``[aws] session_factory`` option (``AIRFLOW__AWS__SESSION_FACTORY=
kvfleet.clients.aws_session.SharedLoaderSessionFactory``), read once when the provider's ``base_aws`` module is
imported. ``kvfleet_local.env.airflow_env`` sets it for the demo, ``make up`` and the suite; a deployment sets it
in its Airflow configuration (docs/operations.md). Without it, nothing changes but the CPU each client costs.

What is shared: the loader's decoded, read-only model data, between sessions whose loaders search the same paths
in the same order (a changed ``AWS_DATA_PATH`` gets its own loader). botocore already shares it between the
clients of one session (``botocore/loaders.py``, ``instance_cache``); credentials, region, endpoint, config and
event hooks stay each session's own. Not covered: the STS client an assume-role connection builds on its base
session, and boto3's resource models (``boto3.Session._loader``), which kvfleet does not use.

The one internal: a boto3 session exposes its botocore session only as ``_session`` (boto3 1.44.8,
``boto3/session.py``); ``register_component("data_loader", ...)`` is botocore's public component registry.
``tests/unit/test_aws_session.py`` pins both.

Nothing in kvfleet imports this module: ``base_aws`` imports it while it is itself being imported (its last line
resolves the factory), so this module may import from ``base_aws`` only what is defined above that line. The
other way round fails: importing this module first, with the option set, has ``base_aws`` resolve the factory
while this module is half-initialised (tests import ``base_aws`` first).
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from airflow.providers.amazon.aws.hooks.base_aws import BaseSessionFactory

_lock = threading.Lock()
_shared: dict[tuple[str, ...], Any] = {}  # one loader per list of search paths, the first one built for it


def share_loader(session: Any) -> Any:
    """``session`` (a boto3 session) with its botocore session using the process's loader for the same search
    paths (``AWS_DATA_PATH``, ``~/.aws/models``, botocore's and boto3's data, in the session's own order: a model
    found earlier on the path still wins); returned for chaining. Anything else (an aiobotocore session of a
    deferrable hook) is returned unchanged."""
    if isinstance(session, boto3.session.Session):
        own = session._session.get_component("data_loader")
        with _lock:
            shared = _shared.setdefault(tuple(own.search_paths), own)
        session._session.register_component("data_loader", shared)
    return session


class SharedLoaderSessionFactory(BaseSessionFactory):
    """Airflow's session factory, unchanged but for the shared loader (the module docstring)."""

    def create_session(self, deferrable: bool = False) -> Any:
        return share_loader(super().create_session(deferrable=deferrable))
