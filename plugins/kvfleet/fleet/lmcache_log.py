"""One tolerant parser for LMCache's log lines, and the join of those lines to a client's request.

Pure. Used by stage 5 (hit verification) on the vLLM container logs read with ``sinceTime``.

What a real line looks like (tests/conformance/facts/lmcache_vllm_logs.yaml names each source):
- LMCache's ``CustomFormatter`` (``lmcache/logging.py``, 0.3.9.post2 and 0.5.6) wraps the level prefix and the
  location suffix in ANSI colour codes: ``\\x1b[32;20m[<asctime>] LMCache INFO:\\x1b[0m <message>
  \\x1b[3m(<file>:<line>:<logger>)\\x1b[0m``. Codes are stripped before matching, and error messages are returned
  without them (and without the location suffix).
- vLLM's engine-core process prefixes every line it writes with ``(EngineCore_DP0 pid=<n>) `` (coloured on a tty).
- Formats changed between LMCache versions: an optional ``Inference Engine computed tokens`` field (0.5.x), a
  ``[req_id=<id>]`` prefix on store/retrieve lines (0.5.x; ``[req_id=<id> kv_group=<n>]`` on main after 0.5.6),
  ``gb`` vs ``GB``. Every group that moved is optional.
- The id LMCache logs is vLLM's *engine* request id, never the id the client sees in the SSE stream: the
  completion endpoint runs prompt ``i`` as ``f"{request_id}-{i}"`` and newer vLLM appends ``-<8 random chars>``
  (``InputProcessor.assign_request_id``); chat runs its one prompt as the request id itself (plus the suffix).
  :func:`joins` is that rule and nothing looser: ``cmpl-ab`` never matches ``cmpl-abc-0``.
- 0.3.x store/retrieve lines carry no id at all; such a line is attributed to the request of the latest lookup
  line before it in the same log (LMCache stores and retrieves a request after looking it up). With concurrent
  traffic on the pod that attribution can be wrong, so an id-less line never counts for a request whose lookup
  line is not the latest one before it.

A line that mentions LMCache's keywords but matches no pattern is returned as *garbled*, never raised: a
verification reports it instead of crashing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOCATION = re.compile(r"\s*\([\w.\-]+\.py:\d+:[\w.\-]+\)\s*$")  # CustomFormatter's (file:line:logger) suffix
_REQ_PREFIX = r"(?:\[req_id=(?P<req>[^\]\s]+)(?: kv_group=(?P<kv_group>[^\]\s]*))?\] )?"
_LOOKUP = re.compile(
    r"Reqid: (?P<req>[^,]+), Total tokens (?P<total>\d+),"
    r"(?: Inference Engine computed tokens: (?P<computed>\d+),)?"
    r" LMCache hit tokens: (?P<hit>\d+|None)"
    r"(?:, (?:but )?need to load: (?P<load>-?\d+))?"
)
_STORE = re.compile(
    _REQ_PREFIX + r"Stored (?P<stored>\d+) out of total (?P<total>\d+) tokens\."
    r"(?: size: (?P<gb>[\d.]+) (?i:gb),)? cost (?P<ms>[\d.]+) ms(?:, throughput: (?P<tp>[\d.]+) GB/s)?"
)
_RETRIEVE = re.compile(
    _REQ_PREFIX + r"Retrieved (?P<got>\d+) out of (?:total )?(?P<required>\d+)"
    r"(?: required)?(?: tokens)?(?: \(from (?P<total>\d+) total tokens\))?(?: out of total (?P<total2>\d+) tokens)?"
    r"\.?(?: size: (?P<gb>[\d.]+) (?i:gb),)? ?(?:cost (?P<ms>[\d.]+) ms)?(?:, throughput: (?P<tp>[\d.]+) GB/s)?"
)
_ERROR = re.compile(r"LMCache (?:ERROR|WARNING|CRITICAL):\s*(?P<msg>.*)")
# LMCache lines that carry a keyword but are not lookups (0.5.6 debug: the chunked-load cap); recognised, ignored.
_IGNORED = re.compile(r"Reqid: [^,]+, Chunked KV loading")
_KEYWORDS = ("Reqid:", "Stored ", "Retrieved ", "LMCache hit tokens")
# The engine id's suffixes after the client's id: prompt index, then vLLM's 8 random characters (either optional).
_ENGINE_SUFFIX = re.compile(r"(?:-\d+)?(?:-[0-9A-Za-z]{8})?")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def joins(client_id: str, engine_id: str | None) -> bool:
    """Whether a logged (engine) request id belongs to the client's request id (the SSE ``id``): equal, or the
    client id followed by ``-<digits>`` and/or ``-<8 chars>`` and nothing else."""
    if not engine_id or not client_id:
        return False
    if engine_id == client_id:
        return True
    if not engine_id.startswith(client_id + "-"):
        return False
    return _ENGINE_SUFFIX.fullmatch(engine_id[len(client_id):]) is not None


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
    owner: str | None = None  # req_id, or (0.3.x, no id in the line) the latest lookup's id before it
    kv_group: str | None = None


@dataclass
class Retrieve:
    req_id: str | None
    got: int
    required: int
    ms: float | None
    gb: float | None
    owner: str | None = None
    kv_group: str | None = None


@dataclass
class LogScan:
    lookups: list[Lookup] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)
    retrieves: list[Retrieve] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    garbled: list[str] = field(default_factory=list)
    _last_lookup: str | None = None

    def lookup_for(self, req_id: str) -> Lookup | None:
        """The latest lookup line of the client's request ``req_id`` (its SSE id; engine ids join, see ``joins``)."""
        found = [lk for lk in self.lookups if joins(req_id, lk.req_id)]
        return found[-1] if found else None

    def stored_tokens(self, req_id: str | None = None) -> int:
        """Tokens stored for the client's request (every store line of it, summed: chunked prefill stores in
        several calls); ``None``: every store line in the window."""
        return sum(s.stored for s in self.stores if req_id is None or joins(req_id, s.owner))

    def retrieve_ms(self, req_id: str | None = None) -> float | None:
        lines = [r for r in self.retrieves if (req_id is None or joins(req_id, r.owner)) and r.ms is not None]
        return lines[-1].ms if lines else None


def _int(v: str | None) -> int | None:
    return None if v is None or v == "None" else int(v)


def _float(v: str | None) -> float | None:
    return None if v is None else float(v)


def parse_line(line: str, scan: LogScan) -> None:
    line = strip_ansi(line)
    if _IGNORED.search(line):
        return
    if m := _LOOKUP.search(line):
        req = m["req"].strip()
        scan.lookups.append(Lookup(req, int(m["total"]), _int(m["hit"]), _int(m["load"]), _int(m["computed"])))
        scan._last_lookup = req
    elif m := _STORE.search(line):
        scan.stores.append(Store(m["req"], int(m["stored"]), int(m["total"]), _float(m["gb"]), float(m["ms"]),
                                 owner=m["req"] or scan._last_lookup, kv_group=m["kv_group"]))
    elif m := _RETRIEVE.search(line):
        scan.retrieves.append(Retrieve(m["req"], int(m["got"]), int(m["required"]), _float(m["ms"]),
                                       _float(m["gb"]), owner=m["req"] or scan._last_lookup,
                                       kv_group=m["kv_group"]))
    elif m := _ERROR.search(line):
        scan.errors.append(_LOCATION.sub("", m["msg"]).strip())
    elif "LMCache" in line and any(k in line for k in _KEYWORDS):
        scan.garbled.append(line.strip()[:300])


def parse(lines: Iterable[str] | str) -> LogScan:
    scan = LogScan()
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        parse_line(line, scan)
    return scan
