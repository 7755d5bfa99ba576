"""Clusters named by their key, ``account/region/name`` (``kvfleet.fleet.cluster_ref.ClusterRef``).

Every history table that names a cluster (step events, verifications, capacity snapshots, Curvine releases, drift
findings and watches, and the cluster leases) holds the cluster's key instead of its bare name, so two accounts'
``ml-prod`` clusters stay apart. Rows written before are given the key their run's pinned inventory (revision
0010) gives the name, or the one key every pinned inventory gives it; a name no snapshot settles stays as it is,
and is read as the cluster of that name in the base identity's own account (``kvfleet.history.clusters``). A
lease held across the upgrade is keyed as its holder will ask for it. Drift fingerprints are computed again from
the key. ``audit_log`` rows are not rewritten: each row's hash covers its cluster, so the chain still verifies.

Revision ID: 0011_cluster_keys
Revises: 0010_pinned_inventory
"""

from kvfleet.history.migrate import run_sql_file

revision = "0011_cluster_keys"
down_revision = "0010_pinned_inventory"


def upgrade() -> None:
    run_sql_file("0011_cluster_keys.up.sql")


def downgrade() -> None:
    run_sql_file("0011_cluster_keys.down.sql")
