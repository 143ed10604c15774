"""The trace viewer through the Django test client: who may see it, the list (filters, search,
keyset pages over 100,000 traces), one trace as a tree and a waterfall, one span's details,
and the JSON export in the SDK's shape."""

from __future__ import annotations

import asyncio
import json
import re
import time
from datetime import timedelta
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from demo import model as demo_model
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.conftest import Traces
from tests.factories import (
    REVIEWER,
    T0,
    customer_for,
    grant,
    make_conversation,
    make_reviewer,
    make_run,
    make_span,
    make_staff,
    make_trace,
    make_user,
    make_viewer,
)
from tests.plans import explain
from tracing import tree as trees
from tracing.forms import make_cursor
from tracing.models import Span, Trace, TraceStatus
from tracing.recording import DECISION_SPAN_NAME

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
HTMX = {"HTTP_HX_REQUEST": "true"}

# The keys of the SDK's exports (openai-agents 0.24; /work/shared/samples/sample_trace.json).
SDK_TRACE_KEYS = {"object", "id", "workflow_name", "group_id", "metadata"}
SDK_SPAN_KEYS = {
    "object",
    "id",
    "trace_id",
    "parent_id",
    "started_at",
    "ended_at",
    "span_data",
    "error",
}


# --- people ---------------------------------------------------------------------------------


# --- traces made in the database ------------------------------------------------------------


def realistic_spans(trace: Trace, count: int) -> list[Span]:
    """`count` spans shaped like a long run: a task, an agent, then turns of a generation and
    a tool call each."""
    task = make_span(trace, "task", "agentsite: Support desk", end=count)
    agent = make_span(trace, "agent", "Support desk", parent=task, start=0.01, end=count)
    spans = [task, agent]
    turn_number = 0
    while len(spans) < count:
        turn_number += 1
        at = float(turn_number)
        turn = make_span(trace, "turn", f"turn {turn_number}", parent=agent, start=at, end=at + 1)
        generation = make_span(
            trace,
            "generation",
            "gpt-4.1-mini",
            parent=turn,
            start=at,
            end=at + 0.6,
            span_data={"type": "generation", "model": "gpt-4.1-mini", "usage": {}},
        )
        function = make_span(
            trace,
            "function",
            "lookup_order",
            parent=turn,
            start=at + 0.6,
            end=at + 0.9,
            span_data={"type": "function", "name": "lookup_order", "input": "{}", "output": "x"},
        )
        spans += [turn, generation, function]
    return spans[:count]


def text(response: Any) -> str:
    return response.content.decode()


def listed(response: Any) -> list[str]:
    return [row.trace.trace_id for row in response.context["page"].rows]


# --- runs of the demo agent, traced as in production ----------------------------------------


def run_demo(text: str, agent_name: str = "support") -> AgentRun:
    """A run of the demo on `text`, asked by the customer of the order it names."""
    owner = customer_for(text)
    conversation = make_conversation(owner=owner, agent_name=agent_name)
    run = runs.start_run(conversation, text, owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def script_demo_model(monkeypatch: pytest.MonkeyPatch, replies: list[Any]) -> None:
    """Make the offline demo model say `replies`, in order (it still counts tokens and traces
    its generations as it always does)."""
    queue = list(replies)
    monkeypatch.setattr(demo_model, "decide", lambda items, tools, handoffs: queue.pop(0))


HANDOFF_AND_TOOLS = [
    demo_model.ToolCall("lookup_order", {"order_id": 7}),
    demo_model.ToolCall("transfer_to_billing", {}),
    demo_model.ToolCall("issue_refund", {"order_id": 7, "amount": 20.0}),
    demo_model.Say("I refunded $20.00 on order 7; it reaches your card in 3–5 days."),
]


def trace_page(client: Client, trace_id: str) -> str:
    response = client.get(reverse("trace_detail", args=[trace_id]))
    assert response.status_code == 200
    return text(response)


def tree_lines(html: str) -> list[str]:
    """The tree as `depth type name` lines, in the order shown."""
    rows = re.findall(
        r'data-depth="(\d+)"><div class="name-cell">.*?<span class="type type-[\w-]+">'
        r"([^<]+)</span><span class=\"span-name\">([^<]*)</span>",
        html,
    )
    return ["  " * int(depth) + f"{kind} {name}" for depth, kind, name in rows]


# --- access ---------------------------------------------------------------------------------


def test_it_lets_operators_in_and_keeps_everyone_else_out(client: Client) -> None:
    trace = make_trace()
    span = make_span(trace, "task")
    span.save()
    urls = [
        reverse("trace_list"),
        reverse("trace_detail", args=[trace.trace_id]),
        reverse("trace_tree", args=[trace.trace_id]),
        reverse("trace_span", args=[trace.trace_id, span.span_id]),
        reverse("trace_export", args=[trace.trace_id]),
    ]
    assert urls[-1] == f"/traces/{trace.trace_id}.json"
    people = {
        "plain": make_user(username="alice"),
        "reviewer": make_reviewer("rita"),
        "staff": make_staff(),
        "viewer": make_viewer(),
        "superuser": make_user(username="root", is_staff=True, is_superuser=True),
    }
    expected = {"plain": 403, "reviewer": 403, "staff": 200, "viewer": 200, "superuser": 200}

    for url in urls:
        anonymous = Client().get(url)
        assert anonymous.status_code == 302
        assert anonymous["Location"].startswith("/accounts/login/?next=")
        for who, user in people.items():
            visitor = Client()
            visitor.force_login(user)
            assert visitor.get(url).status_code == expected[who], (url, who)
        viewer = Client()
        viewer.force_login(people["viewer"])
        assert viewer.post(url).status_code == 405  # read-only


def test_unknown_traces_and_spans_are_404(client: Client, olga: Any) -> None:
    trace = make_trace()
    other = make_trace()
    foreign = make_span(other, "task")
    foreign.save()
    assert client.get("/traces/trace_nope/").status_code == 404
    assert client.get("/traces/trace_nope.json").status_code == 404
    # A span is found only under its own trace.
    assert client.get(f"/traces/{trace.trace_id}/spans/{foreign.span_id}/").status_code == 404


def test_the_nav_links_the_trace_viewer_for_operators_only(client: Client) -> None:
    client.force_login(make_viewer())
    assert 'href="/traces/">Traces</a>' in text(client.get(reverse("trace_list")))
    client.force_login(make_user(username="alice"))
    assert 'href="/traces/"' not in text(client.get(reverse("chats")))


# --- the list -------------------------------------------------------------------------------


def test_the_list_shows_every_trace_newest_first_with_its_numbers(
    client: Client, olga: Any
) -> None:
    older = make_trace(status=TraceStatus.ERROR, total_tokens=12, group_id="conv_a")
    newer = make_trace(
        started_at=T0,
        ended_at=T0 + timedelta(milliseconds=850),
        total_tokens=12_345,
        active_seconds=0.85,
    )
    Span.objects.bulk_create(
        [make_span(newer, "task"), make_span(newer, "agent"), make_span(older, "task")]
    )
    make_trace(started_at=None, ended_at=None)  # no span stored yet: nothing to show

    response = client.get(reverse("trace_list"))
    html = text(response)

    assert listed(response) == [newer.trace_id, older.trace_id]
    row = html[html.index(f'id="trace-{newer.pk}"') :]
    row = row[: row.index("</tr>")]
    assert f'href="/traces/{newer.trace_id}/">agentsite: Support desk</a>' in row
    assert f'<code class="trace-id-small" title="{newer.trace_id}">{newer.trace_id}</code>' in row
    assert '<td data-label="Agent">support</td>' in row
    # A trace without a run shows its status's outcome.
    assert '<span class="outcome outcome-completed">Completed</span>' in row
    assert "Nov 30, 09:00:00" in row
    assert '<td data-label="Active" class="num">850 ms</td>' in row
    assert '<td data-label="Waiting" class="num">—</td>' in row
    assert '<td data-label="Tokens" class="num">12,345</td>' in row
    assert '<td data-label="Spans" class="num">2</td>' in row
    assert f'href="/traces/?conversation={newer.group_id}"' in row
    assert '<span class="outcome outcome-failed">Failed</span>' in html


def test_it_filters_by_agent_conversation_status_and_dates(client: Client, olga: Any) -> None:
    support = make_trace(group_id="conv_1", status=TraceStatus.OK)
    billing = make_trace(
        workflow_name="agentsite: Billing", group_id="conv_1", status=TraceStatus.ERROR
    )
    waiting = make_trace(group_id="conv_2", status=TraceStatus.WAITING)
    foreign = make_trace(workflow_name="nightly-batch", metadata={})
    last_week = make_trace(started_at=T0 - timedelta(days=7))

    def found(**query: str) -> set[str]:
        response = client.get(reverse("trace_list"), query)
        assert response.status_code == 200, response.context["form"].errors
        return set(listed(response))

    everything = {t.trace_id for t in (support, billing, waiting, foreign, last_week)}
    assert found() == everything
    # The registered agent "support" stands for its runs' workflow, "agentsite: Support desk".
    assert found(agent="support") == everything - {billing.trace_id, foreign.trace_id}
    assert found(agent="agentsite: Billing") == {billing.trace_id}
    assert found(agent="nightly-batch") == {foreign.trace_id}
    assert found(conversation="conv_1") == {support.trace_id, billing.trace_id}
    assert found(status="waiting") == {waiting.trace_id}
    assert found(status="ok", conversation="conv_1") == {support.trace_id}
    assert found(since="2026-11-23", until="2026-11-23") == {last_week.trace_id}
    assert found(since="2026-11-24") == everything - {last_week.trace_id}
    assert found(until="2026-11-29") == {last_week.trace_id}
    assert found(conversation="conv_nobody") == set()


def test_it_searches_ids_workflows_conversations_and_span_names(client: Client, olga: Any) -> None:
    weather = make_trace(workflow_name="weather-desk", group_id="conv_rome")
    plain = make_trace()
    tool = make_span(plain, "function", "get_weather_forecast")
    tool.save()

    def found(q: str) -> set[str]:
        response = client.get(reverse("trace_list"), {"q": q})
        assert response.status_code == 200
        return set(listed(response))

    assert found(weather.trace_id) == {weather.trace_id}
    assert found(tool.span_id) == {plain.trace_id}
    assert found("conv_rome") == {weather.trace_id}
    assert found("WEATHER-DESK") == {weather.trace_id}
    assert found("forecast") == {plain.trace_id}
    assert found("weather") == {weather.trace_id, plain.trace_id}
    assert found("nothing like it") == set()
    html = text(client.get(reverse("trace_list"), {"q": "nothing like it"}))
    assert "No trace matches this filter." in html


def test_an_invalid_filter_is_a_400_with_the_form_errors(client: Client, olga: Any) -> None:
    make_trace()
    for query, message in [
        ({"status": "finished"}, "Select a valid choice"),
        ({"since": "yesterday"}, "Enter a valid date"),
        ({"since": "2026-11-30", "until": "2026-11-01"}, "The date range ends before it starts"),
        ({"older": "1764493200000000"}, "This page link is not valid"),
        ({"older": "1-2", "newer": "3-4"}, "Page older or newer, not both"),
        ({"q": "x" * 201}, "at most 200 characters"),
    ]:
        response = client.get(reverse("trace_list"), query)
        assert response.status_code == 400, query
        html = text(response)
        assert "This filter is not valid" in html and message in html, query
        assert response.context["page"].rows == []
        assert "Fix the filter to see traces." in html


@pytest.mark.parametrize(
    ("time_zone", "query"),
    [
        ("UTC", {"until": "9999-12-31"}),
        ("Asia/Tokyo", {"since": "0001-01-01"}),  # midnight in Tokyo is before year 1 in UTC
        ("America/New_York", {"until": "9999-12-31"}),
    ],
)
def test_a_date_bound_out_of_range_is_a_form_error_not_a_500(
    client: Client, olga: Any, settings: Any, time_zone: str, query: dict[str, str]
) -> None:
    settings.TIME_ZONE = time_zone
    make_trace()
    response = client.get(reverse("trace_list"), query)
    assert response.status_code == 400, query
    html = text(response)
    assert "This filter is not valid" in html and "This date is out of range" in html, query
    assert response.context["page"].rows == []


def test_the_first_and_last_representable_days_still_filter(client: Client, olga: Any) -> None:
    trace = make_trace()
    response = client.get(reverse("trace_list"), {"since": "0001-01-02", "until": "9999-12-30"})
    assert response.status_code == 200
    assert listed(response) == [trace.trace_id]


def test_it_pages_through_100000_traces_by_keyset_through_an_index(
    client: Client, olga: Any, django_assert_max_num_queries: Any
) -> None:
    statuses = [TraceStatus.OK, TraceStatus.OK, TraceStatus.OK, TraceStatus.ERROR]
    Trace.objects.bulk_create(
        (
            Trace(
                trace_id=f"trace_bulk_{n:027d}",
                workflow_name="agentsite: Support desk",
                group_id=f"conv_{n // 5}",
                status=statuses[n % 4],
                # Pairs of traces start in the same microsecond: the primary key breaks ties.
                started_at=T0 - timedelta(seconds=n // 2),
                ended_at=T0 - timedelta(seconds=n // 2) + timedelta(milliseconds=300),
            )
            for n in range(100_000)
        ),
        batch_size=10_000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # planner statistics, as a live database has them

    def page(url: str) -> tuple[Any, list[str]]:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(url)
        assert response.status_code == 200
        return response, [query["sql"] for query in captured.captured_queries]

    # Newest first, 50 a page, each next page strictly older, none counted.
    seen: list[str] = []
    url = reverse("trace_list")
    # The session, the user, the traces, their spans counted, the price table, their calls'
    # usage, their runs' ratings (tests/tracing/test_list_views.py: the same for 5 rows and 50).
    for _ in range(4):
        with django_assert_max_num_queries(9):
            response, queries = page(url)
        seen += listed(response)
        assert not any("COUNT(" in sql.upper() for sql in queries if "tracing_span" not in sql)
        url = response.context["older_url"]
    assert len(seen) == len(set(seen)) == 200
    stored = Trace.objects.order_by("-started_at", "-pk").values_list("trace_id", flat=True)
    assert seen == list(stored[:200])

    # A page deep in the list costs what the first one does: the keyset seeks, it never skips.
    deep = Trace.objects.order_by("-started_at", "-pk")[99_970]
    assert deep.started_at is not None
    deep_url = reverse("trace_list") + f"?older={make_cursor(deep.started_at, deep.pk)}"
    with django_assert_max_num_queries(9):
        response, queries = page(deep_url)
    assert len(listed(response)) == 29 and not response.context["older_url"]
    assert response.context["newer_url"]
    back, _ = page(response.context["newer_url"])
    assert listed(back) == list(stored[99_921:99_971])

    # The query behind each kind of page reads an index; none scans the table. (Which index
    # is the planner's choice: PostgreSQL may walk `-started_at` and filter a common status.)
    newest_first = {"trace_started"}
    by_status = {"trace_status_started", "trace_started"}
    for url, indexes in [
        (reverse("trace_list"), newest_first),
        (deep_url, newest_first),
        (reverse("trace_list") + "?status=error", by_status),
        (reverse("trace_list") + "?status=ok&since=2026-11-29", by_status),
        (reverse("trace_list") + "?conversation=conv_77", {"trace_group"}),
        (reverse("trace_list") + "?agent=support", {"trace_workflow", "trace_started"}),
    ]:
        _, queries = page(url)
        [listing] = [sql for sql in queries if "tracing_trace" in sql and "LIMIT 51" in sql]
        plan = explain(listing)
        assert any(index in plan for index in indexes), (url, plan)
        assert not re.search(r"\bSCAN tracing_trace\b(?! USING)|Seq Scan on tracing_trace", plan)
        print(f"\n{url}: {plan}")


# --- one trace: made in the database --------------------------------------------------------


def test_the_detail_page_reads_the_same_number_of_queries_for_10_and_2000_spans(
    client: Client, olga: Any, django_assert_num_queries: Any
) -> None:
    small, large = make_trace(), make_trace()
    Span.objects.bulk_create(realistic_spans(small, 10))
    Span.objects.bulk_create(realistic_spans(large, 2000), batch_size=500)

    def urls(trace: Trace) -> list[str]:
        span = Span.objects.filter(trace=trace, span_type="function").last()
        assert span is not None
        return [
            reverse("trace_detail", args=[trace.trace_id]),
            reverse("trace_tree", args=[trace.trace_id]),
            reverse("trace_span", args=[trace.trace_id, span.span_id]),  # the page, span open
        ]

    client.get(urls(small)[0])  # templates compiled, permissions looked up once
    for few_url, many_url in zip(urls(small), urls(large), strict=True):
        with CaptureQueriesContext(connection) as few:
            assert client.get(few_url).status_code == 200
        with django_assert_num_queries(len(few)):
            started = time.perf_counter()
            response = client.get(many_url)
            elapsed = time.perf_counter() - started
        assert response.status_code == 200
        print(f"\n{many_url}: {len(few)} queries; 2,000 spans in {elapsed * 1000:.0f} ms")

    page_url = urls(large)[0]
    with CaptureQueriesContext(connection) as queries:
        html = text(client.get(page_url))
    assert html.count('class="span-link"') == 2000
    # Every subtree is a node with its fold, closed once, none twice.
    assert html.count('<div class="node"') == html.count('<details class="fold"') > 600
    assert html.count("<div") == html.count("</div>")
    # The session, the user, her permissions (two), the trace, its spans' shape (ids and
    # parents: what a big trace's first view reads of the spans it does not show), its spans,
    # its model calls' usage (for the summary's tokens and cost), its conversation.
    assert len(queries) == 9


def test_spans_whose_parent_is_missing_are_shown_at_the_root(client: Client, olga: Any) -> None:
    trace = make_trace()
    root = make_span(trace, "task", "the task", end=1)
    child = make_span(trace, "agent", "Support desk", parent=root, start=0.1, end=0.9)
    lost = make_span(trace, "function", "lookup_order", parent="span_never_exported", start=0.2)
    looped_a = make_span(trace, "custom", "loop a", parent="span_loop_b", span_id="span_loop_a")
    looped_b = make_span(trace, "custom", "loop b", parent="span_loop_a", span_id="span_loop_b")
    Span.objects.bulk_create([root, child, lost, looped_a, looped_b])

    html = trace_page(client, trace.trace_id)
    assert tree_lines(html) == [
        "task the task",
        "  agent Support desk",
        "function lookup_order",
        "custom loop a",
        "  custom loop b",
    ]
    assert html.count(">no parent</span>") == 2


def test_the_waterfall_places_each_bar_by_its_start_and_duration(client: Client, olga: Any) -> None:
    trace = make_trace()
    root = make_span(trace, "task", "task", start=0, end=2)
    early = make_span(trace, "generation", "gpt", parent=root, start=0.5, end=1.0)
    late = make_span(trace, "function", "tool", parent=root, start=1.5, end=2.0)
    Span.objects.bulk_create([root, early, late])

    html = trace_page(client, trace.trace_id)
    assert 'class="bar kind-task" aria-hidden="true"><rect x="0.000%" width="100.000%"' in html
    assert (
        'class="bar kind-generation" aria-hidden="true"><rect x="25.000%" width="25.000%"' in html
    )
    assert 'class="bar kind-function" aria-hidden="true"><rect x="75.000%" width="25.000%"' in html
    # Each duration label where it fits: after the bar, or before one that ends at the right.
    assert '<text class="bar-time is-after" x="50.000%" y="50%">500 ms</text>' in html
    assert '<text class="bar-time is-before" x="75.000%" y="50%">500 ms</text>' in html
    assert '<text class="bar-time is-inside" x="0.000%" y="50%">2.00 s</text>' in html
    assert re.search(r'<text class="tick" x="100.000%" y="50%">2.00 s<', html)
    assert re.search(r'<text class="tick" x="50.000%" y="50%">1.00 s<', html)
    # Rows are indented by depth through classes.
    assert re.search(r'class="row kind-task depth-0"', html)
    assert re.search(r'class="row leaf kind-function depth-1"', html)
    assert "style=" not in html  # the Content Security Policy allows no inline style


def test_a_span_still_open_is_drawn_striped_to_the_end(client: Client, olga: Any) -> None:
    trace = make_trace()
    root = make_span(trace, "task", "task", start=0, end=2)
    running = make_span(trace, "function", "tool", parent=root, start=1.0)
    running.ended_at = None
    Span.objects.bulk_create([root, running])

    html = trace_page(client, trace.trace_id)
    assert (
        '<g class="bar kind-function is-open" aria-hidden="true"><rect x="50.000%" '
        'width="50.000%" height="100%" rx="3"/>'
    ) in html
    assert html.count('fill="url(#bar-open)"/>') == 1  # the closed task has no stripes
    assert '<pattern id="bar-open"' in html


def test_the_span_panel_shows_errors_guardrails_and_escapes_everything(
    client: Client, olga: Any
) -> None:
    trace = make_trace()
    guardrail = make_span(
        trace,
        "guardrail",
        "no_secrets",
        span_data={"type": "guardrail", "name": "no_secrets", "triggered": True},
    )
    failed = make_span(
        trace,
        "function",
        f"send_{XSS}",
        span_data={"type": "function", "name": "send", "input": "{}", "output": None},
        error={"message": f"Error running tool {XSS}", "data": {"error": "boom"}},
    )
    Span.objects.bulk_create([guardrail, failed])

    page = trace_page(client, trace.trace_id)
    assert XSS not in page and "send_&lt;script&gt;" in page
    assert page.count('<span class="flag flag-error">tripped</span>') == 1
    assert page.count('<span class="flag flag-error">error</span>') == 1
    assert '<span class="error-text">1 error</span>' in page

    panel = text(
        client.get(reverse("trace_span", args=[trace.trace_id, guardrail.span_id]), **HTMX)
    )
    assert '<dd class="tone-bad">yes, it tripped</dd>' in panel
    panel = text(client.get(reverse("trace_span", args=[trace.trace_id, failed.span_id]), **HTMX))
    assert '<div class="span-error" role="alert">' in panel
    assert XSS not in panel and "Error running tool &lt;script&gt;alert(1)&lt;/script&gt;" in panel


def test_a_span_link_without_htmx_opens_the_trace_page_with_the_span(
    client: Client, olga: Any
) -> None:
    trace = make_trace()
    root = make_span(trace, "task", "task")
    tool = make_span(trace, "function", "lookup_order", parent=root)
    Span.objects.bulk_create([root, tool])
    url = reverse("trace_span", args=[trace.trace_id, tool.span_id])

    fragment = text(client.get(url, **HTMX))
    page = text(client.get(url))

    assert fragment.startswith(f'<div class="span-detail" data-span-id="{tool.span_id}">')
    assert "<html" not in fragment
    assert "<html" in page and f'data-span-id="{tool.span_id}"' in page
    assert "row leaf kind-function is-selected" in page
    # A link in the tree loads the panel with htmx, its href is the same page without it.
    tree = trace_page(client, trace.trace_id)
    assert f'href="{url}" hx-get="{url}"' in tree
    assert 'hx-target="#span-panel"' in tree
    # After a reload from htmx's history, the whole page.
    restored = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert "<html" in text(restored)


def test_other_runs_of_the_conversation_are_linked(client: Client, olga: Any) -> None:
    first = make_trace(group_id="conv_shared")
    second = make_trace(group_id="conv_shared", status=TraceStatus.ERROR)
    alone = make_trace(group_id="conv_alone")

    html = trace_page(client, first.trace_id)
    others = html[html.index("Other runs of this conversation") :]
    assert f'href="/traces/{second.trace_id}/"' in others
    assert f'href="/traces/{first.trace_id}/"' not in others
    assert 'href="/traces/?conversation=conv_shared"' in others
    assert "only run so far" in trace_page(client, alone.trace_id)


def test_the_tree_fragment_carries_the_summary_and_clears_the_live_note(
    client: Client, olga: Any
) -> None:
    trace = make_trace(status=TraceStatus.RUNNING, total_tokens=77)
    Span.objects.bulk_create(realistic_spans(trace, 5))
    html = text(client.get(reverse("trace_tree", args=[trace.trace_id])))
    assert html.startswith('<div class="waterfall" data-span-count="5">')
    assert '<header id="trace-summary" class="trace-head" hx-swap-oob="true">' in html
    assert '<span class="status status-running">Running</span>' in html
    assert '<span id="trace-live" class="live-note" role="status" hx-swap-oob="true">' in html
    page = trace_page(client, trace.trace_id)
    assert f'ws-connect="/ws/traces/{trace.trace_id}/"' in page
    assert f'hx-get="/traces/{trace.trace_id}/tree/" hx-trigger="resync from:body"' in page


def test_a_run_that_just_started_has_its_trace_page_before_any_span_is_stored(
    client: Client, olga: Any
) -> None:
    run = make_run(trace_id="trace_" + "b" * 32, status=RunStatus.RUNNING)
    html = trace_page(client, run.trace_id)
    assert "No spans stored yet. They appear here as the run goes, without a reload." in html
    assert '<span class="status status-running">Running</span>' in html
    assert f'ws-connect="/ws/traces/{run.trace_id}/"' in html
    assert f"?conversation={run.conversation.session_id}" in html
    assert client.get(reverse("trace_tree", args=[run.trace_id])).status_code == 200
    exported = json.loads(client.get(reverse("trace_export", args=[run.trace_id])).content)
    assert exported["spans"] == [] and exported["group_id"] == run.conversation.session_id
    assert not Trace.objects.exists()  # a GET writes nothing


def test_a_trace_without_spans_yet_says_so(client: Client, olga: Any) -> None:
    trace = make_trace(started_at=None, ended_at=None, status=TraceStatus.RUNNING)
    html = trace_page(client, trace.trace_id)
    assert "No spans stored yet." in html
    assert json.loads(client.get(f"/traces/{trace.trace_id}.json").content)["spans"] == []


# --- the tree, built in Python --------------------------------------------------------------


class S:
    def __init__(self, span_id: str, parent_id: str | None, at: int = 0) -> None:
        self.span_id, self.parent_id = span_id, parent_id
        self.started_at = self.ended_at = T0 + timedelta(seconds=at)
        self.span_type, self.name = "custom", span_id


def test_the_tree_is_built_in_one_pass_whatever_its_shape() -> None:
    # A chain deeper than Python's recursion limit.
    chain = [S("s0", None)] + [S(f"s{n}", f"s{n - 1}", n) for n in range(1, 5000)]
    tree = trees.build(chain)
    assert [row.depth for row in tree.rows] == list(range(5000))
    assert tree.rows[-1].closes == 4999  # every subtree ends with the deepest span
    # Indented by a class per depth, which traces.css has up to 31: deeper rows share it.
    assert [row.depth_class for row in tree.rows[30:33]] == ["depth-30", "depth-31", "depth-31"]
    assert sum(row.closes for row in tree.rows) == sum(row.has_children for row in tree.rows)

    wide = [S("root", None)] + [S(f"c{n}", "root", n) for n in range(3000)]
    started = time.perf_counter()
    tree = trees.build(wide)
    assert time.perf_counter() - started < 0.5
    assert [row.depth for row in tree.rows] == [0] + [1] * 3000
    assert tree.rows[0].children == 3000 and tree.rows[-1].closes == 1

    odd = [S("a", "a"), S("b", "c"), S("c", "b"), S("d", "gone"), S("e", "d")]
    rows = trees.build(odd).rows
    assert [(row.span.span_id, row.depth) for row in rows] == [
        ("a", 0),
        ("d", 0),
        ("e", 1),
        ("b", 0),
        ("c", 1),
    ]
    assert len(rows) == len(odd)


# --- runs of the demo agent -----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_run_with_a_tool_call_shows_its_tree_and_waterfall(
    client: Client, traces: Traces, demo: None
) -> None:
    client.force_login(make_viewer())
    run = run_demo("where is order 7")
    traces.flush()

    html = trace_page(client, run.trace_id)
    assert tree_lines(html) == [
        "task agentsite: Support desk",
        "  agent Support desk",
        "    guardrail no card numbers",
        "    turn turn 1: Support desk",
        "      generation offline-demo",
        "      function lookup_order",
        "    turn turn 2: Support desk",
        "      generation offline-demo",
    ]
    assert html.count('<details class="fold"') == 4  # task, agent and turns fold
    assert html.count('<div class="row leaf') == 4  # with the demo's input guardrail
    bars = re.findall(
        r'class="bar kind-(\w+)" aria-hidden="true"><rect x="([\d.]+)%" width="([\d.]+)%"', html
    )
    assert [kind for kind, _, _ in bars] == [
        "task",
        "agent",
        "guardrail",
        "turn",
        "generation",
        "function",
        "turn",
        "generation",
    ]
    assert bars[0][1:] == ("0.000", "100.000")
    for _, left, width in bars:
        assert float(left) >= 0 and float(left) + float(width) <= 100.001
    starts = [float(left) for _, left, _ in bars]
    assert starts[3] < starts[4] < starts[5] < starts[6]  # generation, tool, then turn 2
    assert '<span class="status status-ok">OK</span>' in html
    assert f"<code>{run.trace_id}</code>" in html
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert f"<dd>{trace.total_tokens:,}</dd>" in html and trace.total_tokens > 0


@pytest.mark.django_db(transaction=True)
def test_the_span_panel_shows_what_each_type_of_span_carries(
    client: Client, traces: Traces, demo: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.force_login(make_viewer())
    script_demo_model(monkeypatch, HANDOFF_AND_TOOLS)
    run = run_demo("I was charged for order 7 but want part of it back")
    traces.flush()
    spans: dict[tuple[str, str], Span] = {}
    for span in Span.objects.filter(trace_id=run.trace_id).order_by("started_at"):
        spans.setdefault((span.span_type, span.name), span)  # the first of each

    def panel(span_type: str, name: str) -> str:
        span = spans[(span_type, name)]
        response = client.get(reverse("trace_span", args=[run.trace_id, span.span_id]), **HTMX)
        assert response.status_code == 200
        return text(response)

    generation = panel("generation", "offline-demo")
    assert '<dt>Model</dt><dd class="tone-mono">offline-demo</dd>' in generation
    assert "<dt>Input tokens</dt>" in generation and "<dt>Total tokens</dt>" in generation
    assert "<summary>Output</summary>" in generation and "lookup_order" in generation
    assert "<summary>Input</summary>" in generation

    tool = panel("function", "lookup_order")
    assert '<dt>Tool</dt><dd class="tone-mono">lookup_order</dd>' in tool
    assert re.search(
        r"<summary>Input</summary><pre class=\"code\">\{\n  &quot;order_id&quot;: 7", tool
    )
    assert "Order 7 for Chen Wei" in tool

    handoff = panel("handoff", "Support desk → Billing")
    assert '<p class="headline">Support desk → Billing</p>' in handoff
    assert '<dt>From</dt><dd class="tone-plain">Support desk</dd>' in handoff
    assert '<dt>To</dt><dd class="tone-plain">Billing</dd>' in handoff

    agent = panel("agent", "Billing")
    assert "lookup_order, issue_refund" in agent

    turn = panel("turn", "turn 3: Billing")
    assert "<dt>Turn</dt>" in turn and '<dt>Agent</dt><dd class="tone-plain">Billing</dd>' in turn

    for html in (generation, tool, handoff, agent, turn):
        assert "<summary>span_data · JSON</summary>" in html
        assert "<dt>Duration</dt>" in html and "<dt>Span id</dt>" in html


@pytest.mark.django_db(transaction=True)
def test_model_and_user_text_in_spans_is_escaped(
    client: Client, traces: Traces, demo: None, settings: Any
) -> None:
    @function_tool
    def read_note(note_id: int) -> str:
        """Read a customer's note."""
        return f"Note {note_id}: {XSS}"

    agent = Agent(
        name="Notes",
        tools=[read_note],
        model=ScriptedModel(
            [
                ModelStep(output=[function_call("read_note", {"note_id": 3}, call_id="c1")]),
                ModelStep(output=[assistant_message(f"It says {XSS}")]),
            ],
            emit_traces=True,
        ),
    )
    name = scripted.install(settings, agent)
    run = run_demo(f"read note 3 {XSS}", agent_name=name)
    assert run.status == RunStatus.COMPLETED, run.error
    traces.flush()
    client.force_login(make_viewer())
    tool = Span.objects.get(trace_id=run.trace_id, span_type="function")
    assert tool.span_data["output"] == f"Note 3: {XSS}"

    page = trace_page(client, run.trace_id)
    panel = text(client.get(reverse("trace_span", args=[run.trace_id, tool.span_id]), **HTMX))
    full = text(client.get(reverse("trace_span", args=[run.trace_id, tool.span_id])))
    for html in (page, panel, full):
        assert XSS not in html
    assert "Note 3: &lt;script&gt;alert(1)&lt;/script&gt;" in panel
    # The page's own scripts only: htmx, its ws extension, live.js, errors.js, flash.js and
    # traces.js.
    assert page.count("<script") == full.count("<script") == 6


@pytest.mark.django_db(transaction=True)
def test_an_approved_run_is_one_trace_with_both_halves_and_the_decision(
    client: Client, traces: Traces, demo: None
) -> None:
    client.force_login(make_viewer())
    run = run_demo("cancel order 42")
    traces.flush()
    waiting = trace_page(client, run.trace_id)
    assert '<span class="status status-waiting">Waiting</span>' in waiting

    runs.decide(run.approval_requests.get(), make_reviewer("rita"), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    traces.flush()

    html = trace_page(client, run.trace_id)
    # Both halves, each under a task span of its own; the decision between them, under the
    # agent that asked; the approved call runs first thing in the second half.
    assert tree_lines(html) == [
        "task agentsite: Support desk",
        "  agent Support desk",
        "    guardrail no card numbers",
        "    turn turn 1: Support desk",
        "      generation offline-demo",
        "      function cancel_order",
        "    decision approval decision",
        "task agentsite: Support desk",
        "  agent Support desk",
        "    function cancel_order",
        "    turn turn 2: Support desk",
        "      generation offline-demo",
    ]
    assert '<span class="flag verdict-approve">approve · rita</span>' in html
    assert '<span class="flag flag-quiet">resumed</span>' in html
    assert "paused · resumed" in html
    assert '<span class="status status-ok">OK</span>' in html

    decision = Span.objects.get(trace_id=run.trace_id, name=DECISION_SPAN_NAME)
    panel = text(client.get(reverse("trace_span", args=[run.trace_id, decision.span_id]), **HTMX))
    assert '<span class="type type-decision">decision</span>' in panel
    assert '<p class="headline">Approval decision</p>' in panel
    assert '<dt>Reviewer</dt><dd class="tone-plain">rita</dd>' in panel
    assert '<dt>Decision</dt><dd class="tone-ok">approve</dd>' in panel
    assert '<dt>Tool</dt><dd class="tone-mono">cancel_order</dd>' in panel
    # An approval says nothing to the agent: no message (its note stays with reviewers).
    assert '<summary>Message</summary><pre class="code">(empty)</pre>' in panel


# --- the export -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_json_export_is_the_trace_as_the_sdk_exported_it(
    client: Client, traces: Traces, demo: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.force_login(make_viewer())
    script_demo_model(monkeypatch, HANDOFF_AND_TOOLS)
    run = run_demo("I was charged for order 7 but want part of it back")
    traces.flush()

    response = client.get(reverse("trace_export", args=[run.trace_id]))
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == f'inline; filename="{run.trace_id}.json"'
    exported = json.loads(response.content)

    [sdk_trace] = [t for t in traces.sdk.traces if t["id"] == run.trace_id]
    sdk_spans = [s for s in traces.sdk.spans if s["trace_id"] == run.trace_id]
    assert set(exported) == SDK_TRACE_KEYS | {"spans"}
    assert {key: exported[key] for key in SDK_TRACE_KEYS} == sdk_trace
    assert all(set(span) == SDK_SPAN_KEYS for span in exported["spans"])
    # Span for span, what the SDK emitted: ids, parents, ISO times, data, errors.
    assert sorted(exported["spans"], key=lambda s: s["id"]) == sorted(
        sdk_spans, key=lambda s: s["id"]
    )
    kinds = {span["span_data"]["type"] for span in exported["spans"]}
    assert kinds == {"custom", "agent", "guardrail", "generation", "function", "handoff"}


@pytest.mark.django_db(transaction=True)
def test_the_json_export_is_masked_like_the_store(
    client: Client, traces: Traces, demo: None
) -> None:
    client.force_login(make_viewer())
    run = run_demo("where is order 7? I am jane.doe@example.com, +44 20 7946 0958")
    traces.flush()
    emitted = json.dumps([s for s in traces.sdk.spans if s["trace_id"] == run.trace_id])
    assert "jane.doe@example.com" in emitted  # the SDK had it

    exported = text(client.get(reverse("trace_export", args=[run.trace_id])))
    page = trace_page(client, run.trace_id)
    generation = Span.objects.filter(trace_id=run.trace_id, span_type="generation").first()
    assert generation is not None
    panel = text(client.get(reverse("trace_span", args=[run.trace_id, generation.span_id]), **HTMX))
    for html in (exported, page, panel):
        assert "jane.doe" not in html and "7946 0958" not in html
    assert "[email]" in exported and "[phone]" in exported and "[email]" in panel


# --- one click away -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_admin_and_the_inbox_link_to_the_trace(traces: Traces, demo: None) -> None:
    run = run_demo("cancel order 42")
    traces.flush()
    trace = Trace.objects.get(trace_id=run.trace_id)
    request = run.approval_requests.get()
    link = f'href="/traces/{run.trace_id}/"'

    admin = Client()
    admin.force_login(make_user(username="root", is_staff=True, is_superuser=True))
    assert link in text(admin.get(f"/admin/engine/agentrun/{run.pk}/change/"))
    assert link in text(admin.get("/admin/engine/agentrun/"))
    assert link in text(admin.get(f"/admin/tracing/trace/{trace.pk}/change/"))
    assert link in text(admin.get("/admin/tracing/trace/"))

    rita = Client()
    rita.force_login(make_reviewer("rita"))
    assert link not in text(rita.get(f"/inbox/{request.pk}/"))  # a reviewer, not an operator
    both = grant(make_viewer("vic"), REVIEWER)
    vic = Client()
    vic.force_login(both)
    assert link in text(vic.get(f"/inbox/{request.pk}/"))


@pytest.mark.django_db
def test_a_conversation_links_to_its_traces_for_operators(client: Any, admin_client: Any) -> None:
    from tests.factories import make_conversation, make_user

    alice = make_user(username="alice_links")
    conversation = make_conversation(owner=alice)
    traces_url = f"/traces/?conversation={conversation.session_id}"

    client.force_login(alice)
    assert traces_url not in client.get(f"/chats/{conversation.session_id}/").content.decode()
    alice.is_staff = True
    alice.save()
    assert traces_url in client.get(f"/chats/{conversation.session_id}/").content.decode()
    listing = admin_client.get("/admin/conversations/conversation/").content.decode()
    assert traces_url in listing.replace("&amp;", "&")
