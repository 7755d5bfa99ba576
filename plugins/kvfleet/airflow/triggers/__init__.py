"""Triggers: kvfleet's waits and its drift watch run in Airflow's triggerer, not in a worker slot.

One module per family, each imported by its full path (this package re-exports nothing):

- ``lease``: ``LeaseFreeTrigger``, a cluster lease or a parallelism slot free (the rollout, ``self.defer()``);
- ``readiness``: ``ClusterReadyTrigger`` (a HyperPod cluster InService, an EKS add-on ACTIVE) and
  ``KubeReadyTrigger`` (a Kubernetes readiness check of ``kvfleet.stages.readiness``);
- ``kube_watch``: ``KubeWatchTrigger``, the drift watch of one cluster (its rules: ``kvfleet.fleet.watch_rules``);
- ``fleet_watch``: ``FleetWatchTrigger``, a ``KubeWatchTrigger`` per inventory cluster, inside the
  ``AssetWatcher`` of ``dags/kvfleet_drift_watch.py``, and the readers of its events for that DAG's runs;
- ``events``: the event statuses and the classpath every trigger serializes.

The bake needs no trigger of ours: it is Airflow's own ``DateTimeTrigger``.

Shapes follow the real sources installed here (apache-airflow-core 3.3.2, apache-airflow-providers-amazon
9.39.0, -cncf-kubernetes 10.25.0, -standard 1.21.0), docs/reference/airflow.md:
- ``airflow/triggers/base.py``: ``serialize()`` returns ``(classpath, kwargs)`` that re-create the trigger;
  ``run()`` is an async generator of ``TriggerEvent``; a ``BaseEventTrigger`` (event-driven scheduling) is
  identified by the hash of its classpath and kwargs, so its kwargs must not change while it runs, and the
  triggerer injects ``asset_state_store`` (``AssetStateStoreAccessors``) before ``run()`` — the place a watcher
  keeps its watermark across triggerer restarts (``airflow/jobs/triggerer_job_runner.py``). An event becomes an
  asset event with ``extra={"from_trigger": True, "payload": ...}`` (``airflow/models/trigger.py``).
- ``airflow/providers/amazon/aws/triggers/base.py`` (``AwsBaseWaiterTrigger``) and
  ``airflow/providers/cncf/kubernetes/triggers/pod.py`` (``KubernetesPodTrigger``): poll with ``asyncio.sleep``
  between checks, yield one event carrying ``status`` (``success`` / ``error``) and a message, and let the
  operator's resume method turn ``error`` into a failure.
- ``kubernetes/watch/watch.py`` (kubernetes 36.0.3): with ``timeout_seconds`` set, a 410 in the stream raises
  ``ApiException(410)`` instead of retrying, so the re-list is ours.

Blocking clients (SQLAlchemy, boto3, the official kubernetes client) run in threads (``asyncio.to_thread`` or a
daemon thread feeding an ``asyncio.Queue``), never on the triggerer's event loop. Heavy modules are imported
inside ``run()`` only: the DAG file that builds a ``FleetWatchTrigger`` stays lean at parse time.
"""
