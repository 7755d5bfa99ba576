"""Prometheus text exposition format (version 0.0.4), read just far enough for kvfleet: samples with labels.

Pure. Used by the L2 advisor (``kvfleet.stages.advise``) on what a vLLM pod serves at ``/metrics``. Bounded: at
most ``MAX_SAMPLES`` samples are kept, and a line that does not parse is skipped, never raised on (a pod's
metrics must not fail a fleet-wide report).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_SAMPLES = 50_000
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _number(raw: str) -> float | None:
    try:
        return float({"+Inf": "inf", "-Inf": "-inf", "NaN": "nan"}.get(raw, raw))
    except ValueError:
        return None


def parse(text: str) -> list[Sample]:
    out: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        value = _number(m["value"])
        if value is None:
            continue
        labels = tuple(sorted(_LABEL.findall(m["labels"] or "")))
        out.append(Sample(m["name"], labels, value))
        if len(out) >= MAX_SAMPLES:
            break
    return out


def total(samples: list[Sample], name: str) -> float | None:
    """Sum of a counter (or gauge) over its label sets; ``name`` with or without the ``_total`` suffix."""
    names = {name, f"{name}_total"} if not name.endswith("_total") else {name, name[: -len("_total")]}
    values = [s.value for s in samples if s.name in names and math.isfinite(s.value)]
    return sum(values) if values else None


def histogram(samples: list[Sample], name: str) -> tuple[list[tuple[float, float]], float | None, float | None]:
    """A histogram's cumulative buckets ``(le, count)`` summed over label sets, its ``_sum`` and ``_count``."""
    buckets: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket":
            le = _number(s.label("le") or "")
            if le is not None:
                buckets[le] = buckets.get(le, 0.0) + s.value
    return sorted(buckets.items()), total(samples, f"{name}_sum"), total(samples, f"{name}_count")
