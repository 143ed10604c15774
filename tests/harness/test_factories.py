"""The test factories' own promises, which other tests lean on."""

from __future__ import annotations

import pytest

from tests.factories import T0, make_trace

pytestmark = pytest.mark.django_db


def test_a_process_s_many_traces_all_start_on_t0s_day_each_older_than_the_last() -> None:
    # A test of the trace list's date filters counts on it, however many traces the tests
    # before it in the same process made (with a minute apart, the 541st fell a day early).
    traces = [make_trace() for _ in range(600)]
    starts = [trace.started_at for trace in traces if trace.started_at is not None]
    assert len(starts) == len(traces)
    assert all(start.date() == T0.date() for start in starts)
    assert all(later < earlier for earlier, later in zip(starts, starts[1:], strict=False))
