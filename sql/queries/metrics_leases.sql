-- Metrics (/kvfleet/metrics): the cluster leases in place (one row per leased name: a cluster, or a run's
-- parallelism slot), with the DAG of the holder (a run key is dag_id/run_id), the lease's state (active, parked)
-- and whether its ttl is still running by the database's clock.
SELECT cluster, split_part(holder, '/', 1) AS holder_dag, state, expires_at, expires_at > now() AS live
FROM cluster_locks
ORDER BY cluster
