"""The dashboard's charts drawn on the server (`tracing/charts.py`): round scales and time
axes, stacked bars as tall as their values, lines that skip what is missing."""

from __future__ import annotations

import pytest

from tracing import charts


def test_a_nice_scale_covers_the_largest_value_in_round_steps() -> None:
    assert charts.nice_scale(7) == (8, 2)
    assert charts.nice_scale(100) == (100, 25)
    assert charts.nice_scale(0.03) == (0.04, 0.01)
    assert charts.nice_scale(0) == (1.0, 0.25)
    for value in (1, 3, 9.5, 12, 999, 12345):
        top, step = charts.nice_scale(value)
        assert top >= value and top / step == 4


def test_a_time_axis_steps_in_round_times() -> None:
    assert charts.duration_scale(25 * 3600) == (2 * 86400, 12 * 3600)  # ticks every 12 h
    assert charts.duration_scale(100) == (120, 30)
    assert charts.duration_scale(0.3) == pytest.approx((0.4, 0.1))


def test_stacked_bars_are_as_tall_as_their_values() -> None:
    chart = charts.bar_chart(
        "t",
        "T",
        "d",
        ["a", "b"],
        [charts.Series("x", [2, 4]), charts.Series("y", [2, 0])],
        x_label="X",
        y_label="Y",
    )
    plot = chart.bottom - chart.top  # the axis tops at 4 (nice_scale(4))
    heights = [float(bar.height) for bar in chart.bars]
    assert heights == pytest.approx([plot / 2, plot / 2, plot], abs=0.1)
    assert [bar.css for bar in chart.bars] == ["series-0", "series-1", "series-0"]
    assert chart.bars[1].title == "a: y 2"
    assert not chart.empty and [t.label for t in chart.x_ticks] == ["a", "b"]


def test_a_line_skips_missing_values_and_an_empty_chart_says_so() -> None:
    chart = charts.line_chart(
        "l",
        "L",
        "d",
        ["a", "b", "c"],
        [charts.Series("p50", [1.0, None, 3.0])],
        x_label="X",
        y_label="Y",
    )
    assert len(chart.lines[0].markers) == 2 and chart.lines[0].points.count(",") == 2
    empty = charts.bar_chart("e", "E", "d", [], [], x_label="X", y_label="Y")
    assert empty.empty and not empty.bars
