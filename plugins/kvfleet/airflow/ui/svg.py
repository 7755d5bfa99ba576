"""Server-rendered SVG plots for the kvfleet page: an XY chart (time or numeric x) and a timeline of intervals.

Pure: rows in, markup out. Called by ``kvfleet.airflow.ui.pages``. Nothing is fetched at run time and no script
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
from html import escape

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#8C564B", "#7F7F7F", "#B8860B",
           "#1B9E77")
PUBLISHED_COLOUR = "#222222"
FONT = "font-family=\"system-ui, sans-serif\" font-size=\"11\""


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

    def legend_html(self) -> str:
        items = "".join(f'<span class="lob"><span class="swatch" style="background:{self(lob)}"></span>'
                        f"{escape(lob)}</span>" for lob in self._index)
        return f'<div class="legend" aria-label="LOB colours">{items}</div>' if items else ""


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
             chart_id: str = "") -> str:
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

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" role="img" '
           f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" {FONT}>',
           f"<title>{escape(title)}</title>",
           f'<text x="{left}" y="16" font-size="13" font-weight="600">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    out.append(_grid_and_ticks(x, y, (x0, x1, y0, y1), (left, top, pw, ph), px, py))
    out.extend(_series_svg(ser, x, y, px, py) for ser in series)
    out.append(_legend(series, left, height - 10))
    out.append("</svg>")
    return "".join(out)


def _grid_and_ticks(x: Axis, y: Axis, bounds: tuple[float, float, float, float],
                    frame: tuple[float, float, float, float], px: Callable[[float], float],
                    py: Callable[[float], float]) -> str:
    """Horizontal grid lines with y labels, x ticks with labels, and both axis titles."""
    x0, x1, y0, y1 = bounds
    left, top, pw, ph = frame
    out = []
    for t in nice_ticks(y0, y1):
        if y0 <= t <= y1:
            out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
                       f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{escape(y.fmt.format(t))}</text>')
    for t in time_ticks(x0, x1) if x.time else nice_ticks(x0, x1):
        if x0 <= t <= x1:
            label = time_label(t, x1 - x0) if x.time else x.fmt.format(t)
            out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top + ph}" y2="{top + ph + 4}" stroke="#999"/>'
                       f'<text x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle">{escape(label)}</text>')
    out.append(f'<text x="{left + pw / 2:.0f}" y="{top + ph + 32}" text-anchor="middle">{escape(x.label)}</text>')
    out.append(f'<text transform="translate(14 {top + ph / 2:.0f}) rotate(-90)" text-anchor="middle">'
               f"{escape(y.label)}</text>")
    return "".join(out)


def _series_svg(s: Series, x: Axis, y: Axis, px: Callable[[float], float], py: Callable[[float], float]) -> str:
    """One series: its line (dashed if asked) and one marker per point with a ``<title>`` tooltip."""
    pts = sorted(s.points)
    group = [f'<g class="series" data-series="{escape(s.name)}" opacity="{s.opacity}">']
    if s.line and len(pts) > 1:
        path = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        group.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" stroke-width="2"{dash}/>')
    for a, b in pts:
        shown_x = _fmt_time(a) if x.time else x.fmt.format(a)
        tip = f"{s.name}: {shown_x} → {y.fmt.format(b)}"
        attrs = f'data-x="{a:g}" data-y="{b:g}" fill="{s.colour}"'
        if s.marker == "circle":
            group.append(f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="3.5" {attrs}>'
                         f"<title>{escape(tip)}</title></circle>")
        elif s.marker == "square":
            group.append(f'<rect x="{px(a) - 4:.1f}" y="{py(b) - 4:.1f}" width="8" height="8" {attrs} '
                         f'stroke="#fff"><title>{escape(tip)}</title></rect>')
    group.append("</g>")
    return "".join(group)


def _legend(series: Sequence[Series], left: float, y: float) -> str:
    """One row under the plot: a line (dashed if the series is) or the series' marker, then its name."""
    out, x = [], left
    for s in series:
        if s.line:
            dash = ' stroke-dasharray="4 3"' if s.dashed else ""
            out.append(f'<line x1="{x:.0f}" x2="{x + 20:.0f}" y1="{y - 4}" y2="{y - 4}" stroke="{s.colour}" '
                       f'stroke-width="3"{dash}/>')
        if s.marker == "square":
            out.append(f'<rect x="{x + 6:.0f}" y="{y - 8}" width="8" height="8" fill="{s.colour}"/>')
        elif s.marker == "circle":
            out.append(f'<circle cx="{x + 10:.0f}" cy="{y - 4}" r="3.5" fill="{s.colour}" opacity="{s.opacity}"/>')
        out.append(f'<text x="{x + 25:.0f}" y="{y}">{escape(s.name)}</text>')
        x += 35 + 6.2 * len(s.name)
    return f'<g class="legend">{"".join(out)}</g>'


def timeline(bars: Sequence[Bar], *, title: str, now: float, width: int = 900, row_height: int = 18,
             chart_id: str = "") -> str:
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

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" role="img" '
           f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" {FONT}>',
           f"<title>{escape(title)}</title>",
           '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2"/>'
           "</pattern></defs>",
           f'<text x="8" y="16" font-size="13" font-weight="600">{escape(title)}</text>']
    for t in time_ticks(t0, t1):
        if t0 <= t <= t1:
            out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{height - bottom}" stroke="#eee"/>'
                       f'<text x="{px(t):.1f}" y="{height - bottom + 14}" text-anchor="middle">'
                       f"{escape(time_label(t, t1 - t0))}</text>")
    for i, row in enumerate(rows):
        y = top + i * row_height
        out.append(f'<text x="{left - 6}" y="{y + row_height - 5}" text-anchor="end">{escape(row[:58])}</text>')
    for b in bars:
        y = top + rows.index(b.row) * row_height + 3
        end = b.end if b.end is not None else now
        w = max(px(end) - px(b.start), 3.0)
        state = "open" if b.end is None else "resolved"
        extra = "".join(f' data-{escape(k)}="{escape(v)}"' for k, v in b.extra.items())
        tip = f"{b.label}: {_fmt_time(b.start)} → {_fmt_time(b.end) if b.end is not None else 'open'}"
        out.append(f'<g class="bar" data-state="{state}"{extra}><rect x="{px(b.start):.1f}" y="{y}" width="{w:.1f}" '
                   f'height="{row_height - 6}" fill="{b.colour}" rx="2"><title>{escape(tip)}</title></rect>')
        if b.hatched:
            out.append(f'<rect x="{px(b.start):.1f}" y="{y}" width="{w:.1f}" height="{row_height - 6}" '
                       'fill="url(#hatch)" opacity="0.6"/>')
        if b.end is None:
            out.append(f'<path d="M{px(end):.1f},{y} l6,{(row_height - 6) / 2} l-6,{(row_height - 6) / 2} z" '
                       f'fill="{b.colour}"/>')
        out.append("</g>")
    out.append(f'<text x="{width - right}" y="{height - 4}" text-anchor="end">open findings run to now '
               "(▶); hatched: remediation refused or failed</text></svg>")
    return "".join(out)


@dataclass(frozen=True)
class Bucket:
    tokens: float  # the bucket's representative prompt length
    requests: float


def length_histogram(buckets: Sequence[Bucket], *, title: str, threshold: float, colour: str, width: int = 760,
                     height: int = 260, chart_id: str = "") -> str:
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

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{escape(chart_id)}" role="img" '
           f'aria-label="{escape(title)}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" {FONT}>',
           f"<title>{escape(title)}</title>",
           '<defs><pattern id="below" width="6" height="6" patternUnits="userSpaceOnUse" '
           'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2.5"/>'
           "</pattern></defs>",
           f'<text x="{left}" y="16" font-size="13" font-weight="600">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#ccc"/>']
    for t in nice_ticks(0.0, ymax):
        if t <= ymax:
            out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
                       f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">'
                       f"{f'{t:,.0f}' if ymax >= 10 else f'{t:g}'}</text>")
    for exp in range(math.floor(lx0), math.ceil(lx1) + 1):
        for m in (1, 2, 5):
            t = m * 10.0 ** exp
            if lx0 <= math.log10(t) <= lx1:
                out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top + ph}" y2="{top + ph + 4}" '
                           f'stroke="#999"/><text x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle">'
                           f"{t:,.0f}</text>")
    out.append(f'<text x="{left + pw / 2:.0f}" y="{top + ph + 32}" text-anchor="middle">prompt tokens (log scale)'
               "</text>")
    out.append(f'<text transform="translate(14 {top + ph / 2:.0f}) rotate(-90)" text-anchor="middle">requests'
               "</text>")
    bar_w = max(6.0, min(28.0, pw / max(len(buckets), 1) / 2))
    group = ['<g class="series" data-series="prompt lengths">']
    for b in sorted(buckets, key=lambda b: b.tokens):
        below = b.tokens < threshold
        x, y = px(b.tokens) - bar_w / 2, py(b.requests)
        tip = (f"~{b.tokens:,.0f} tokens: {b.requests:,.0f} requests ({b.requests / total:.1%})"
               + (" — below the payoff threshold" if below else ""))
        group.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{top + ph - y:.1f}" '
                     f'fill="{colour}" data-x="{b.tokens:.12g}" data-y="{b.requests:.12g}" '
                     f'data-below="{"true" if below else "false"}"><title>{escape(tip)}</title></rect>')
        if below:
            group.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{top + ph - y:.1f}" '
                         'fill="url(#below)" opacity="0.7"/>')
    group.append("</g>")
    out.extend(group)
    tx = px(threshold)
    out.append(f'<g class="threshold" data-x="{threshold:g}"><line x1="{tx:.1f}" x2="{tx:.1f}" y1="{top}" '
               f'y2="{top + ph}" stroke="{PUBLISHED_COLOUR}" stroke-width="2" stroke-dasharray="6 4"/>'
               f'<text x="{tx + 4:.1f}" y="{top + 12}">payoff ≈ {threshold:,.0f} tokens</text></g>')
    out.append(f'<text x="{left}" y="{height - 6}">hatched: below the payoff threshold, where L2 does not pay off '
               "(prefix-aware routing, L0/L1, serves them better)</text></svg>")
    return "".join(out)
