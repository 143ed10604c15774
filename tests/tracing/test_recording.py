"""Every run is stored as a trace: its span tree as the SDK emitted it, one trace across a pause
and its resumption, each approval decision as a span, a status that follows the run, and no
personal data."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ModelStep, ScriptedModel
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.conftest import Traces
from tests.factories import (
    make_conversation,
    make_reviewer,
    make_user,
    start_run,
)
from tracing.models import Span, Trace, TraceStatus

# Jobs handed to the executor are recorded (the shared `submitted` fixture): each test drives them.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("submitted", "orders", "fresh_registry"),
]


def run_to_end(text: str, agent_name: str = "support") -> AgentRun:
    run = start_run(text, agent_name)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def kind(exported: dict[str, Any]) -> str:
    """A span's type as the SDK means it (task and turn spans are custom spans)."""
    data = exported["span_data"]
    return str((data.get("data") or {}).get("sdk_span_type") or data["type"])


def sdk_tree(traces: Traces, trace_id: str) -> set[tuple[str, str | None, str]]:
    return {
        (span["id"], span["parent_id"], kind(span))
        for span in traces.sdk.spans
        if span["trace_id"] == trace_id
    }


def stored_tree(trace_id: str) -> set[tuple[str, str | None, str]]:
    return {
        (span_id, parent_id, span_type)
        for span_id, parent_id, span_type in Span.objects.filter(trace_id=trace_id)
        .exclude(name="approval decision")
        .values_list("span_id", "parent_id", "span_type")
    }


def shape(trace_id: str) -> list[str]:
    """The tree as indented `type name` lines, children in start order."""
    spans = list(Span.objects.filter(trace_id=trace_id).order_by("started_at", "pk"))
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in spans:
            if span.parent_id == parent:
                lines.append("  " * depth + f"{span.span_type} {span.name}")
                walk(span.span_id, depth + 1)

    walk(None, 0)
    return lines


# --- the tree -------------------------------------------------------------------------------


def test_a_run_with_a_tool_call_is_stored_as_the_tree_the_sdk_emitted(traces: Traces) -> None:
    run = run_to_end("where is order 7")
    traces.flush()

    assert run.status == RunStatus.COMPLETED
    assert stored_tree(run.trace_id) == sdk_tree(traces, run.trace_id)
    assert shape(run.trace_id) == [
        "task agentsite: Support desk",
        "  agent Support desk",
        "    guardrail no card numbers",  # the demo's input guardrail, before the model
        "    turn turn 1: Support desk",
        "      generation offline-demo",
        "      function lookup_order",
        "    turn turn 2: Support desk",
        "      generation offline-demo",
    ]
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert trace.run == run
    assert trace.workflow_name == "agentsite: Support desk"
    assert trace.group_id == run.conversation.session_id
    assert trace.metadata == {"run_id": str(run.pk), "agent": "support"}
    assert trace.status == TraceStatus.OK == trace.derived_status()
    assert trace.total_tokens == run.usage["total_tokens"] > 0
    first, *_, last = Span.objects.filter(trace=trace).order_by("started_at")
    assert trace.started_at == first.started_at
    assert trace.ended_at == Span.objects.filter(trace=trace).latest("ended_at").ended_at
    function = Span.objects.get(trace=trace, span_type="function")
    assert function.span_data["input"] == '{"order_id":7}'
    assert "shipped" in function.span_data["output"]


def test_a_run_with_a_handoff_is_stored_as_the_tree_the_sdk_emitted(traces: Traces) -> None:
    run = run_to_end("I have a billing question")
    traces.flush()

    assert stored_tree(run.trace_id) == sdk_tree(traces, run.trace_id)
    assert shape(run.trace_id) == [
        "task agentsite: Support desk",
        "  agent Support desk",
        "    guardrail no card numbers",  # the demo's input guardrail, before the model
        "    turn turn 1: Support desk",
        "      generation offline-demo",
        "      handoff Support desk → Billing",
        "  agent Billing",
        "    turn turn 2: Billing",  # turns count per run, not per agent
        "      generation offline-demo",
    ]


# --- pause, decision, resumption ------------------------------------------------------------


def test_a_paused_then_approved_run_is_one_trace_with_its_decision(traces: Traces) -> None:
    run = run_to_end("cancel order 42")
    traces.flush()
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert run.status == RunStatus.WAITING
    assert trace.status == TraceStatus.WAITING
    first_half = set(Span.objects.filter(trace=trace).values_list("span_id", flat=True))
    root_agent = Span.objects.get(trace=trace, span_type="agent")

    request = run.approval_requests.get()
    time.sleep(0.3)  # the reviewer takes her time: the trace's waiting time
    decision = runs.decide(request, make_reviewer("rita"), runs.Decision.approve(always=False))

    # Written with the audit row, before any export: the trace shows it at once.
    span = Span.objects.get(trace=trace, name="approval decision")
    assert span.span_type == "custom"
    assert span.parent_id == root_agent.span_id
    assert span.started_at == span.ended_at == decision.created
    waited = (decision.created - request.created).total_seconds()
    assert 0.3 <= span.data["waited_seconds"] == round(waited, 3)
    assert span.data == {
        "reviewer": "rita",
        "decision": "approve",
        "message": "",
        "always": False,
        "waited_seconds": span.data["waited_seconds"],
        "tool": "cancel_order",
        "call_id": request.call_id,
        "arguments_hash": request.arguments_hash,
    }
    assert Trace.objects.get(pk=trace.pk).status == TraceStatus.RUNNING  # resuming

    asyncio.run(runs.resume(run.pk))
    traces.flush()

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert Trace.objects.filter(run=run).count() == 1
    assert run.trace_id == trace.trace_id
    stored = Span.objects.filter(trace=trace)
    second_half = set(stored.values_list("span_id", flat=True)) - first_half - {span.span_id}
    assert second_half, "the resumed run's spans are in the same trace"
    assert stored.filter(span_type="task").count() == 2  # one per half
    assert stored_tree(trace.trace_id) == sdk_tree(traces, trace.trace_id)
    # The SDK announced the trace once: the resumption's spans came for an ended trace.
    assert [t["id"] for t in traces.sdk.traces] == [trace.trace_id]
    trace.refresh_from_db()
    assert trace.status == TraceStatus.OK == trace.derived_status()
    assert trace.ended_at == stored.latest("ended_at").ended_at
    [approved] = [s for s in stored if s.span_type == "function" and s.span_data["output"]]
    assert "cancelled" in approved.span_data["output"]
    assert approved.span_id in second_half
    # How it ended, and its time working apart from its time waiting for rita.
    assert (trace.outcome, trace.outcome_reason) == ("approved", "cancel_order: approved by rita")
    tasks = stored.filter(span_type="task", parent_id__isnull=True)
    worked = sum((t.duration_seconds or 0) for t in tasks)
    assert trace.active_seconds == pytest.approx(worked, abs=0.002)
    assert trace.waiting_seconds is not None and trace.waiting_seconds >= 0.3


def test_a_rejection_and_an_expiry_are_decision_spans_too(traces: Traces) -> None:
    rejected = run_to_end("cancel order 42")
    runs.decide(rejected.approval_requests.get(), make_reviewer(), runs.Decision.reject("Not now"))
    expired = run_to_end("cancel order 42")
    ApprovalRequest.objects.filter(run=expired).update(expires_at=timezone.now())
    assert runs.expire_overdue() == 1

    [rejection] = Span.objects.filter(trace_id=rejected.trace_id, name="approval decision")
    assert (rejection.data["reviewer"], rejection.data["decision"]) == ("rita", "reject")
    assert rejection.data["message"] == "Not now"
    [expiry] = Span.objects.filter(trace_id=expired.trace_id, name="approval decision")
    assert (expiry.data["reviewer"], expiry.data["decision"]) == ("expired", "expired")
    # No span of these runs was exported yet: the decisions created their trace rows.
    assert Trace.objects.get(trace_id=expired.trace_id).run == expired


def test_a_failed_run_has_an_error_trace(traces: Traces, settings: Any) -> None:
    agent = Agent(
        name="Flaky", model=ScriptedModel([ModelStep.raise_error(RuntimeError("model down"))])
    )
    run = run_to_end("hello", agent_name=scripted.install(settings, agent))
    assert run.status == RunStatus.FAILED
    # The engine marks it before any span is exported...
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.ERROR
    traces.flush()
    # ...and the export keeps it so, with the failing span.
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert trace.status == TraceStatus.ERROR == trace.derived_status()
    # Its outcome says why, in the words the user read (the run's reason's first line).
    assert trace.outcome == "failed" and trace.outcome_reason
    assert trace.outcome_reason == run.error.strip().splitlines()[0][:300]
    failing = Span.objects.get(trace=trace, error__isnull=False)
    assert failing.span_type == "agent"
    assert failing.error == {"message": "Error in agent run", "data": {"error": "model down"}}


def test_the_engine_passes_the_sensitive_data_setting_to_the_sdk(
    traces: Traces, settings: Any
) -> None:
    settings.AGENTSITE_TRACE_SENSITIVE_DATA = False
    run = run_to_end("where is order 7")
    traces.flush()
    function = next(s for s in traces.sdk.spans if kind(s) == "function")
    assert function["span_data"]["input"] is None  # the SDK left it out itself
    for span in Span.objects.filter(
        trace_id=run.trace_id, span_type__in=["generation", "function"]
    ):
        assert span.span_data["input"] is None
        assert span.span_data["output"] is None


def test_nothing_is_traced_by_the_engine_when_tracing_is_off(settings: Any) -> None:
    settings.AGENTSITE_TRACING = False
    run = run_to_end("cancel order 42")
    runs.decide(run.approval_requests.get(), make_reviewer(), runs.Decision.approve())
    assert not Trace.objects.filter(trace_id=run.trace_id).exists()
    assert not Span.objects.filter(trace_id=run.trace_id).exists()


# --- masking --------------------------------------------------------------------------------

EMAIL = "jane.doe@example.com"
PHONE = "+44 20 7946 0958"
CARD = "4111 1111 1111 1111"
CANARIES = [EMAIL, PHONE, CARD, "4111111111111111", "jane.doe", "7946 0958"]


@function_tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a customer."""
    return f"Sent to {to}: {subject}"


def test_personal_data_never_reaches_the_trace_store(traces: Traces, settings: Any) -> None:
    from demo.tools import cancel_order

    # The offline demo model records what it reads and writes in its generation spans.
    agent = Agent(name="Front", tools=[send_email, cancel_order])
    name = scripted.install(settings, agent)
    told = run_to_end(f"email {EMAIL} about card {CARD} and phone {PHONE}", agent_name=name)
    assert told.status == RunStatus.COMPLETED, told.error
    refused = run_to_end("cancel order 42", agent_name=name)
    runs.decide(
        refused.approval_requests.get(),
        make_reviewer(),
        runs.Decision.reject(f"Do not cancel; email {EMAIL} or call {PHONE}, card {CARD}"),
    )
    asyncio.run(runs.resume(refused.pk))
    traces.flush()

    # They were there: in the user's input, the tool's arguments and output, the rejection.
    def emitted(span_type: str) -> str:
        return json.dumps([span for span in traces.sdk.spans if kind(span) == span_type])

    generations, functions = emitted("generation"), emitted("function")
    assert all(canary in generations for canary in (EMAIL, PHONE, CARD))
    assert all(canary in functions for canary in (EMAIL, PHONE, CARD))
    assert "Sent to " + EMAIL in functions
    assert "A reviewer rejected this tool call: Do not cancel" in generations

    with connection.cursor() as cursor:
        stored = ""
        for table in (Span._meta.db_table, Trace._meta.db_table):
            cursor.execute(f"SELECT * FROM {table}")
            stored += repr(cursor.fetchall())
    assert Span.objects.filter(trace_id__in=[told.trace_id, refused.trace_id]).count() > 10
    for canary in CANARIES:
        assert stored.count(canary) == 0, canary
    for marker in ("[email]", "[phone]", "[card]"):
        assert marker in stored
    decision = Span.objects.get(trace_id=refused.trace_id, name="approval decision")
    assert decision.data["message"] == "Do not cancel; email [email] or call [phone], card [card]"


# --- admin ----------------------------------------------------------------------------------


def test_the_admin_shows_a_trace_with_its_spans(traces: Traces, admin_client: Any) -> None:
    run = run_to_end("where is order 7")
    traces.flush()
    trace = Trace.objects.get(trace_id=run.trace_id)
    span = Span.objects.get(trace=trace, span_type="function")

    listing = admin_client.get("/admin/tracing/trace/", {"q": trace.trace_id, "status": "ok"})
    page = admin_client.get(f"/admin/tracing/trace/{trace.pk}/change/")
    detail = admin_client.get(f"/admin/tracing/span/{span.pk}/change/")

    assert listing.status_code == page.status_code == detail.status_code == 200
    assert trace.trace_id in listing.content.decode()
    assert page.content.decode().count("/admin/tracing/span/") >= 7
    assert "lookup_order" in detail.content.decode()
    assert admin_client.post(f"/admin/tracing/trace/{trace.pk}/change/").status_code == 403


def test_the_trace_follows_its_run_in_one_statement_whatever_is_stored(settings: Any) -> None:
    """`recording.follow_run` creates the trace's row when the exporter has not stored it
    yet, sets its status from the run's, and keeps "error" once a span failed."""
    from tracing import recording

    settings.AGENTSITE_TRACING = True
    conversation = make_conversation(owner=make_user(username="alice"))
    run = AgentRun.objects.create(
        conversation=conversation, agent_name="support", input="hi", trace_id="trace_" + "a" * 32
    )
    run = AgentRun.objects.select_related("conversation").get(pk=run.pk)

    recording.follow_run(run, RunStatus.WAITING)  # no trace row yet: inserted
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert trace.status == TraceStatus.WAITING
    assert trace.run_id == run.pk and trace.group_id == conversation.session_id
    assert trace.metadata == {"run_id": str(run.pk), "agent": "support"}

    recording.follow_run(run, RunStatus.COMPLETED)  # the row exists: updated
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.OK

    Span.objects.create(
        span_id="span_" + "b" * 24, trace=trace, span_type="function", error={"message": "x"}
    )
    recording.follow_run(run, RunStatus.COMPLETED)  # a failed span wins over the run
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.ERROR

    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
    Span.objects.all().delete()
    recording.follow_run(run.pk)  # by id: the run's status is read
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.ERROR
    assert Trace.objects.count() == 1
