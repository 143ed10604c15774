"""The trace list operators scan (input, user, agent, outcome and why, active and waiting
time, tokens, cost, ratings), its filters (user, outcome, tool, span text, feedback), their
query plans at 100,000 traces, and the JSONL export of ticked or matching traces."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.models import DecisionKind
from engine import runs
from engine.models import RunStatus
from tests.conftest import Traces
from tests.factories import (
    T0,
    customer_for,
    grant,
    make_conversation,
    make_decision,
    make_request,
    make_reviewer,
    make_run,
    make_span,
    make_staff,
    make_trace,
    make_user,
    make_viewer,
)
from tests.plans import explain
from tests.tracing.test_trace_views import run_demo
from tracing import export_views
from tracing.models import Feedback, ModelPrice, Span, Trace, TraceOutcome, TraceStatus

pytestmark = pytest.mark.django_db

PRICED = "test-priced-model"
UNPRICED = "mystery-model"


def priced(model: str = PRICED) -> ModelPrice:
    """$1 a million input tokens, $0.50 a million cached ones, $4 a million output tokens."""
    return ModelPrice.objects.create(
        model=model,
        input_per_million=Decimal("1.00"),
        cached_input_per_million=Decimal("0.50"),
        output_per_million=Decimal("4.00"),
        valid_from=date(2026, 1, 1),
    )


def traced_run(
    outcome: str,
    *,
    text: str = "where is order 42?",
    username: str | None = None,
    reason: str = "",
    active: float = 1.5,
    waiting: float = 0.0,
    model: str = PRICED,
    usage: tuple[int, int, int] = (1000, 200, 100),
    tools: tuple[str, ...] = (),
    reply: str = "It ships tomorrow.",
    **trace_fields: Any,
) -> Trace:
    """A run of the support desk that ended with `outcome`, and its trace: a root task span,
    one model call of `model` with `usage` (input, cached, output) and a call of each tool."""
    owner = make_user(username=username) if username else make_user()
    run = make_run(owner=owner, input=text, status=RunStatus.COMPLETED, final_output=reply)
    trace_fields.setdefault("started_at", T0 - timedelta(minutes=Trace.objects.count() + 1))
    started = trace_fields["started_at"]
    trace = make_trace(
        run=run,
        outcome=outcome,
        outcome_reason=reason,
        active_seconds=active,
        ended_at=started + timedelta(seconds=active + waiting),
        total_tokens=usage[0] + usage[2],
        **trace_fields,
    )
    run.trace_id = trace.trace_id
    run.save(update_fields=["trace_id"])
    task = make_span(trace, "task", "agentsite: Support desk", end=active)
    spans = [task]
    if model:
        spans.append(
            make_span(
                trace,
                "generation",
                model,
                parent=task,
                model=model,
                # As the exporter copies it from the trace (`rows.trace_agent`).
                agent=trace.metadata.get("agent", ""),
                input_tokens=usage[0],
                cached_tokens=usage[1],
                output_tokens=usage[2],
                total_tokens=usage[0] + usage[2],
            )
        )
    for n, tool in enumerate(tools):
        spans.append(
            make_span(
                trace,
                "function",
                tool,
                parent=task,
                start=0.2 + n / 10,
                end=0.25 + n / 10,
                span_data={
                    "type": "function",
                    "name": tool,
                    "input": '{"order_id": 42}',
                    "output": f"{tool} done",
                },
            )
        )
    Span.objects.bulk_create(spans)
    return trace


def row_html(html: str, trace: Trace) -> str:
    row = html[html.index(f'id="trace-{trace.pk}"') :]
    return row[: row.index("</tr>")]


def listed(response: Any) -> list[str]:
    assert response.status_code == 200, response.context["form"].errors
    return [row.trace.trace_id for row in response.context["page"].rows]


# --- access ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace_costs", "trace_export_jsonl"])
def test_the_new_pages_let_operators_in_and_keep_everyone_else_out(name: str) -> None:
    url = reverse(name)
    anonymous = Client().get(url)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/accounts/login/?next=")
    for user, status in [
        (make_user(username="alice"), 403),
        (make_reviewer("rita"), 403),
        (make_viewer(), 200),
        (make_staff(), 200),
    ]:
        visitor = Client()
        visitor.force_login(user)
        assert visitor.get(url).status_code == status, (name, user.username)
        assert visitor.post(url).status_code in (403, 405)


# --- the rows -------------------------------------------------------------------------------


def test_each_row_shows_input_user_agent_outcome_times_tokens_cost_and_ratings(
    client: Client, olga: Any
) -> None:
    priced()
    long_text = "Please cancel order 42, mail me at bob@example.com " + "and more " * 30
    rejected = traced_run(
        TraceOutcome.REJECTED,
        text=long_text,
        username="alice",
        reason="cancel_order: rejected by rita: not today",
        active=2.0,
        waiting=3600.0,
        usage=(1_000_000, 200_000, 100_000),
    )
    failed = traced_run(TraceOutcome.FAILED, reason="The model refused", model=UNPRICED)
    completed = traced_run(TraceOutcome.COMPLETED, reason="")
    approved = traced_run(TraceOutcome.APPROVED, reason="cancel_order: approved by rita")
    expired = traced_run(TraceOutcome.EXPIRED, reason="cancel_order: expired by the expiry")
    guardrail = traced_run(TraceOutcome.GUARDRAIL, reason="Blocked: a secret")
    withdrawn = traced_run(TraceOutcome.WITHDRAWN, reason="Stopped by alice")
    assert rejected.run is not None and failed.run is not None
    Feedback.objects.create(run=rejected.run, user=make_user(), score=-1, comment="wrong")
    Feedback.objects.create(run=rejected.run, user=make_user(), score=-1)
    Feedback.objects.create(run=failed.run, user=make_user(), score=1)

    html = client.get(reverse("trace_list")).content.decode()

    row = row_html(html, rejected)
    # The input, masked and cut, the whole of it (masked) in the title.
    assert "bob@example.com" not in html
    assert "Please cancel order 42, mail me at [email] and more" in row
    shown = re.search(r'title="([^"]*)">(Please[^<]*)</a>', row)
    assert shown is not None
    assert len(shown.group(2)) <= 120 and shown.group(2).endswith("…")
    assert shown.group(1).startswith("Please cancel order 42, mail me at [email]")
    assert len(shown.group(1)) > 200
    assert '<td data-label="User" class="user"><a href="/traces/?user=alice"' in row
    assert '<td data-label="Agent">support</td>' in row
    assert '<span class="outcome outcome-rejected">Completed, a call rejected</span>' in row
    assert "cancel_order: rejected by rita: not today" in row
    assert '<td data-label="Active" class="num">2.00 s</td>' in row
    assert '<td data-label="Waiting" class="num">1 h 00 min</td>' in row
    assert '<td data-label="Tokens" class="num">1,100,000</td>' in row
    # 800k × $1 + 200k × $0.50 + 100k × $4, per million.
    assert '<span class="money">$1.30</span>' in row
    assert '<span class="rating rating-down">2 thumbs down</span>' in row

    row = row_html(html, failed)
    assert '<span class="outcome outcome-failed">Failed</span>' in row
    assert "The model refused" in row
    # Never $0 for a model without a price; olga may not add prices: no link.
    assert "$0" not in row
    assert (
        f'<span class="no-price" data-unpriced="{UNPRICED}">no price for {UNPRICED}</span>' in row
    )
    assert '<span class="rating rating-up">1 thumbs up</span>' in row

    for trace, css in [
        (completed, "outcome-completed"),
        (approved, "outcome-approved"),
        (expired, "outcome-expired"),
        (guardrail, "outcome-guardrail"),
        (withdrawn, "outcome-withdrawn"),
    ]:
        row = row_html(html, trace)
        assert f'class="outcome {css}">{trace.get_shown_outcome_display()}</span>' in row
        if trace.outcome_reason:
            assert f'<span class="reason" title="{trace.outcome_reason}">' in row
        else:
            assert 'class="reason"' not in row
        assert '<td data-label="Feedback" class="feedback">—</td>' in row
    assert f'href="{reverse("trace_costs")}"' in html


@pytest.mark.django_db(transaction=True)
def test_a_real_run_of_the_demo_shows_its_input_user_outcome_tool_and_unpriced_model(
    client: Client, traces: Traces, demo: None
) -> None:
    """A run traced as in production: the exporter's spans, the engine's outcome."""
    client.force_login(make_viewer())
    run = run_demo("where is order 7? I am chen@example.com")
    traces.flush()
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert trace.outcome == TraceOutcome.COMPLETED and trace.active_seconds

    response = client.get(reverse("trace_list"), {"tool": "lookup_order", "outcome": "completed"})
    assert listed(response) == [trace.trace_id]
    row = row_html(response.content.decode(), trace)
    assert "where is order 7? I am [email]" in row and "chen@example.com" not in row
    assert '<a href="/traces/?user=chen"' in row
    assert '<span class="outcome outcome-completed">Completed</span>' in row
    # The offline demo model has no price in tests: never $0.
    assert (
        '<span class="no-price" data-unpriced="offline-demo">no price for offline-demo</span>'
        in row
        and "$0" not in row
    )
    assert f'<td data-label="Tokens" class="num">{trace.total_tokens:,}</td>' in row
    assert trace.total_tokens > 0


def test_people_who_may_add_prices_get_a_link_to_add_one(client: Client) -> None:
    trace = traced_run(TraceOutcome.COMPLETED, model=UNPRICED)
    keeper = grant(make_staff("pam"), "tracing.add_modelprice")
    client.force_login(keeper)
    row = row_html(client.get(reverse("trace_list")).content.decode(), trace)
    add = reverse("admin:tracing_modelprice_add") + f"?model={UNPRICED}"
    assert f'<a href="{add}" title="Add a price for {UNPRICED}">no price for {UNPRICED}</a>' in row
    # Staff without the permission read the same words, without the link.
    client.force_login(make_staff("sam"))
    row = row_html(client.get(reverse("trace_list")).content.decode(), trace)
    assert (
        f'<span class="no-price" data-unpriced="{UNPRICED}">no price for {UNPRICED}</span>' in row
        and add not in row
    )


def test_model_and_user_text_on_the_rows_is_escaped(client: Client, olga: Any) -> None:
    xss = "<script>alert(1)</script>"
    trace = traced_run(TraceOutcome.FAILED, text=xss, reason=xss, username="x<b>y")
    assert trace.run is not None
    html = client.get(reverse("trace_list")).content.decode()
    row = row_html(html, trace)
    assert xss not in html and "<b>" not in row
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in row


def test_a_page_reads_as_many_queries_for_50_rows_as_for_5(
    client: Client, olga: Any, django_assert_num_queries: Any
) -> None:
    priced()

    def counted() -> int:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(reverse("trace_list"))
        assert response.status_code == 200
        return len(captured.captured_queries)

    def seed(count: int) -> None:
        for n in range(count):
            trace = traced_run(
                TraceOutcome.REJECTED if n % 2 else TraceOutcome.COMPLETED,
                model=UNPRICED if n % 3 else PRICED,
                tools=("lookup_order",),
            )
            assert trace.run is not None
            Feedback.objects.create(run=trace.run, user=trace.run.requested_by, score=1)

    seed(5)
    few = counted()
    seed(45)
    assert len(client.get(reverse("trace_list")).context["page"].rows) == 50
    assert counted() == few


# --- filters --------------------------------------------------------------------------------


def test_it_filters_by_user_outcome_tool_span_text_and_feedback(client: Client, olga: Any) -> None:
    alice = traced_run(TraceOutcome.COMPLETED, username="alice", tools=("lookup_order",))
    bruno = traced_run(
        TraceOutcome.REJECTED, username="bruno", tools=("lookup_order", "cancel_order")
    )
    failing = traced_run(TraceOutcome.FAILED, username="chen")
    Span.objects.filter(trace=failing, span_type="task").update(
        error={"message": "Tool timed out after 30 s", "data": None}
    )
    foreign = make_trace(status=TraceStatus.ERROR, metadata={})  # no run, no outcome stored
    make_span(foreign, "custom", "nightly sync").save()
    assert alice.run is not None and bruno.run is not None
    Feedback.objects.create(run=alice.run, user=make_user(), score=1)
    Feedback.objects.create(run=bruno.run, user=make_user(), score=-1, comment="rude")

    def found(**query: str) -> set[str]:
        return set(listed(client.get(reverse("trace_list"), query)))

    ids = {t.trace_id: t for t in (alice, bruno, failing, foreign)}
    assert found() == set(ids)
    assert found(user="alice") == {alice.trace_id}
    assert found(user="nobody") == set()
    assert found(outcome="rejected") == {bruno.trace_id}
    # A trace without a stored outcome has its status's: the foreign error is failed.
    assert found(outcome="failed") == {failing.trace_id, foreign.trace_id}
    assert found(outcome="completed") == {alice.trace_id}
    assert found(tool="lookup_order") == {alice.trace_id, bruno.trace_id}
    assert found(tool="cancel_order") == {bruno.trace_id}
    assert found(tool="lookup") == set()  # a tool's exact name
    assert found(span="TIMED OUT") == {failing.trace_id}  # an error's message
    assert found(span="nightly") == {foreign.trace_id}  # a span's name
    assert found(span="cancel_") == {bruno.trace_id}
    assert found(feedback="up") == {alice.trace_id}
    assert found(feedback="down") == {bruno.trace_id}
    assert found(feedback="any") == {alice.trace_id, bruno.trace_id}
    assert found(tool="lookup_order", feedback="down", user="bruno") == {bruno.trace_id}
    assert client.get(reverse("trace_list"), {"outcome": "great"}).status_code == 400
    assert client.get(reverse("trace_list"), {"feedback": "meh"}).status_code == 400


def test_paging_links_and_the_export_keep_the_filters(
    client: Client, olga: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tracing.list_views.PAGE_SIZE", 2)
    for _ in range(5):
        traced_run(TraceOutcome.REJECTED, tools=("cancel_order",))
    traced_run(TraceOutcome.COMPLETED, tools=("cancel_order",))
    response = client.get(reverse("trace_list"), {"outcome": "rejected", "tool": "cancel_order"})
    older = response.context["older_url"]
    assert "outcome=rejected" in older and "tool=cancel_order" in older
    assert response.context["export_all_url"] == (
        reverse("trace_export_jsonl") + "?outcome=rejected&tool=cancel_order"
    )
    seen = listed(response)
    while older:
        response = client.get(older)
        seen += listed(response)
        older = response.context["older_url"]
    assert len(seen) == len(set(seen)) == 5
    assert {t.outcome for t in Trace.objects.filter(trace_id__in=seen)} == {"rejected"}


def test_the_outcome_and_tool_filters_read_an_index_at_100000_traces(
    client: Client, olga: Any
) -> None:
    begun = time.monotonic()
    outcomes = ["completed"] * 6 + ["approved", "rejected", "failed", ""]
    # Rows written by plain INSERTs: the ORM's bulk_create takes four times as long.
    at = [
        connection.ops.adapt_datetimefield_value(T0 - timedelta(seconds=n)) for n in range(100_000)
    ]
    now = connection.ops.adapt_datetimefield_value(T0)
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO tracing_trace (trace_id, workflow_name, group_id, metadata, started_at,"
            " ended_at, status, total_tokens, outcome, outcome_reason, created, updated)"
            " VALUES (%s, 'agentsite: Support desk', '', '{}', %s, %s, %s, 0, %s, '', %s, %s)",
            [
                (
                    f"trace_bulk_{n:027d}",
                    at[n],
                    at[n],
                    TraceStatus.ERROR if n % 10 == 9 else TraceStatus.OK,
                    outcomes[n % 10],
                    now,
                    now,
                )
                for n in range(100_000)
            ],
        )
        # One tool call in every trace; a rare tool in one trace of a thousand.
        cursor.executemany(
            "INSERT INTO tracing_span (span_id, trace_id, parent_id, span_type, name, started_at,"
            " ended_at, span_data, total_tokens, model, input_tokens, cached_tokens,"
            " output_tokens, agent) VALUES (%s, %s, 'span_root', 'function', %s, %s, %s, '{}', 0,"
            " '', 0, 0, 0, '')",
            [
                (
                    f"span_bulk_{n:024d}",
                    f"trace_bulk_{n:027d}",
                    "issue_refund" if n % 1000 == 7 else "lookup_order",
                    at[n],
                    at[n],
                )
                for n in range(100_000)
            ],
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"seeded in {time.monotonic() - begun:.1f} s")
    client.get(reverse("trace_list"))  # templates loaded: the times below are the queries'

    for query, indexes, expected in [
        ({"outcome": "rejected"}, {"trace_outcome_started", "trace_started"}, 50),
        # A tenth of the traces: walking the newest-first index and filtering is as good.
        # Or the dashboard's (started_at, outcome, status, ...): newest first, the outcome read
        # from the index itself.
        ({"outcome": "failed"}, {"trace_outcome_started", "trace_started", "trace_dashboard"}, 50),
        ({"tool": "issue_refund"}, {"span_tool"}, 50),
        # A common tool: the planner may probe each trace's spans instead (PostgreSQL does).
        (
            {"tool": "lookup_order", "outcome": "approved"},
            {"span_tool", "trace_outcome_started", "span_trace_started"},
            50,
        ),
    ]:
        with CaptureQueriesContext(connection) as captured:
            asked = time.monotonic()
            response = client.get(reverse("trace_list"), query)
            took = time.monotonic() - asked
        assert len(listed(response)) == expected, query
        [listing] = [
            q["sql"]
            for q in captured.captured_queries
            if "tracing_trace" in q["sql"] and "LIMIT 51" in q["sql"]
        ]
        plan = explain(listing)
        print(f"\n{query}: {took * 1000:.0f} ms: {plan}")
        assert any(index in plan for index in indexes), (query, plan)
        assert not re.search(r"\bSCAN tracing_trace\b(?! USING)|Seq Scan on tracing_trace", plan)
        assert not re.search(r"\bSCAN tracing_span\b(?! USING)|Seq Scan on tracing_span", plan)


# --- the JSONL export -----------------------------------------------------------------------


def read_lines(response: Any) -> list[dict[str, Any]]:
    """The streamed body, read as a server would (the generator is asynchronous)."""
    assert response.status_code == 200
    assert response.streaming

    async def collect() -> list[str]:
        return [part async for part in response.streaming_content]

    parts = asyncio.run(collect())
    body = b"".join(p if isinstance(p, bytes) else p.encode() for p in parts).decode()
    assert body.endswith("\n")
    return [json.loads(line) for line in body.splitlines()]


@pytest.mark.django_db(transaction=True)
def test_the_export_of_ticked_traces_is_one_masked_line_each(client: Client) -> None:
    client.force_login(make_viewer())
    priced()
    asked = traced_run(
        TraceOutcome.REJECTED,
        text="cancel order 42, I am bob@example.com",
        username="alice",
        reason="cancel_order: rejected by rita: not today",
        tools=("lookup_order", "cancel_order"),
        reply="I could not cancel it; call +44 20 7946 0958.",
        usage=(1_000_000, 0, 0),
    )
    unpriced = traced_run(TraceOutcome.COMPLETED, model=UNPRICED)
    traced_run(TraceOutcome.COMPLETED)  # not ticked
    assert asked.run is not None
    request = make_request(run=asked.run, tool_name="cancel_order")
    make_decision(
        request=request,
        kind=DecisionKind.REJECTED,
        approved=False,
        message="Not today: write to rita@example.com",
    )
    Feedback.objects.create(
        run=asked.run, user=make_user(), score=-1, comment="It ignored me, carol@example.com"
    )

    response = client.get(
        reverse("trace_export_jsonl"),
        {"trace": [asked.trace_id, unpriced.trace_id], "selected": "1"},
    )
    assert response["Content-Disposition"] == 'attachment; filename="traces.jsonl"'
    assert response["Content-Type"].startswith("application/x-ndjson")
    lines = read_lines(response)
    assert [line["trace_id"] for line in lines] == [asked.trace_id, unpriced.trace_id]
    first = lines[0]
    assert set(first) == {
        "trace_id", "started_at", "user", "agent", "input", "output", "tools", "approvals",
        "outcome", "reason", "tokens", "cost", "cost_usd", "feedback",
    }  # fmt: skip
    assert first["user"] == "alice" and first["agent"] == "support"
    assert first["input"] == "cancel order 42, I am [email]"
    assert first["output"] == "I could not cancel it; call [phone]."
    assert [tool["name"] for tool in first["tools"]] == ["lookup_order", "cancel_order"]
    assert first["tools"][1] == {
        "name": "cancel_order",
        "arguments": '{"order_id": 42}',
        "output": "cancel_order done",
    }
    [approval] = first["approvals"]
    assert approval == {
        "tool": "cancel_order",
        "decision": "rejected",
        "reviewer": "rita",
        "message": "Not today: write to [email]",
    }
    assert first["outcome"] == "rejected"
    assert first["reason"] == "cancel_order: rejected by rita: not today"
    assert first["tokens"] == 1_000_000
    assert first["cost"] == "$1.00" and first["cost_usd"] == 1.0
    assert first["feedback"] == [{"score": -1, "comment": "It ignored me, [email]"}]
    second = lines[1]
    assert second["cost"] == f"no price for {UNPRICED}" and second["cost_usd"] is None
    assert second["approvals"] == [] and second["feedback"] == []


@pytest.mark.django_db(transaction=True)
def test_the_export_of_all_matching_follows_the_filters_in_chunks_up_to_its_limit(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.force_login(make_viewer())
    monkeypatch.setattr(export_views, "CHUNK", 3)
    rejected = [traced_run(TraceOutcome.REJECTED, model="") for _ in range(7)]
    traced_run(TraceOutcome.COMPLETED, model="")
    newest_first = [t.trace_id for t in rejected]  # each one made a minute older

    lines = read_lines(client.get(reverse("trace_export_jsonl"), {"outcome": "rejected"}))
    assert [line["trace_id"] for line in lines] == newest_first
    assert all(line["cost"] == "no model calls" and line["cost_usd"] == 0 for line in lines)

    monkeypatch.setattr(export_views, "EXPORT_LIMIT", 5)
    lines = read_lines(client.get(reverse("trace_export_jsonl"), {"outcome": "rejected"}))
    assert [line["trace_id"] for line in lines] == newest_first[:5]
    every = read_lines(client.get(reverse("trace_export_jsonl")))
    assert len(every) == 5


def test_an_empty_selection_or_a_bad_filter_is_a_400(client: Client, olga: Any) -> None:
    traced_run(TraceOutcome.COMPLETED)
    response = client.get(reverse("trace_export_jsonl"), {"selected": "1"})
    assert response.status_code == 400
    assert "Select the traces to export first." in response.content.decode()
    assert client.get(reverse("trace_export_jsonl"), {"outcome": "x"}).status_code == 400
    too_many = {"trace": [f"trace_{n}" for n in range(1001)]}
    assert client.get(reverse("trace_export_jsonl"), too_many).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_the_export_lists_a_call_that_paused_once_where_it_ran(
    client: Client, traces: Traces, demo: None
) -> None:
    """The SDK's span of a call at its pause (no output) is not a second call."""
    owner = customer_for("cancel order 42")
    conversation = make_conversation(owner=owner, agent_name="support")
    run = runs.start_run(conversation, "cancel order 42", owner)
    asyncio.run(runs.execute(run.pk))
    runs.decide(run.approval_requests.get(), make_reviewer("rita"), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    traces.flush()
    client.force_login(make_viewer())
    [line] = read_lines(client.get(reverse("trace_export_jsonl"), {"trace": run.trace_id}))
    assert [tool["name"] for tool in line["tools"]] == ["cancel_order"]
    assert "is now cancelled" in line["tools"][0]["output"]
    assert [a["decision"] for a in line["approvals"]] == ["approved"]
