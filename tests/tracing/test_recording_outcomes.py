"""A run's trace says how it ended (`tracing.recording.run_outcome`): more than OK / Error."""

from __future__ import annotations

from typing import Any

import pytest

from approvals.models import ApprovalStatus, DecisionKind
from engine.models import RunStatus
from tests.factories import make_decision, make_request, make_run, make_trace
from tracing import recording
from tracing.models import Trace, TraceOutcome, TraceStatus, outcome_filter

pytestmark = pytest.mark.django_db


def ended(run: Any, status: str, **changes: Any) -> Trace:
    type(run).objects.filter(pk=run.pk).update(status=status, **changes)
    recording.follow_run(run.pk)
    return Trace.objects.get(trace_id=run.trace_id)


def run_with_trace(**kwargs: Any) -> Any:
    run = make_run(**kwargs)
    run.trace_id = f"trace_{run.pk:032x}"
    run.save(update_fields=["trace_id"])
    return run


def test_a_run_without_approvals_completes_with_no_query_for_decisions(
    django_assert_num_queries: Any,
) -> None:
    run = run_with_trace(status=RunStatus.COMPLETED, pause_count=0)
    with django_assert_num_queries(3):  # savepoint, the upsert, release
        recording.follow_run(run, RunStatus.COMPLETED)
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert (trace.outcome, trace.outcome_reason) == (TraceOutcome.COMPLETED, "")


@pytest.mark.parametrize(
    "kinds, outcome, reason",
    [
        ([DecisionKind.APPROVED], TraceOutcome.APPROVED, "cancel_order: approved by rita"),
        (
            [DecisionKind.APPROVED, DecisionKind.REJECTED],
            TraceOutcome.REJECTED,
            "cancel_order: rejected by rita: not today",
        ),
        (
            [DecisionKind.RESPONDED],
            TraceOutcome.REJECTED,
            "cancel_order: answered as the tool by rita: not today",
        ),
        ([DecisionKind.REJECTED, DecisionKind.EXPIRED], TraceOutcome.EXPIRED, None),
        ([DecisionKind.EDITED], TraceOutcome.APPROVED, None),
        # The user took the request back; the run went on with the call rejected.
        (
            [DecisionKind.WITHDRAWN],
            TraceOutcome.WITHDRAWN,
            "cancel_order: withdrawn by rita: not today",
        ),
        ([DecisionKind.APPROVED, DecisionKind.WITHDRAWN], TraceOutcome.WITHDRAWN, None),
    ],
)
def test_a_completed_runs_outcome_is_what_its_decisions_did(
    kinds: list[str], outcome: str, reason: str | None
) -> None:
    run = run_with_trace()
    for kind in kinds:
        approved = kind in (DecisionKind.APPROVED, DecisionKind.EDITED)
        message = "" if approved else "not today\nmore"
        make_decision(request=make_request(run=run), kind=kind, approved=approved, message=message)
    trace = ended(run, RunStatus.COMPLETED)
    assert trace.outcome == outcome
    if reason is not None:
        assert trace.outcome_reason == reason


def test_a_failed_run_says_its_reasons_first_line_masked() -> None:
    run = run_with_trace()
    trace = ended(run, RunStatus.FAILED, error="\nThe model refused: mail bob@example.com\ntrace")
    assert trace.outcome == TraceOutcome.FAILED
    assert trace.outcome_reason.startswith("The model refused: mail ")
    assert "bob@example.com" not in trace.outcome_reason
    assert trace.status == TraceStatus.ERROR


def test_a_stop_while_waiting_is_withdrawn_and_a_stop_otherwise_is_stopped() -> None:
    run = run_with_trace()
    request = make_request(run=run, status=ApprovalStatus.WITHDRAWN)
    make_decision(request=request, kind=DecisionKind.WITHDRAWN, approved=False, reviewer=None)
    assert (
        ended(run, RunStatus.CANCELLED, error="Stopped by alice").outcome == TraceOutcome.WITHDRAWN
    )
    other = run_with_trace(pause_count=0)
    trace = ended(other, RunStatus.CANCELLED, error="Stopped by alice")
    assert (trace.outcome, trace.outcome_reason) == (TraceOutcome.STOPPED, "Stopped by alice")


def test_waiting_guardrail_and_the_exporters_writes_keep_the_outcome() -> None:
    run = run_with_trace()
    assert ended(run, RunStatus.WAITING).outcome == TraceOutcome.WAITING
    assert ended(run, RunStatus.GUARDRAIL, error="Blocked: a secret").outcome == "guardrail"


def test_the_outcome_filter_reads_the_status_of_traces_without_one() -> None:
    foreign_ok = make_trace(status=TraceStatus.OK)
    foreign_error = make_trace(status=TraceStatus.ERROR)
    rejected = make_trace(outcome=TraceOutcome.REJECTED, status=TraceStatus.ERROR)
    failed = set(Trace.objects.filter(outcome_filter("failed")).values_list("pk", flat=True))
    assert failed == {foreign_error.pk}
    completed = Trace.objects.filter(outcome_filter("completed"))
    assert set(completed.values_list("pk", flat=True)) == {foreign_ok.pk}
    assert Trace.objects.filter(outcome_filter("rejected")).get() == rejected
    assert foreign_error.get_shown_outcome_display() == "Failed"
