"""Deciders racing each other, the expiry sweep and the exporter's write of the run's trace.

Exactly one decision per request wins; every loser is told who won ("Already approved by
..."); nothing fails and nothing is logged. On PostgreSQL these are real row locks and its
deadlock detector (a decision that locked its run FOR UPDATE would hold off the exporter's
check of the trace's foreign key to that run, while the decision waited for the trace row
the exporter held: "deadlock detected", a 500 for a loser, a trace write lost); on SQLite the
backend queues the writers. Each thread has its own connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_request, make_reviewer, make_run, start_run
from tracing import exporter as exporter_module
from tracing import recording
from tracing.exporter import DatabaseExporter
from tracing.models import Span, Trace, TraceStatus

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 30
SPANS_PER_BATCH = 100
_ids = itertools.count(1)


# --- what races -----------------------------------------------------------------------------


class Exported:
    """An item as the SDK's processor hands it to the exporter."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def export(self) -> dict[str, Any]:
        return self.data


def paused(requests: int = 1, *, overdue: int = 0) -> tuple[AgentRun, list[ApprovalRequest]]:
    """A run waiting at its first pause with `requests` pending requests (the first `overdue`
    of them past their expiry) and its trace's row, as `_save_pause` leaves them."""
    run = make_run(trace_id=f"trace_{next(_ids):032x}")
    past = timezone.now() - timedelta(minutes=1)
    made = [
        make_request(run=run, **({"expires_at": past} if n < overdue else {}))
        for n in range(requests)
    ]
    recording.follow_run(run.pk)
    return run, made


def trace_batch(run: AgentRun, spans: int = SPANS_PER_BATCH) -> list[Exported]:
    """What the exporter gets of the run's own trace: the trace (sent again when a run goes
    on) and a batch of its spans."""
    trace = {
        "object": "trace",
        "id": run.trace_id,
        "workflow_name": "agentsite: Support desk",
        "group_id": run.conversation.session_id,
        "metadata": {"run_id": str(run.pk), "agent": run.agent_name},
    }
    now = timezone.now().isoformat()
    return [Exported(trace)] + [
        Exported(
            {
                "object": "trace.span",
                "id": f"span_{next(_ids):024x}",
                "trace_id": run.trace_id,
                "parent_id": None,
                "started_at": now,
                "ended_at": now,
                "span_data": {"type": "agent" if n == 0 else "function", "name": "Support desk"},
                "error": None,
            }
        )
        for n in range(spans)
    ]


def race(*actions: Callable[[], Any]) -> list[Any]:
    """Run the actions at once, one thread (and connection) each; what each returned, or
    the exception it raised."""
    start_line = threading.Barrier(len(actions))
    results: list[Any] = [None] * len(actions)

    def go(index: int, action: Callable[[], Any]) -> None:
        start_line.wait()
        try:
            results[index] = action()
        except Exception as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=pair) for pair in enumerate(actions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def deciding(request: ApprovalRequest, reviewer: Any, approve: bool) -> Callable[[], str]:
    def decide() -> str:
        try:
            decision = runs.Decision.approve() if approve else runs.Decision.reject()
            runs.decide(request.pk, reviewer, decision)
        except runs.AlreadyDecided as refusal:
            return str(refusal)
        return "won"

    return decide


def exporting(exporter: DatabaseExporter, run: AgentRun) -> Callable[[], None]:
    batch: list[Any] = trace_batch(run)
    return lambda: exporter.export(batch)


def posting(client: Client, request: ApprovalRequest, approve: bool) -> Callable[[], Any]:
    """A reviewer's click on Approve or Reject in an inbox row (htmx swaps the row)."""
    data = {"action": "approve" if approve else "reject", "seen_hash": request.arguments_hash}
    return lambda: client.post(
        reverse("inbox_decide", args=[request.pk]),
        data,
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"request-{request.pk}",
    )


def in_background(*actions: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """`race(*actions)` on a thread of its own, started; its outcomes once joined."""
    outcomes: list[Any] = []
    thread = threading.Thread(target=lambda: outcomes.extend(race(*actions)))
    thread.start()
    return thread, outcomes


@pytest.fixture
def quiet(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing of the engine, the tracing or a request may log a warning or an error."""
    caplog.set_level(logging.WARNING)
    yield
    loud = [
        f"{record.name}: {record.getMessage()}"
        for record in caplog.records
        if record.levelno >= logging.WARNING
        and record.name.split(".")[0] in ("tracing", "engine", "approvals", "django")
    ]
    assert loud == []


@pytest.fixture
def reviewers() -> list[Any]:
    return [make_reviewer(f"reviewer{n}") for n in range(6)]


def assert_one_winner(request: ApprovalRequest, outcomes: list[Any]) -> None:
    """One decision won; each loser was told who won it, as the reviewer sees it."""
    request.refresh_from_db()
    assert [o for o in outcomes if not isinstance(o, str)] == []  # nothing raised
    assert outcomes.count("won") == 1
    assert request.decided_by is not None
    who = f"Already {request.status} by {request.decided_by.get_username()} at "
    assert all(o.startswith(who) for o in outcomes if o != "won")
    assert ApprovalDecision.objects.filter(request=request).count() == 1


def decision_spans(run: AgentRun) -> int:
    return Span.objects.filter(
        trace__trace_id=run.trace_id, name=recording.DECISION_SPAN_NAME
    ).count()


# --- the races ------------------------------------------------------------------------------


@pytest.mark.usefixtures("quiet")
def test_racing_deciders_and_the_run_s_trace_export_make_one_decision_and_no_error(
    submitted: list, reviewers: list[Any]
) -> None:
    exporter = DatabaseExporter()
    for n in range(ROUNDS):
        run, (request,) = paused()
        outcomes = race(
            exporting(exporter, run),
            *(deciding(request, r, approve=(n + i) % 2 == 0) for i, r in enumerate(reviewers)),
        )
        assert outcomes[0] is None
        assert_one_winner(request, outcomes[1:])
        assert submitted.count(("resume", run.pk)) == 1
        assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RESUMING
        # The trace has the decision and the exporter's batch, and follows the run.
        assert decision_spans(run) == 1
        assert Span.objects.filter(trace__trace_id=run.trace_id).count() == SPANS_PER_BATCH + 1
        assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.RUNNING
    assert exporter.stats.failures == 0


@pytest.mark.usefixtures("quiet")
def test_the_two_decisions_of_a_pause_race_approve_against_reject(
    submitted: list, reviewers: list[Any]
) -> None:
    exporter = DatabaseExporter()
    for _ in range(ROUNDS):
        run, (first, second) = paused(2)
        half = len(reviewers) // 2
        outcomes = race(
            exporting(exporter, run),
            *(deciding(first, r, True) for r in reviewers[:half]),
            *(deciding(second, r, False) for r in reviewers[half:]),
        )
        assert outcomes[0] is None
        assert_one_winner(first, outcomes[1 : 1 + half])
        assert_one_winner(second, outcomes[1 + half :])
        assert (first.status, second.status) == (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
        # Whichever was last saw the other and claimed the run, once.
        assert submitted.count(("resume", run.pk)) == 1
        assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RESUMING
        assert decision_spans(run) == 2
    assert exporter.stats.failures == 0


@pytest.mark.usefixtures("quiet")
def test_a_decision_racing_the_expiry_sweep_and_the_export(
    submitted: list, reviewers: list[Any]
) -> None:
    exporter = DatabaseExporter()
    for _ in range(ROUNDS):
        run, (overdue, request) = paused(2, overdue=1)
        outcomes = race(
            exporting(exporter, run),
            runs.expire_overdue,
            runs.expire_overdue,
            *(deciding(request, r, True) for r in reviewers[:4]),
        )
        assert outcomes[0] is None
        assert sorted(outcomes[1:3]) == [0, 1]  # each expired request once
        assert_one_winner(request, outcomes[3:])
        overdue.refresh_from_db()
        assert overdue.status == ApprovalStatus.EXPIRED
        assert ApprovalDecision.objects.filter(request=overdue).count() == 1
        assert submitted.count(("resume", run.pk)) == 1
        assert decision_spans(run) == 2
    assert exporter.stats.failures == 0


def blocked_on_locks() -> int:
    """How many other sessions of this database wait for a lock (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def wait_until_blocked(count: int) -> None:
    deadline = time.monotonic() + 3
    if connection.vendor != "postgresql":
        time.sleep(0.2)  # SQLite: they queue for the write lock in the backend
        return
    while blocked_on_locks() < count and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.usefixtures("quiet")
def test_deciders_that_wait_for_the_trace_row_the_exporter_holds_do_not_deadlock(
    monkeypatch: pytest.MonkeyPatch, submitted: list, reviewers: list[Any]
) -> None:
    """The interleaving that deadlocked, made every time: the exporter has written the
    trace's row and holds it; the deciders come (the first locks the run and then waits for
    that row, the others wait for the run); then the exporter finishes its batch, whose
    foreign key to the run is checked when it commits."""
    holding, finish = threading.Event(), threading.Event()
    insert_spans = exporter_module._insert_spans

    def held(*args: Any) -> None:
        holding.set()
        assert finish.wait(10)
        insert_spans(*args)

    monkeypatch.setattr(exporter_module, "_insert_spans", held)
    exporter = DatabaseExporter()
    for _ in range(3):
        run, (request,) = paused()
        holding.clear()
        finish.clear()
        export, _ = in_background(exporting(exporter, run))
        assert holding.wait(10)
        deciders, outcomes = in_background(*(deciding(request, r, True) for r in reviewers))
        # The first decider waits for the trace's row, the others for the run.
        wait_until_blocked(len(reviewers))
        finish.set()
        export.join(30)
        deciders.join(30)
        assert_one_winner(request, outcomes)
        assert decision_spans(run) == 1
        assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.RUNNING
    assert exporter.stats.failures == 0


@pytest.mark.usefixtures("quiet")
def test_reviewers_racing_through_the_page_get_no_500(
    submitted: list, reviewers: list[Any]
) -> None:
    clients = []
    for reviewer in reviewers:
        client = Client(raise_request_exception=False)
        client.force_login(reviewer)
        clients.append(client)
    exporter = DatabaseExporter()
    for n in range(ROUNDS):
        run, (request,) = paused()
        answers = race(
            exporting(exporter, run),
            *(posting(c, request, (n + i) % 2 == 0) for i, c in enumerate(clients)),
        )
        assert [a.status_code for a in answers[1:]] == [200] * len(clients)
        request.refresh_from_db()
        assert request.decided_by is not None
        verb = "Approved" if request.status == ApprovalStatus.APPROVED else "Rejected"
        who = f"Already {request.status} by {request.decided_by.get_username()} at "
        pages = [a.content.decode() for a in answers[1:]]
        assert sum(f"{verb} cancel_order" in page for page in pages) == 1
        assert sum(who in page for page in pages) == len(clients) - 1
        assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert exporter.stats.failures == 0


@pytest.mark.usefixtures("quiet", "orders", "fresh_registry")
def test_a_pause_saved_while_the_exporter_holds_the_trace_row_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch, submitted: list
) -> None:
    """The same cycle at a pause: the run being paused locks its row, then waits for the
    trace's row the exporter holds, whose batch checks its foreign key to the run on commit."""
    holding, finish = threading.Event(), threading.Event()
    insert_spans = exporter_module._insert_spans

    def held(*args: Any) -> None:
        holding.set()
        assert finish.wait(10)
        insert_spans(*args)

    monkeypatch.setattr(exporter_module, "_insert_spans", held)
    exporter = DatabaseExporter()
    run = start_run("please cancel order 42", "support")
    export, _ = in_background(exporting(exporter, run))
    assert holding.wait(10)

    def pause() -> None:
        try:
            asyncio.run(runs.execute(run.pk))
        finally:
            connection.close()

    pausing = threading.Thread(target=pause)
    pausing.start()
    wait_until_blocked(1)
    finish.set()
    export.join(30)
    pausing.join(30)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.error
    assert ApprovalRequest.objects.filter(run=run).count() == 1
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.WAITING
    assert exporter.stats.failures == 0
