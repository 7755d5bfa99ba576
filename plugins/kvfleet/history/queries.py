"""Named read queries over the whole history (their SQL lives in ``sql/queries/*.sql``), keyset paging, and the
``--since`` durations of `kvfleet audit`.

Called by `kvfleet audit`, the UI pages and API, the gates' evidence and the stages that read what earlier runs
recorded. Read-only: every write belongs to one aggregate's repository.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from kvfleet.history.clusters import filter_values
from kvfleet.history.db import get_engine
from kvfleet.paths import sql_dir

# Keyset-paged named queries and the columns of their cursor (their ORDER BY).
PAGED: dict[str, tuple[str, ...]] = {
    "verifications_page": ("at", "id"),
    "drift_page": ("first_seen", "id"),
    "open_drift_page": ("first_seen", "cluster", "kind", "id"),
}


# Parameters bound as text[] (every other list or dict is JSON): ``clusters`` is what a cluster filter asks for
# (``kvfleet.history.clusters.filter_values``: a key and, for older rows, its bare name), or NULL for all.
TEXT_ARRAYS = frozenset({"clusters"})


def run_query(engine: Engine, name: str, **params: Any) -> list[dict[str, Any]]:
    """Run ``sql/queries/<name>.sql`` on ``engine`` with bound parameters; returns rows as dicts. A query that
    filters by ``:clusters`` may be given ``cluster`` instead: a key or a bare name, resolved by
    ``kvfleet.history.clusters.filter_values`` (ValueError when it is ambiguous)."""
    sql = (sql_dir() / "queries" / f"{name}.sql").read_text()
    if "cluster" in params and ":clusters" in sql:  # a cluster as text (a key or a bare name): what it asks for
        params = {**params, "clusters": filter_values(engine, params.pop("cluster"))}
    stmt = text(sql)
    for key, value in params.items():
        if key in TEXT_ARRAYS:
            stmt = stmt.bindparams(bindparam(key, type_=ARRAY(Text)))
        elif isinstance(value, dict | list):
            stmt = stmt.bindparams(bindparam(key, type_=JSONB))
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(stmt, params).mappings()]


class Queries:
    """The named queries, on one engine."""

    def __init__(self, engine: Engine | None = None) -> None:
        self.engine = engine or get_engine()

    def rows(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Run ``sql/queries/<name>.sql`` with bound parameters; returns rows as dicts."""
        return run_query(self.engine, name, **params)

    def page(self, name: str, *, limit: int, after: str | None = None,
             **params: Any) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a keyset-paged named query (``PAGED``): at most ``limit`` rows after the cursor ``after``
        (None: the first page), and the cursor of the next page (None when this page is the last). A cursor
        names its query, so one from another query is refused (ValueError)."""
        keys = PAGED[name]
        values = decode_cursor(name, after) if after else [None] * len(keys)
        binds = {**params, **{f"after_{k}": v for k, v in zip(keys, values, strict=True)}, "limit": limit + 1}
        rows = self.rows(name, **binds)
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        return rows, encode_cursor(name, [rows[-1][k] for k in keys])


def encode_cursor(name: str, values: Iterable[Any]) -> str:
    """An opaque page cursor: the query's name and the last row's sort key, as URL-safe base64 of JSON."""
    raw = json.dumps([name, [v.isoformat() if isinstance(v, datetime) else v for v in values]],
                     separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(name: str, cursor: str) -> list[Any]:
    """The sort key a cursor of ``name`` carries; ValueError naming the problem for anything else."""
    keys = PAGED[name]
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        got_name, values = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--after: {cursor[:80]!r} is not a page cursor; pass the 'next' value a previous page "
                         "printed") from exc
    if got_name != name or not isinstance(values, list) or len(values) != len(keys):
        raise ValueError(f"--after: the cursor is for another listing ({str(got_name)[:40]!r}), not {name!r}; pass "
                         "the 'next' value this listing printed")
    return [_cursor_value(key, value) for key, value in zip(keys, values, strict=True)]


def _cursor_value(key: str, value: Any) -> Any:
    if key in ("cluster", "kind") and not isinstance(value, str):
        raise ValueError(f"--after: the cursor's {key} {value!r} is not text; pass the 'next' value a previous "
                         "page printed")
    if key == "id" and (type(value) is not int or not 0 <= value < 2**63):  # bool is an int; ids are bigint
        raise ValueError(f"--after: the cursor's {key} {value!r} is not a row id (a whole number from 0 to "
                         "2^63-1); pass the 'next' value a previous page printed")
    if key in ("at", "first_seen"):
        try:
            return datetime.fromisoformat(str(value))
        except ValueError:
            raise ValueError(f"--after: the cursor's {key} {value!r} is not a time; pass the 'next' value a "
                             "previous page printed") from None
    return value


MAX_SINCE_DAYS = 36_500  # a hundred years: older than any history


def since_to_timedelta(since: str) -> timedelta:
    """'7d', '12h', '30m' -> timedelta. A clear error for anything else."""
    units = {"d": ("days", 1), "h": ("hours", 24), "m": ("minutes", 24 * 60)}
    if len(since) >= 2 and since[:-1].isascii() and since[:-1].isdigit() and since[-1] in units:
        name, per_day = units[since[-1]]
        if int(since[:-1]) > MAX_SINCE_DAYS * per_day:
            raise ValueError(f"--since: {since} is out of range: at most {MAX_SINCE_DAYS}d "
                             f"({MAX_SINCE_DAYS * per_day}{since[-1]}); use a smaller duration")
        return timedelta(**{name: int(since[:-1])})
    raise ValueError(f"--since: {since!r} is not a duration like 7d, 12h or 30m")


def since_cutoff(since: str, now: datetime) -> datetime:
    return now - since_to_timedelta(since)
