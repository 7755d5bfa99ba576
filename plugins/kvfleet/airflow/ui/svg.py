"""Server-rendered SVG plots for the kvfleet page: an XY chart (time or numeric x) and a timeline of intervals.

Pure: rows in, markup out. Called by ``kvfleet.airflow.ui.pages``. Each chart's geometry (scales, ticks, points)
is computed here; its markup is a template under ``templates/svg/`` rendered with autoescape, so a title, a series
name or a tooltip from the history is escaped wherever it lands. Nothing is fetched at run time and no script
runs in the browser: every plot is inline SVG, every plotted point carries its values (``data-x``/``data-y`` and a
``<title>`` tooltip), and every page also shows the same figures as a table, so the page reads without SVG too.

LOB colours come from :class:`LobColours`: a fixed, colour-blind-safe palette (Okabe & Ito's, then a few more)
assigned in the sorted order of every LOB the history knows, so a LOB has the same colour on every view.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

from kvfleet.airflow.ui.templating import render

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#8C564B", "#7F7F7F", "#B8860B",
           "#1B9E77")
PUBLISHED_COLOUR = "#222222"


class LobColours:
    """LOB -> colour, stable across views: the position of the LOB in the sorted list of all known LOBs; a LOB
    not in that list (written after the list was read) falls back to a hash of its name."""

    def __init__(self, lobs: Iterable[str | None]) -> None:
        self._index = {lob: i for i, lob in enumerate(sorted({lob for lob in lobs if lob}))}

    def __call__(self, lob: str | None) -> str:
        if not lob:
            return "#999999"
        if lob in self._index:
            return PALETTE[self._index[lob] % len(PALETTE)]
        digest = int(hashlib.sha1(lob.encode()).hexdigest(), 16)
        return PALETTE[digest % len(PALETTE)]

    def legend_html(self) -> Markup:
        return render("legend.html", items=[(lob, self(lob)) for lob in self._index])


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    points: Sequence[tuple[float, float]]
    line: bool = True
    dashed: bool = False
    marker: str = "circle"  # circle | square | none
    opacity: float = 1.0


@dataclass(frozen=True)
class Axis:
    label: str
    time: bool = False  # values are POSIX seconds
    lo: float | None = None
    hi: float | None = None
    fmt: str = "{:g}"


@dataclass(frozen=True)
class Bar:
    row: str
    start: float  # POSIX seconds
    end: float | None  # None: still open
    colour: str
    label: str
    hatched: bool = False
    extra: dict[str, str] = field(default_factory=dict)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def time_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    span = max(hi - lo, 1.0)
    steps = (10, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400,
             7 * 86400, 30 * 86400)
    step = next((s for s in steps if span / s <= count), steps[-1])
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) // step) + 1)]


def time_label(value: float, span: float) -> str:
    moment = datetime.fromtimestamp(value, UTC)
    if span <= 600:
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%H:%M" if span <= 86400 else "%m-%d %H:%M" if span <= 7 * 86400 else "%Y-%m-%d")


def _fmt_time(value: float) -> str:
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bounds(values: list[float], lo: float | None, hi: float | None) -> tuple[float, float]:
    vmin = lo if lo is not None else (min(values) if values else 0.0)
    vmax = hi if hi is not None else (max(values) if values else 1.0)
    if vmax <= vmin:
        pad = abs(vmin) * 0.1 or 1.0
        vmin, vmax = vmin - pad, vmax + pad
    elif lo is None or hi is None:
        pad = (vmax - vmin) * 0.06
        vmin = vmin if lo is not None else vmin - pad
        vmax = vmax if hi is not None else vmax + pad
    return vmin, vmax


def xy_chart(series: Sequence[Series], *, title: str, x: Axis, y: Axis, width: int = 760, height: int = 300,
             chart_id: str = "") -> Markup:
    """A line/marker chart with axes, ticks, a legend and one ``<title>`` per point."""
    left, right, top, bottom = 56, 16, 30, 62
    xs = [p[0] for s in series for p in s.points]
    ys = [p[1] for s in series for p in s.points]
    x0, x1 = _bounds(xs, x.lo, x.hi)
    y0, y1 = _bounds(ys, y.lo, y.hi)
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + ph - (v - y0) / (y1 - y0) * ph

    y_ticks = [{"at": py(t), "label": y.fmt.format(t)} for t in nice_ticks(y0, y1) if y0 <= t <= y1]
    x_ticks = [{"at": px(t), "label": time_label(t, x1 - x0) if x.time else x.fmt.format(t)}
               for t in (time_ticks(x0, x1) if x.time else nice_ticks(x0, x1)) if x0 <= t <= x1]
    return render("svg/xy_chart.svg", chart_id=chart_id, title=title, width=width, height=height, left=left,
                  top=top, pw=pw, ph=ph, y_ticks=y_ticks, x_ticks=x_ticks, x_label=x.label, y_label=y.label,
                  series=[_plotted(s, x, y, px, py) for s in series], legend=_legend(series, left),
                  legend_y=height - 10)


def _plotted(s: Series, x: Axis, y: Axis, px: Callable[[float], float],
             py: Callable[[float], float]) -> dict[str, Any]:
    """One series as the template draws it: its line (if any) and one marker per point with its tooltip."""
    pts = sorted(s.points)
    path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts) if s.line and len(pts) > 1 else ""
    points = [{"cx": px(a), "cy": py(b), "x": a, "y": b,
               "tip": f"{s.name}: {_fmt_time(a) if x.time else x.fmt.format(a)} → {y.fmt.format(b)}"}
              for a, b in pts]
    return {"name": s.name, "colour": s.colour, "opacity": s.opacity, "dashed": s.dashed, "marker": s.marker,
            "path": path, "points": points}


def _legend(series: Sequence[Series], left: float) -> list[dict[str, Any]]:
    """One entry per series under the plot, left to right: where it starts and how it is drawn."""
    out, x = [], float(left)
    for s in series:
        out.append({"x": x, "name": s.name, "colour": s.colour, "line": s.line, "dashed": s.dashed,
                    "marker": s.marker, "opacity": s.opacity})
        x += 35 + 6.2 * len(s.name)
    return out


def timeline(bars: Sequence[Bar], *, title: str, now: float, width: int = 900, row_height: int = 18,
             chart_id: str = "") -> Markup:
    """Intervals on a time axis, one row per ``Bar.row``; an open interval runs to ``now`` with an arrow end."""
    rows = list(dict.fromkeys(b.row for b in bars))
    left, right, top, bottom = 330, 16, 30, 36
    height = top + bottom + max(1, len(rows)) * row_height
    starts = [b.start for b in bars] or [now - 3600]
    t0, t1 = min(starts), max([now, *(b.end or now for b in bars)])
    if t1 <= t0:
        t1 = t0 + 60
    pw = width - left - right

    def px(v: float) -> float:
        return left + (v - t0) / (t1 - t0) * pw

    drawn = []
    for b in bars:
        end = b.end if b.end is not None else now
        drawn.append({"x": px(b.start), "y": top + rows.index(b.row) * row_height + 3,
                      "w": max(px(end) - px(b.start), 3.0), "end": px(end), "colour": b.colour,
                      "state": "open" if b.end is None else "resolved", "open": b.end is None,
                      "hatched": b.hatched, "data": {f"data-{k}": v for k, v in b.extra.items()},
                      "tip": f"{b.label}: {_fmt_time(b.start)} → {_fmt_time(b.end) if b.end is not None else 'open'}"})
    return render("svg/timeline.svg", chart_id=chart_id, title=title, width=width, height=height, top=top,
                  bottom=bottom, left=left, right=right, bar_height=row_height - 6, bars=drawn,
                  ticks=[{"at": px(t), "label": time_label(t, t1 - t0)} for t in time_ticks(t0, t1) if t0 <= t <= t1],
                  rows=[{"y": top + i * row_height + row_height - 5, "label": row[:58]} for i, row in enumerate(rows)])


@dataclass(frozen=True)
class Bucket:
    tokens: float  # the bucket's representative prompt length
    requests: float


def length_histogram(buckets: Sequence[Bucket], *, title: str, threshold: float, colour: str, width: int = 760,
                     height: int = 260, chart_id: str = "") -> Markup:
    """Prompt lengths on a log axis: one bar per bucket (its height the requests), the payoff threshold as a
    dashed vertical line; bars below the threshold are hatched (L2 does not pay off there)."""
    left, right, top, bottom = 56, 16, 30, 62
    pw, ph = width - left - right, height - top - bottom
    values = [b.tokens for b in buckets if b.tokens > 0] + [threshold]
    lx0, lx1 = math.log10(min(values) / 1.6), math.log10(max(values) * 1.6)
    ymax = max([b.requests for b in buckets] + [1.0]) * 1.08
    total = sum(b.requests for b in buckets) or 1.0

    def px(v: float) -> float:
        return left + (math.log10(max(v, 1e-9)) - lx0) / (lx1 - lx0) * pw

    def py(v: float) -> float:
        return top + ph - v / ymax * ph

    y_ticks = [{"at": py(t), "label": f"{t:,.0f}" if ymax >= 10 else f"{t:g}"} for t in nice_ticks(0.0, ymax)
               if t <= ymax]
    x_ticks = [{"at": px(t), "label": f"{t:,.0f}"}
               for t in (m * 10.0 ** e for e in range(math.floor(lx0), math.ceil(lx1) + 1) for m in (1, 2, 5))
               if lx0 <= math.log10(t) <= lx1]
    bar_w = max(6.0, min(28.0, pw / max(len(buckets), 1) / 2))
    bars = []
    for b in sorted(buckets, key=lambda b: b.tokens):
        below, top_y = b.tokens < threshold, py(b.requests)
        bars.append({"x": px(b.tokens) - bar_w / 2, "y": top_y, "h": top + ph - top_y, "tokens": b.tokens,
                     "requests": b.requests, "below": below,
                     "tip": (f"~{b.tokens:,.0f} tokens: {b.requests:,.0f} requests ({b.requests / total:.1%})"
                             + (" — below the payoff threshold" if below else ""))})
    return render("svg/length_histogram.svg", chart_id=chart_id, title=title, width=width, height=height,
                  left=left, top=top, pw=pw, ph=ph, y_ticks=y_ticks, x_ticks=x_ticks, bars=bars, bar_w=bar_w,
                  colour=colour, threshold=threshold, tx=px(threshold), threshold_colour=PUBLISHED_COLOUR)
