"""Charts drawn on the server, as SVG geometry for `templates/tracing/dashboard.html#chart`.

No script and no style attribute: every position is an SVG attribute computed here (the
Content Security Policy allows no inline style), every colour a class from
`static/agentsite/dashboard.css`. Text (model, tool and reviewer names) stays text: the
template escapes it. Each chart says what it shows in its <title> and <desc>, and its numbers
are also a table under it, so it reads without seeing it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

WIDTH = 720
HEIGHT = 280
LEFT, RIGHT, TOP, BOTTOM = 100, 16, 16, 64
MAX_X_LABELS = 12
SERIES_CLASSES = 8  # series-0 … series-7 in dashboard.css


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float | None]
    css: str = ""  # a class of dashboard.css; by default series-<its position>


@dataclass(frozen=True)
class Tick:
    at: str  # the coordinate, in the chart's units
    label: str


@dataclass(frozen=True)
class Bar:
    x: str
    y: str
    width: str
    height: str
    css: str
    title: str


@dataclass(frozen=True)
class Point:
    x: str
    y: str
    title: str


@dataclass(frozen=True)
class Line:
    points: str
    css: str
    markers: list[Point]


@dataclass(frozen=True)
class LegendEntry:
    css: str
    label: str


@dataclass
class Chart:
    name: str
    title: str
    description: str
    x_label: str
    y_label: str
    width: int = WIDTH
    height: int = HEIGHT
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    legend: list[LegendEntry] = field(default_factory=list)
    empty: bool = False

    @property
    def left(self) -> int:
        return LEFT

    @property
    def right(self) -> int:
        return self.width - RIGHT

    @property
    def top(self) -> int:
        return TOP

    @property
    def bottom(self) -> int:
        return self.height - BOTTOM

    @property
    def middle_x(self) -> str:
        return _n((self.left + self.right) / 2)

    @property
    def middle_y(self) -> str:
        return _n((self.top + self.bottom) / 2)

    @property
    def x_label_y(self) -> str:
        return _n(self.height - 12)

    @property
    def tick_label_y(self) -> str:
        return _n(self.bottom + 18)


def _n(value: float) -> str:
    return f"{value:.1f}"


def plain_number(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}"


def nice_scale(largest: float, ticks: int = 4) -> tuple[float, float]:
    """An axis maximum at least `largest` and its tick step, both 1, 2 or 5 × a power of ten."""
    if largest <= 0:
        return 1.0, 0.25
    rough = largest / ticks
    power = 10 ** math.floor(math.log10(rough))
    for factor in (1, 2, 2.5, 5, 10):
        step = factor * power
        if step * ticks >= largest:
            return step * ticks, step
    return 10 * power * ticks, 10 * power


# Round steps for an axis of seconds: 1 s … 30 s, 1 min … 30 min, 1 h … 12 h, 1 day, a week.
DURATION_STEPS = (
    *(0.001 * f for f in (1, 2, 5, 10, 20, 50, 100, 200, 500)),
    1, 2, 5, 10, 15, 30,
    60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200,
    86400, 172800, 604800,
)  # fmt: skip


def duration_scale(largest: float, ticks: int = 4) -> tuple[float, float]:
    """An axis maximum of seconds at least `largest`, in round steps of time."""
    for step in DURATION_STEPS:
        if step * ticks >= largest:
            return step * ticks, step
    return nice_scale(largest, ticks)


def _y_axis(
    chart: Chart, top_value: float, text: Callable[[float], str], integer: bool, seconds: bool
) -> Callable[[float], float]:
    maximum, step = duration_scale(top_value) if seconds else nice_scale(top_value)
    if integer and step < 1:  # counts: no tick between two whole numbers
        step = 1.0
        maximum = max(1.0, float(math.ceil(top_value)))
    height = chart.bottom - chart.top

    def y(value: float) -> float:
        return chart.bottom - height * (value / maximum)

    count = round(maximum / step)
    # The axis starts at a plain 0 (a "$0.00" on a cost axis would read as a price of 0).
    chart.y_ticks = [Tick(_n(y(i * step)), text(i * step) if i else "0") for i in range(count + 1)]
    return y


def _x_ticks(chart: Chart, categories: Sequence[str], centre: Callable[[int], float]) -> None:
    every = max(1, math.ceil(len(categories) / MAX_X_LABELS))
    chart.x_ticks = [
        Tick(_n(centre(i)), label) for i, label in enumerate(categories) if i % every == 0
    ]


def _css(series: Series, position: int) -> str:
    return series.css or f"series-{position % SERIES_CLASSES}"


def bar_chart(
    name: str,
    title: str,
    description: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    stacked: bool = True,
    text: Callable[[float], str] = plain_number,
    integer: bool = True,
    seconds: bool = False,
) -> Chart:
    """Bars per category: the series stacked (counts that add up) or side by side.
    `integer`: the values are counts (whole-number ticks); `seconds`: durations (ticks in
    round steps of time)."""
    chart = Chart(name, title, description, x_label, y_label)
    chart.legend = [LegendEntry(_css(s, i), s.label) for i, s in enumerate(series)]
    values = [[(s.values[i] or 0.0) for s in series] for i in range(len(categories))]
    sums = [sum(column) if stacked else max(column, default=0.0) for column in values]
    chart.empty = not categories or not series or max(sums, default=0.0) <= 0
    y = _y_axis(chart, max(sums, default=0.0), text, integer, seconds)
    slot = (chart.right - chart.left) / max(len(categories), 1)
    width = slot * 0.8
    _x_ticks(chart, categories, lambda i: chart.left + slot * (i + 0.5))
    for i, category in enumerate(categories):
        below = 0.0
        for j, s in enumerate(series):
            value = values[i][j]
            if value <= 0:
                continue
            if stacked:
                x, w = chart.left + slot * i + (slot - width) / 2, width
                top, base = y(below + value), y(below)
                below += value
            else:
                w = width / len(series)
                x = chart.left + slot * i + (slot - width) / 2 + w * j
                top, base = y(value), y(0)
            chart.bars.append(
                Bar(
                    _n(x),
                    _n(top),
                    _n(max(w, 0.5)),
                    _n(max(base - top, 0.5)),
                    _css(s, j),
                    f"{category}: {s.label} {text(value)}",
                )
            )
    return chart


def line_chart(
    name: str,
    title: str,
    description: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    text: Callable[[float], str] = plain_number,
    integer: bool = True,
    seconds: bool = False,
) -> Chart:
    """A line per series over the categories; a missing value (None) breaks no line, it is
    skipped."""
    chart = Chart(name, title, description, x_label, y_label)
    chart.legend = [LegendEntry(_css(s, i), s.label) for i, s in enumerate(series)]
    present = [v for s in series for v in s.values if v is not None]
    chart.empty = not categories or not present
    y = _y_axis(chart, max(present, default=0.0), text, integer, seconds)
    span = chart.right - chart.left
    count = len(categories)

    def x(i: int) -> float:
        return chart.left + (span * (i + 0.5) / count if count else 0)

    _x_ticks(chart, categories, x)
    for j, s in enumerate(series):
        markers = [
            Point(_n(x(i)), _n(y(v)), f"{categories[i]}: {s.label} {text(v)}")
            for i, v in enumerate(s.values)
            if v is not None
        ]
        if markers:
            points = " ".join(f"{m.x},{m.y}" for m in markers)
            chart.lines.append(Line(points, _css(s, j), markers))
    return chart
