"""Charts as inline SVG, drawn in Python: axes with round ticks, stacked bars, lines and points, each mark with a
hover title. Colours come from CSS classes (page.py's stylesheet), so that dark mode and print restyle them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

WIDTH = 960
HEIGHT = 260
# Room for the axes' labels: left, right, top, bottom.
MARGIN = (58, 16, 14, 40)


@dataclass(frozen=True)
class Bar:
    """One column of a bar chart: its stacked parts (value, css class) from the bottom, and its hover title."""

    parts: tuple[tuple[float, str], ...]
    title: str


@dataclass(frozen=True)
class Marker:
    """A vertical line at x (a bar's index on bar charts), labelled: an epoch's start, a stall, a restart."""

    x: float
    label: str
    css: str = "mark"


@dataclass(frozen=True)
class Series:
    """Points joined by a line (or not), in one css class, named in the legend."""

    name: str
    points: tuple[tuple[float, float, str], ...]  # x, y, hover title
    css: str
    joined: bool = True


@dataclass(frozen=True)
class Highlight:
    """A ring around one point, labelled: the chosen trial."""

    x: float
    y: float
    label: str


@dataclass
class _Frame:
    """The plotting area and the scales from data to pixels."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    width: int = WIDTH
    height: int = HEIGHT
    body: list[str] = field(default_factory=list)

    @property
    def left(self) -> float:
        return MARGIN[0]

    @property
    def right(self) -> float:
        return self.width - MARGIN[1]

    @property
    def top(self) -> float:
        return MARGIN[2]

    @property
    def bottom(self) -> float:
        return self.height - MARGIN[3]

    def x(self, value: float) -> float:
        span = self.x_high - self.x_low or 1.0
        return self.left + (value - self.x_low) / span * (self.right - self.left)

    def y(self, value: float) -> float:
        span = self.y_high - self.y_low or 1.0
        return self.bottom - (value - self.y_low) / span * (self.bottom - self.top)


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values (1, 2, 2.5 or 5 times a power of ten) from low to at least high, about `count` of them."""
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        high = low + 1.0
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 10))
    return ticks


def _number(value: float) -> str:
    """A tick's label: '0', '2.5', '40', '1.2k'."""
    if abs(value) >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _svg(frame: _Frame, label: str, x_label: str, y_label: str, y_ticks: list[float]) -> str:
    parts = [
        f'<svg class="chart" viewBox="0 0 {frame.width} {frame.height}" role="img" aria-label="{escape(label)}" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(label)}</title>",
    ]
    for tick in y_ticks:
        y = frame.y(tick)
        parts.append(f'<line class="grid" x1="{frame.left}" x2="{frame.right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="tick" x="{frame.left - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(tick)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{frame.left}" x2="{frame.right}" y1="{frame.bottom}" y2="{frame.bottom}"/>'
        f'<line class="axis" x1="{frame.left}" x2="{frame.left}" y1="{frame.top}" y2="{frame.bottom}"/>'
    )
    middle = (frame.top + frame.bottom) / 2
    parts.append(
        f'<text class="axis-label" x="14" y="{middle:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle:.1f})">{escape(y_label)}</text>'
    )
    parts.append(
        f'<text class="axis-label" x="{(frame.left + frame.right) / 2:.1f}" y="{frame.height - 6}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.extend(frame.body)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    bars: Sequence[Bar],
    *,
    label: str,
    x_label: str,
    y_label: str,
    markers: Sequence[Marker] = (),
    x_tick_labels: Sequence[tuple[int, str]] = (),
    y_high: float | None = None,
) -> str:
    """Columns of stacked parts, one per bar, with vertical markers between them (at a bar's index)."""
    top = max((sum(v for v, _ in bar.parts) for bar in bars), default=0.0)
    y_ticks = nice_ticks(0.0, max(y_high or 0.0, top) or 1.0)
    frame = _Frame(0.0, float(max(1, len(bars))), 0.0, y_ticks[-1])
    slot = (frame.right - frame.left) / max(1, len(bars))
    gap = slot * 0.15 if slot > 4 else 0.0
    for index, bar in enumerate(bars):
        x = frame.x(index) + gap / 2
        base = 0.0
        cells = []
        for value, css in bar.parts:
            if value <= 0:
                continue
            y_top, y_base = frame.y(base + value), frame.y(base)
            cells.append(
                f'<rect class="{css}" x="{x:.2f}" y="{y_top:.2f}" width="{max(slot - gap, 0.5):.2f}" '
                f'height="{max(y_base - y_top, 0.0):.2f}"/>'
            )
            base += value
        frame.body.append(f"<g><title>{escape(bar.title)}</title>{''.join(cells)}</g>")
    for index, text in x_tick_labels:
        x = frame.x(index + 0.5)
        frame.body.append(
            f'<text class="tick" x="{x:.1f}" y="{frame.bottom + 16}" text-anchor="middle">{escape(text)}</text>'
        )
    frame.body.extend(_markers(frame, markers))
    return _svg(frame, label, x_label, y_label, y_ticks)


# Pixels a marker's label needs from the last one labelled; a marker closer than that is drawn unlabelled
# (its label still in its hover title).
_LABEL_SPACE = 64


def _markers(frame: _Frame, markers: Sequence[Marker]) -> list[str]:
    drawn = []
    labelled_at: dict[str, float] = {}  # per kind of marker, where the last label went
    for marker in sorted(markers, key=lambda m: m.x):
        x = frame.x(marker.x)
        room = x - labelled_at.get(marker.css, -_LABEL_SPACE) >= _LABEL_SPACE
        if room:
            labelled_at[marker.css] = x
        # A label near the right edge is written leftwards of its line, so that it is not cut off.
        at_edge = x > frame.right - _LABEL_SPACE * 2
        place = f'x="{x - 3:.1f}" text-anchor="end"' if at_edge else f'x="{x + 3:.1f}"'
        text = f'<text {place} y="{frame.top + 10}">{escape(_short(marker.label))}</text>' if room else ""
        drawn.append(
            f'<g class="{marker.css}"><title>{escape(marker.label)}</title>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{frame.top}" y2="{frame.bottom}"/>{text}</g>'
        )
    return drawn


def _short(text: str, most: int = 24) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"


def line_chart(
    series: Sequence[Series],
    *,
    label: str,
    x_label: str,
    y_label: str,
    markers: Sequence[Marker] = (),
    highlights: Sequence[Highlight] = (),
    x_ticks: Sequence[tuple[float, str]] | None = None,
    y_low_zero: bool = True,
) -> str:
    """Series of points on shared axes (joined by lines where a series says so), with markers and rings; a
    legend above the chart names the series when there are several."""
    xs = [x for s in series for x, _, _ in s.points] + [m.x for m in markers]
    ys = [y for s in series for _, y, _ in s.points]
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_ticks = nice_ticks(0.0 if y_low_zero else min(ys, default=0.0), max(ys, default=1.0) or 1.0)
    pad = (x_high - x_low) * 0.03
    frame = _Frame(x_low - pad, x_high + pad, y_ticks[0], y_ticks[-1])
    ticks = x_ticks if x_ticks is not None else [(t, _number(t)) for t in nice_ticks(x_low, x_high) if t <= x_high]
    for value, text in ticks:
        x = frame.x(value)
        frame.body.append(
            f'<text class="tick" x="{x:.1f}" y="{frame.bottom + 16}" text-anchor="middle">{escape(text)}</text>'
        )
    frame.body.extend(_markers(frame, markers))
    for one in series:
        css = f"{one.css} series"
        if one.joined and len(one.points) > 1:
            path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y, _ in sorted(one.points))
            frame.body.append(f'<polyline class="{css} line" points="{path}"/>')
        for x, y, title in one.points:
            frame.body.append(
                f'<circle class="{css} dot" cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="4">'
                f"<title>{escape(title)}</title></circle>"
            )
    for ring in highlights:
        cx, cy = frame.x(ring.x), frame.y(ring.y)
        frame.body.append(
            f'<g class="highlight"><circle cx="{cx:.1f}" cy="{cy:.1f}" r="9"/>'
            f'<text x="{cx + 12:.1f}" y="{cy - 8:.1f}">{escape(ring.label)}</text></g>'
        )
    keys = legend([(one.css, one.name) for one in series]) if len(series) > 1 else ""
    return keys + _svg(frame, label, x_label, y_label, y_ticks)


def legend(entries: Sequence[tuple[str, str]]) -> str:
    """A legend above a chart, as HTML: (css class, words) per swatch."""
    items = "".join(
        f'<span class="key"><span class="swatch {css}" aria-hidden="true"></span> {escape(words)}</span>'
        for css, words in entries
    )
    return f'<div class="legend-row">{items}</div>'
