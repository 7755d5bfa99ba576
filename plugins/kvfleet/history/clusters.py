"""How the history names a cluster, and what a query asks for when it filters by one.

Every history row names its cluster by its key, ``account/region/name`` (``kvfleet.fleet.cluster_ref``; history
revision 0011). Rows written before that revision whose run's pinned inventory could not settle the key keep
the bare name: such a row is read as the cluster of that name in the base identity's own account, the only
account kvfleet reached then. The audit log is never rewritten, so its older rows name clusters that way too.

So a query filtered by a cluster asks for a list of values (``cluster = ANY(:clusters)``):
- a key asks for itself, and, for a cluster in the base identity's account (``default/...``), its bare name;
- a bare name asks for the keys the history holds rows of by that name (named query ``ui_clusters``), and the
  bare name. When two keys share the name, the text is ambiguous and refused with their keys listed, as the
  inventory refuses it (``cluster_ref.ambiguity``).
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from kvfleet.fleet.cluster_ref import DEFAULT_ACCOUNT, ClusterRef
from kvfleet.paths import sql_dir

MAX_TEXT = 200  # longer than any key (12 + 1 + 25 + 1 + 63)

# Every cluster the history holds rows of (the kvfleet page's cluster picker: a few index probes per table).
_KNOWN = (sql_dir() / "queries" / "ui_clusters.sql").read_text()


class AmbiguousCluster(ValueError):
    """A bare name the history knows in several accounts or regions."""


def values_of(ref: ClusterRef) -> list[str]:
    """What the history may call ``ref``: its key, and its bare name when it is in the base identity's account."""
    return [ref.key, ref.name] if ref.account == DEFAULT_ACCOUNT else [ref.key]


def history_values(value: str) -> list[str]:
    """What the history may call the cluster ``value`` names: ``values_of`` its key, or the text itself."""
    ref = parse_key(value)
    return values_of(ref) if ref is not None else [value]


def parse_key(value: str) -> ClusterRef | None:
    """The reference a key names; None for anything that is not ``account/region/name`` with three parts."""
    parts = value.split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return ClusterRef(*parts)


def filter_values(engine: Engine, value: str | None, *, field: str = "--cluster") -> list[str] | None:
    """The values a filter on ``value`` (a key or a bare name) asks for; None without a filter. ValueError naming
    ``field`` for text that is neither, AmbiguousCluster when a bare name has several keys."""
    if value is None or value == "":
        return None
    if len(value) > MAX_TEXT:
        raise ValueError(f"{field}: {value[:40]!r}... is {len(value)} characters; a cluster's key is at most "
                         f"{MAX_TEXT}: give its key account/region/name or its name")
    ref = parse_key(value)
    if ref is not None and not (ref.account == DEFAULT_ACCOUNT or (ref.account.isascii() and ref.account.isdigit()
                                                                   and len(ref.account) == 12)):
        raise ValueError(f"{field}: {value!r} names its account {ref.account!r} by the inventory's name; the history "
                         "keys a cluster by the account's 12-digit id (or `default`): give "
                         f"<account id>/{ref.region}/{ref.name}, as the listings print it")
    if ref is not None:
        return values_of(ref)
    if "/" in value:
        raise ValueError(f"{field}: {value!r} is neither a cluster's name nor its key account/region/name "
                         "(three parts)")
    with engine.connect() as conn:
        known = [str(r.cluster) for r in conn.execute(text(_KNOWN))]
    keys = sorted(k for k in known if (ref := parse_key(k)) is not None and ref.name == value)
    if value in known and keys and not any(k.startswith(f"{DEFAULT_ACCOUNT}/") for k in keys):
        keys.append(f"{value} (older rows, of the base identity's account)")  # a cluster of its own: ambiguous
    if len(keys) > 1:
        raise AmbiguousCluster(f"{field}: {value!r} names {len(keys)} clusters in the history ({', '.join(keys)}); "
                               "give the cluster's key account/region/name")
    return [*keys, value]
