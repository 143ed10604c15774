"""The status of a trace (`tracing/models.py`): a run's trace follows its run, a foreign one
ends with its root span, any error but a guardrail's tripwire fails it; in Python and in the
SQL the exporter writes, which agree."""

from __future__ import annotations

import itertools

import pytest
from django.db.models import F, Value

from engine.models import RunStatus
from tests.factories import make_run
from tracing.models import (
    GUARDRAIL_TRIPPED,
    Span,
    Trace,
    TraceStatus,
    status_expression,
    trace_status,
)

pytestmark = pytest.mark.django_db


def test_a_runs_trace_follows_its_run_and_any_error_wins() -> None:
    assert {status: trace_status(status) for status in RunStatus.values} == {
        RunStatus.QUEUED: TraceStatus.RUNNING,
        RunStatus.RUNNING: TraceStatus.RUNNING,
        RunStatus.WAITING: TraceStatus.WAITING,
        RunStatus.RESUMING: TraceStatus.RUNNING,
        RunStatus.COMPLETED: TraceStatus.OK,
        RunStatus.FAILED: TraceStatus.ERROR,
        # Stopped by its user, ended by its guardrail: neither is a failure.
        RunStatus.CANCELLED: TraceStatus.OK,
        RunStatus.GUARDRAIL: TraceStatus.OK,
    }
    assert trace_status(RunStatus.COMPLETED, has_error=True) == TraceStatus.ERROR
    assert trace_status(None, has_error=True, has_root=True) == TraceStatus.ERROR


def test_a_foreign_trace_still_running_is_done_once_its_root_span_arrived() -> None:
    assert trace_status(None) == TraceStatus.RUNNING
    assert trace_status(None, has_root=True) == TraceStatus.OK
    # Only a running one: a status set otherwise stays.
    assert trace_status(None, has_root=True, stored=TraceStatus.WAITING) == TraceStatus.WAITING


def test_the_sql_rule_gives_what_the_python_rule_gives() -> None:
    cases = list(
        itertools.product(
            [None, *RunStatus.values], [False, True], [False, True], TraceStatus.values
        )
    )
    rows = {}
    for number, (run_status, has_error, has_root, stored) in enumerate(cases):
        run = make_run(status=run_status) if run_status is not None else None
        trace = Trace.objects.create(trace_id=f"trace_{number}", run=run, status=stored)
        if has_root:
            Span.objects.create(span_id=f"span_root_{number}", trace=trace, span_type="agent")
        Span.objects.create(
            span_id=f"span_{number}",
            trace=trace,
            parent_id="span_parent",
            span_type="function",
            error={"message": "boom"} if has_error else None,
        )
        followed = Value(trace_status(run_status)) if run_status is not None else F("status")
        Trace.objects.filter(pk=trace.pk).update(status=status_expression(followed))
        rows[trace.pk] = trace_status(
            run_status, has_error=has_error, has_root=has_root, stored=stored
        )
    assert dict(Trace.objects.values_list("pk", "status")) == rows
    # And the model reads it back the same way (from scratch: a trace starts running).
    fresh = Trace.objects.filter(status=TraceStatus.RUNNING).select_related("run")
    assert all(trace.derived_status() == trace.status for trace in fresh)


def test_only_a_guardrail_s_tripwire_is_an_error_that_does_not_fail_a_trace() -> None:
    """The SDK marks the agent span of a run its guardrail ended with an error; any other
    error, with or without a message, still fails the trace (in SQL and in Python)."""
    errors = {
        "tripped": {"message": GUARDRAIL_TRIPPED, "data": {"guardrail": "no card numbers"}},
        "boom": {"message": "boom"},
        "no message": {"data": {"x": 1}},
        "text": "boom",
        "null message": {"message": None},
    }
    for name, error in errors.items():
        trace = Trace.objects.create(
            trace_id=f"trace_{name}", run=make_run(status=RunStatus.GUARDRAIL)
        )
        Span.objects.create(span_id=f"span_{name}", trace=trace, span_type="agent", error=error)
        followed = Value(trace_status(RunStatus.GUARDRAIL))
        Trace.objects.filter(pk=trace.pk).update(status=status_expression(followed))
    statuses = dict(Trace.objects.values_list("trace_id", "status"))
    assert statuses == {
        "trace_tripped": TraceStatus.OK,
        "trace_boom": TraceStatus.ERROR,
        "trace_no message": TraceStatus.ERROR,
        "trace_text": TraceStatus.ERROR,
        "trace_null message": TraceStatus.ERROR,
    }
    for trace in Trace.objects.select_related("run"):
        assert trace.derived_status() == trace.status, trace.trace_id
