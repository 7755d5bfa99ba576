"""The named queries the kvfleet page may run, and how a request's query string binds their parameters.

Called by ``kvfleet.airflow.ui.app`` (the generic ``/api/queries/{name}`` route) and ``kvfleet.airflow.ui.pages``
(the views). Every query is a file in ``sql/queries/`` run through ``Queries.rows`` — the same named queries
the CLI's ``kvfleet audit`` runs — so a figure on the page and the CLI's ``--json`` come from the same SQL.

A new named query plugs in by existing: the catalog lists the folder, reads the bind parameters the SQL names
(``:clusters``, ``:cutoff``…) and fills each from the request (``since`` becomes ``cutoff``, ``cluster`` the values
``clusters`` asks for), a default, or NULL.
Values are always bound, never formatted into SQL. Names are checked against the folder's files, so a request
cannot name a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from kvfleet.history.clusters import filter_values
from kvfleet.history.queries import since_to_timedelta
from kvfleet.paths import sql_dir

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# SQLAlchemy's text() bind syntax: ":name", not "::cast" and not a "\:" escape.
BIND = re.compile(r"(?<![:\w\\]):(\w+)(?!:)")
DEFAULT_SINCE = "30d"
MAX_LIMIT = 5000
DEFAULT_LIMIT = 500
MAX_TEXT = 253  # the longest DNS name (a Kubernetes object name): no cluster, LOB or endpoint is longer
MAX_SINCE_CHARS = 12  # "36500d" and its hours and minutes fit
SHOWN_CHARS = 40  # how much of a refused value an error message quotes
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # PostgreSQL refuses NUL in text; no filter needs any of them
TEXT_PARAMS = ("cluster", "lob", "endpoint", "run_key", "dag_id", "kind", "status", "after")  # after: a page cursor


class QueryError(ValueError):
    """A request the catalog refuses; ``status`` is the HTTP status to answer with (400 or 404)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def queries_dir() -> Path:
    return sql_dir() / "queries"


def available() -> list[str]:
    return sorted(p.stem for p in queries_dir().glob("*.sql"))


def exists(name: str) -> bool:
    return bool(NAME.match(name)) and (queries_dir() / f"{name}.sql").is_file()


def _without_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def bind_names(name: str) -> list[str]:
    if not exists(name):
        raise QueryError(f"query {name!r}: no such named query; one of: {', '.join(available())}", status=404)
    sql = _without_comments((queries_dir() / f"{name}.sql").read_text())
    return list(dict.fromkeys(BIND.findall(sql)))


def description(name: str) -> str:
    """The leading ``--`` comment of the query file."""
    lines = []
    for line in (queries_dir() / f"{name}.sql").read_text().splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].strip())
    return " ".join(lines)


@dataclass(frozen=True)
class Filters:
    """What a request asks for, validated. ``since`` is a duration like 7d, 12h or 30m."""

    since: str = DEFAULT_SINCE
    limit: int = DEFAULT_LIMIT
    text: Mapping[str, str | None] | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str], *, default_since: str = DEFAULT_SINCE) -> Filters:
        """The filters of a request's query string; a QueryError (400) naming the parameter, its value (shortened),
        what is allowed and what to do, for any value the page cannot use."""
        return cls(since=_since(query.get("since") or default_since), limit=_limit(query.get("limit")),
                   text={key: _text(key, query.get(key)) for key in TEXT_PARAMS})

    def get(self, key: str) -> str | None:
        return (self.text or {}).get(key)

    def clusters(self, engine: Any) -> list[str] | None:
        """What the request's ``cluster`` asks for (``kvfleet.history.clusters``); None without one. A QueryError
        (400) when it is ambiguous or not a cluster's name or key."""
        try:
            return filter_values(engine, self.get("cluster"), field="cluster")
        except ValueError as exc:
            raise QueryError(str(exc)) from None

    def cutoff(self, now: datetime | None = None) -> datetime:
        return (now or datetime.now(UTC)) - since_to_timedelta(self.since)

    def binds(self, name: str, now: datetime | None = None, *, engine: Any = None,
              **overrides: Any) -> dict[str, Any]:
        """The values for every parameter the query's SQL names: overrides, then the request, then NULL. The
        request's ``cluster`` (a key or a bare name) becomes the ``clusters`` it asks for, read on ``engine``."""
        values: dict[str, Any] = {}
        for key in bind_names(name):
            if key in overrides:
                values[key] = overrides[key]
            elif key == "clusters":
                values[key] = self.clusters(engine)
            elif key == "cutoff":
                values[key] = self.cutoff(now)
            elif key == "limit":
                values[key] = self.limit
            else:
                values[key] = self.get(key)
        return values


def shown(value: str) -> str:
    """A request's value as an error message quotes it: ``repr`` (control characters escaped), cut to
    ``SHOWN_CHARS`` characters, with its length when cut."""
    if len(value) <= SHOWN_CHARS:
        return repr(value)
    return f"{value[:SHOWN_CHARS]!r}… ({len(value):,} characters)"


def _since(since: str) -> str:
    if len(since) <= MAX_SINCE_CHARS:
        try:
            since_to_timedelta(since)
            return since
        except ValueError as exc:
            reason = str(exc).removeprefix("--since: ")
            if "out of range" in reason:  # a duration, too long: the history's own limit, said with the value
                raise QueryError(f"since: {reason}") from None
    raise QueryError(f"since: {shown(since)} is not a duration: a whole number (ASCII digits) and d, h or m, e.g. "
                     "7d, 12h or 30m; use one, or leave since out for the view's default")


def _limit(raw: str | None) -> int:
    value = raw or str(DEFAULT_LIMIT)
    # ASCII digits only: str.isdigit() also accepts "²" and "٣", which int() refuses; and a bounded length, as
    # int() refuses more than 4,300 digits
    if value.isascii() and value.isdigit() and len(value) <= len(str(MAX_LIMIT)) and 1 <= int(value) <= MAX_LIMIT:
        return int(value)
    raise QueryError(f"limit: {shown(value)} is not a whole number from 1 to {MAX_LIMIT}; use one in that range "
                     f"(ASCII digits), or leave limit out for {DEFAULT_LIMIT}")


def _text(key: str, raw: str | None) -> str | None:
    value = (raw or "").strip()
    if len(value) > MAX_TEXT:
        raise QueryError(f"{key}: {shown(value)} is longer than {MAX_TEXT} characters; shorten it")
    if bad := CONTROL.search(value):
        raise QueryError(f"{key}: {shown(value)} has a control character (U+{ord(bad[0]):04X}) at position "
                         f"{bad.start()}; {key} takes printable text of at most {MAX_TEXT} characters: remove it")
    return value or None


def run(history: Any, name: str, filters: Filters, **overrides: Any) -> list[dict[str, Any]]:
    return list(history.queries.rows(name, **filters.binds(name, engine=history.engine, **overrides)))


def jsonable(value: Any) -> Any:
    """Rows -> JSON: times as ISO 8601, intervals as seconds, decimals as floats."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    return value
