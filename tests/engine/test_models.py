"""The business rules that live on the models and their QuerySets: each is written once, and
each test here fails if its rule changes."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F, Value
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation
from tracing.models import (
    GUARDRAIL_TRIPPED,
    Span,
    Trace,
    TraceStatus,
    status_expression,
    trace_status,
)

pytestmark = pytest.mark.django_db


def _run(status: str = RunStatus.WAITING, **kwargs: Any) -> AgentRun:
    kwargs.setdefault("conversation", make_conversation())
    return AgentRun.objects.create(agent_name="support", input="hi", status=status, **kwargs)


def _request(run: AgentRun, **kwargs: Any) -> ApprovalRequest:
    kwargs.setdefault("call_id", f"call_{ApprovalRequest.objects.count()}")
    kwargs.setdefault("arguments", {})
    return ApprovalRequest.objects.create(
        run=run, pause=1, agent_name="support", tool_name="t", arguments_hash="h", **kwargs
    )


def _quiet(run: AgentRun, since: Any) -> AgentRun:
    AgentRun.objects.filter(pk=run.pk).update(updated=since)
    return run


# --- runs -------------------------------------------------------------------------------------


def test_it_counts_a_run_that_works_or_waits_as_busy_and_no_other() -> None:
    busy = {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.WAITING}
    made = {status: _run(status) for status in RunStatus.values}
    assert {run.status for run in AgentRun.objects.busy()} == busy
    assert {status for status, run in made.items() if run.is_busy} == busy
    active = busy - {RunStatus.WAITING}
    assert {status for status, run in made.items() if run.is_active} == active
    finished = set(RunStatus.values) - busy
    assert {status for status, run in made.items() if run.is_finished} == finished


def test_a_stuck_run_is_an_active_one_quiet_since_the_cutoff() -> None:
    cutoff = timezone.now() - timedelta(minutes=5)
    before = cutoff - timedelta(seconds=1)
    stuck = {
        status: _quiet(_run(status), before)
        for status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING)
    }
    _quiet(_run(RunStatus.WAITING), before)  # waits for a person, however long
    _quiet(_run(RunStatus.COMPLETED), before)
    _quiet(_run(RunStatus.RUNNING), cutoff)  # moved at the cutoff: alive
    _run(RunStatus.RUNNING)
    assert set(AgentRun.objects.stuck(cutoff)) == set(stuck.values())


# --- approval requests ----------------------------------------------------------------------


def test_a_request_is_open_while_pending_and_before_its_expiry_then_overdue() -> None:
    now = timezone.now()
    run = _run()
    fresh = _request(run, expires_at=now + timedelta(seconds=1))
    at_expiry = _request(run, expires_at=now)
    past = _request(run, expires_at=now - timedelta(seconds=1))
    decided = _request(run, expires_at=now + timedelta(hours=1), status=ApprovalStatus.APPROVED)
    _request(run, expires_at=now - timedelta(hours=1), status=ApprovalStatus.EXPIRED)
    assert list(ApprovalRequest.objects.open(now)) == [fresh]
    assert set(ApprovalRequest.objects.overdue(now)) == {at_expiry, past}
    assert {r for r in ApprovalRequest.objects.all() if r.is_overdue(now)} == {at_expiry, past}
    assert decided not in ApprovalRequest.objects.pending()
    # Without a time given, both read the clock.
    assert set(ApprovalRequest.objects.open()) | set(ApprovalRequest.objects.overdue()) == {
        fresh,
        at_expiry,
        past,
    }


# --- the status of a trace --------------------------------------------------------------------


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
        run = _run(run_status) if run_status is not None else None
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
        trace = Trace.objects.create(trace_id=f"trace_{name}", run=_run(RunStatus.GUARDRAIL))
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


def test_a_request_is_decided_once_approved_rejected_answered_expired_or_withdrawn() -> None:
    run = _run()
    decided = {
        status
        for status in ApprovalStatus.values
        if _request(run, status=status, expires_at=timezone.now()).is_decided
    }
    assert decided == {
        ApprovalStatus.APPROVED,
        ApprovalStatus.REJECTED,
        ApprovalStatus.RESPONDED,
        ApprovalStatus.EXPIRED,
        ApprovalStatus.WITHDRAWN,
    }
