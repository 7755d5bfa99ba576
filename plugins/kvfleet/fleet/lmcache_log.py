"""One tolerant parser for LMCache's log lines (0.3.x and 0.5.x formats, FACTS.md §4.4).

Pure. Used by stage 5 (hit verification) on the vLLM container logs read with ``sinceTime``. Formats changed
between LMCache versions (an optional ``Inference Engine computed tokens`` field, a ``[req_id=...]`` prefix on
store/retrieve lines, ``gb`` vs ``GB``), so every group that moved is optional. A line that mentions LMCache's
keywords but matches no pattern is returned as *garbled*, never raised: a verification reports it instead of
crashing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_LOOKUP = re.compile(
    r"Reqid: (?P<req>[^,]+), Total tokens (?P<total>\d+),"
    r"(?: Inference Engine computed tokens: (?P<computed>\d+),)?"
    r" LMCache hit tokens: (?P<hit>\d+|None)"
    r"(?:, (?:but )?need to load: (?P<load>-?\d+))?"
)
_STORE = re.compile(
    r"(?:\[req_id=(?P<req>[^\]]+)\] )?Stored (?P<stored>\d+) out of total (?P<total>\d+) tokens\."
    r"(?: size: (?P<gb>[\d.]+) (?i:gb),)? cost (?P<ms>[\d.]+) ms(?:, throughput: (?P<tp>[\d.]+) GB/s)?"
)
_RETRIEVE = re.compile(
    r"(?:\[req_id=(?P<req>[^\]]+)\] )?Retrieved (?P<got>\d+) out of (?:total )?(?P<required>\d+)"
    r"(?: required)?(?: tokens)?(?: \(from (?P<total>\d+) total tokens\))?(?: out of total (?P<total2>\d+) tokens)?"
    r"\.?(?: size: (?P<gb>[\d.]+) (?i:gb),)? ?(?:cost (?P<ms>[\d.]+) ms)?(?:, throughput: (?P<tp>[\d.]+) GB/s)?"
)
_ERROR = re.compile(r"LMCache (?:ERROR|WARNING):\s*(?P<msg>.*)")
_KEYWORDS = ("Reqid:", "Stored ", "Retrieved ", "LMCache hit tokens")


@dataclass
class Lookup:
    req_id: str
    total: int
    hit: int | None
    need_to_load: int | None
    computed: int | None = None


@dataclass
class Store:
    req_id: str | None
    stored: int
    total: int
    gb: float | None
    ms: float


@dataclass
class Retrieve:
    req_id: str | None
    got: int
    required: int
    ms: float | None
    gb: float | None


@dataclass
class LogScan:
    lookups: list[Lookup] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    retrieves: list[Retrieve] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    garbled: list[str] = field(default_factory=list)

    def lookup_for(self, req_id: str) -> Lookup | None:
        found = [lk for lk in self.lookups if lk.req_id == req_id]
        return found[-1] if found else None

    def stored_tokens(self, req_id: str | None = None) -> int:
        """Tokens stored (by request id when the format carries it, else every store line in the window)."""
        lines = [s for s in self.stores if req_id is None or s.req_id in (None, req_id)]
        return max((s.stored for s in lines), default=0)

    def retrieve_ms(self, req_id: str | None = None) -> float | None:
        lines = [r for r in self.retrieves if (req_id is None or r.req_id in (None, req_id)) and r.ms is not None]
        return lines[-1].ms if lines else None


def _int(v: str | None) -> int | None:
    return None if v is None or v == "None" else int(v)


def _float(v: str | None) -> float | None:
    return None if v is None else float(v)


def parse_line(line: str, scan: LogScan) -> None:
    if m := _LOOKUP.search(line):
        scan.lookups.append(Lookup(m["req"].strip(), int(m["total"]), _int(m["hit"]), _int(m["load"]),
                                   _int(m["computed"])))
    elif m := _STORE.search(line):
        scan.stores.append(Store(m["req"], int(m["stored"]), int(m["total"]), _float(m["gb"]), float(m["ms"])))
    elif m := _RETRIEVE.search(line):
        scan.retrieves.append(Retrieve(m["req"], int(m["got"]), int(m["required"]), _float(m["ms"]), _float(m["gb"])))
    elif m := _ERROR.search(line):
        scan.errors.append(m["msg"].strip())
    elif "LMCache" in line and any(k in line for k in _KEYWORDS):
        scan.garbled.append(line.strip()[:300])


def parse(lines: Iterable[str] | str) -> LogScan:
    scan = LogScan()
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        parse_line(line, scan)
    return scan
