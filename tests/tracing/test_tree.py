"""One trace's page for operators (`tracing/tree.py`, `tracing/trace_views.py`): a big trace
opens with its top levels and loads the rest on demand, a live refresh keeps what the reader
loaded, the generation panel reads as a conversation, and the summary says how the run went
(outcome, time, cost, feedback)."""

from __future__ import annotations

import re
import time
from datetime import date, timedelta
from decimal import Decimal
from html import escape
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import NoReverseMatch, reverse

from engine.models import AgentRun, RunStatus
from tests.factories import (
    grant,
    make_run,
    make_span,
    make_staff,
    make_trace,
    make_user,
    make_viewer,
)
from tests.tracing.test_trace_views import realistic_spans
from tracing import pricing
from tracing import tree as trees
from tracing.models import (
    Feedback,
    FeedbackScore,
    ModelPrice,
    Span,
    Trace,
    TraceOutcome,
    TraceStatus,
)

pytestmark = [
    pytest.mark.django_db,
    # The 10,000 spans of a test here would push every later test's traces weeks back.
    pytest.mark.usefixtures("own_numbers"),
]

HTMX = {"HTTP_HX_REQUEST": "true"}
XSS = "<script>alert(1)</script>"


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def shown(html: str) -> list[str]:
    """The span ids of the rows in `html`, in order."""
    return re.findall(r'class="span-link" href="[^"]*" hx-get="[^"]*" data-span="([^"]+)"', html)


def big_trace(count: int = 10_000) -> tuple[Trace, list[Span]]:
    """A run of `count` spans: a task, an agent, then turns of a model call and a tool call."""
    trace = make_trace(workflow_name="agentsite: Support desk")
    spans = realistic_spans(trace, count)
    Span.objects.bulk_create(spans, batch_size=1000)
    Trace.objects.filter(pk=trace.pk).update(
        started_at=spans[0].started_at, ended_at=spans[0].ended_at
    )
    trace.refresh_from_db()
    return trace, spans


def subtree(trace: Trace, span: Span | str, **query: int) -> str:
    span_id = span if isinstance(span, str) else span.span_id
    url = reverse("trace_subtree", args=[trace.trace_id, span_id])
    if query:
        url += "?" + "&".join(f"{key}={value}" for key, value in query.items())
    return url


# --- a big trace ----------------------------------------------------------------------------


def test_a_10000_span_trace_opens_with_its_top_levels_only(client: Client, olga: Any) -> None:
    trace, spans = big_trace()
    task, agent = spans[0], spans[1]
    turns = [span for span in spans if span.span_type == "turn"]
    deep = [span for span in spans if span.span_type in ("generation", "function")]
    url = reverse("trace_detail", args=[trace.trace_id])
    client.get(url)  # templates compiled, permissions looked up once

    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        html = text(client.get(url))
        elapsed = time.perf_counter() - started
    print(f"\n10,000 spans, first view: {len(queries)} queries, {elapsed * 1000:.0f} ms")

    ids = shown(html)
    # The task, its agent, and the agent's first page of turns, each turn folded.
    assert ids == [task.span_id, agent.span_id] + [t.span_id for t in turns[: trees.CHILD_PAGE]]
    assert not {span.span_id for span in deep} & set(ids)
    assert html.count('class="node is-lazy"') == trees.CHILD_PAGE
    assert "2 spans</span>" in html  # a folded turn says what it holds
    rest = len(turns) - trees.CHILD_PAGE
    assert f"Show 100 more of {rest:,}" in html
    assert html.count("<div") == html.count("</div>")  # every subtree closed, once
    assert "<dt>Spans</dt><dd>10,000</dd>" in html  # the summary counts every span
    # As many queries as a small trace's page: one light one reads the spans not shown.
    small = make_trace()
    Span.objects.bulk_create(realistic_spans(small, 10))
    with CaptureQueriesContext(connection) as few:
        text(client.get(reverse("trace_detail", args=[small.trace_id])))
    assert len(queries) == len(few)
    # The rows' query asks for the shown spans only, by id.
    rows_query = next(q["sql"] for q in queries.captured_queries if '"span_data"' in q["sql"])
    assert rows_query.count("%s") + rows_query.count("'span_") <= len(ids) + 10


def test_a_folded_subtree_loads_its_children_on_demand(client: Client, olga: Any) -> None:
    trace, spans = big_trace()
    turn = next(span for span in spans if span.span_type == "turn")
    generation, function = (span for span in spans if span.parent_id == turn.span_id)
    html = text(client.get(subtree(trace, turn), **HTMX))
    assert shown(html) == [generation.span_id, function.span_id]
    assert 'data-depth="3"' in html and "<html" not in html
    assert html.count("<div") == html.count("</div>")  # every subtree closed, once

    # The agent's turns, a page at a time, each page ending with a control for the next.
    agent = spans[1]
    turns = [span.span_id for span in spans if span.parent_id == agent.span_id]
    page = text(client.get(subtree(trace, agent, start=100, stop=len(turns)), **HTMX))
    assert shown(page) == turns[100:200]
    assert f"start=200&amp;stop={len(turns)}" in page
    last = text(client.get(subtree(trace, agent, start=3300, stop=len(turns)), **HTMX))
    assert shown(last) == turns[3300:]
    assert 'class="row gap' not in last


def test_without_htmx_the_subtree_url_is_the_page_with_that_span_open(
    client: Client, olga: Any
) -> None:
    trace, spans = big_trace()
    turn = [span for span in spans if span.span_type == "turn"][500]  # beyond the first page
    html = text(client.get(subtree(trace, turn)))
    ids = shown(html)
    assert turn.span_id in ids
    kids = [span.span_id for span in spans if span.parent_id == turn.span_id]
    assert ids[ids.index(turn.span_id) + 1 : ids.index(turn.span_id) + 3] == kids
    assert "Show 100 more of 400" in html  # the turns before it, then after it
    assert html.count("<div") == html.count("</div>")  # every subtree closed, once


def test_the_path_to_an_error_deep_in_a_big_trace_is_shown(client: Client, olga: Any) -> None:
    trace, spans = big_trace()
    failed = [span for span in spans if span.span_type == "function"][2000]
    Span.objects.filter(pk=failed.pk).update(error={"message": "Order service timed out"})
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    ids = shown(html)
    turn = next(span for span in spans if span.span_id == failed.parent_id)
    assert ids.index(turn.span_id) < ids.index(failed.span_id)
    assert html.count("<div") == html.count("</div>")  # every subtree closed, once


def test_a_refresh_keeps_the_subtrees_and_pages_the_reader_loaded(
    client: Client, olga: Any
) -> None:
    trace, spans = big_trace()
    agent = spans[1]
    turns = [span for span in spans if span.span_type == "turn"]
    opened = turns[150]
    kids = [span.span_id for span in spans if span.parent_id == opened.span_id]
    url = reverse("trace_tree", args=[trace.trace_id])
    html = text(client.get(url, {"open": [opened.span_id], "more": [f"{agent.span_id}:200"]}))
    ids = shown(html)
    assert [t.span_id for t in turns[:200]] == [i for i in ids if i in {t.span_id for t in turns}]
    assert ids[ids.index(opened.span_id) + 1 : ids.index(opened.span_id) + 3] == kids
    # Nonsense in the state is ignored, not a 500.
    odd = {"open": ["x" * 500, "span_nope"], "more": ["nope", f"{agent.span_id}:lots", ":3"]}
    ids = shown(text(client.get(url, odd)))
    assert ids[:3] == [spans[0].span_id, agent.span_id, turns[0].span_id]
    assert len(ids) == 2 + trees.CHILD_PAGE


def test_a_small_trace_is_shown_whole() -> None:
    shape = trees.Skeleton.of((f"s{n}", f"s{n - 1}" if n else None, False) for n in range(50))
    view = trees.View.first(shape)
    assert view.whole
    items = view.items(view.visible(None))
    assert [item for item in items if isinstance(item, tuple)] == [
        ("open", f"s{n}") for n in range(49)
    ] + [("leaf", "s49")]


# --- access ---------------------------------------------------------------------------------


def test_the_subtree_url_is_for_operators_and_this_traces_spans_only(client: Client) -> None:
    trace = make_trace()
    root = make_span(trace, "task", "root")
    child = make_span(trace, "agent", "desk", parent=root)
    other = make_trace()
    stranger = make_span(other, "task", "elsewhere")
    Span.objects.bulk_create([root, child, stranger])
    url = subtree(trace, root)

    response = client.get(url)
    assert response.status_code == 302 and "/login" in response["Location"]
    assert "/login" in client.get(url, **HTMX)["HX-Redirect"]
    client.force_login(make_user(username="alice"))
    assert client.get(url, **HTMX).status_code == 403
    client.force_login(make_viewer("olga"))
    assert shown(text(client.get(url, **HTMX))) == [child.span_id]
    assert client.get(subtree(trace, stranger), **HTMX).status_code == 404
    assert client.get(subtree(trace, "span_never"), **HTMX).status_code == 404
    assert client.get(url + "?start=-1", **HTMX).status_code == 400


# --- the summary ----------------------------------------------------------------------------


def summarised_trace(**trace_fields: Any) -> tuple[Trace, Any]:
    """A run that asked for a refund, answered and was rated down; its trace an hour long,
    two seconds of it working, with a priced and an unpriced model call."""
    chen = make_user(username="chen")
    run = make_run(
        owner=chen,
        status=RunStatus.COMPLETED,
        input="Refund order 7 please, mail me at chen@example.com " + XSS,
        final_output="I refunded $20.00 on order 7.",
    )
    trace_fields.setdefault("outcome", TraceOutcome.REJECTED)
    trace_fields.setdefault("outcome_reason", "refund_order rejected by rita: over the limit")
    trace = make_trace(run=run, active_seconds=2.0, total_tokens=1_600, **trace_fields)
    assert trace.started_at is not None
    Trace.objects.filter(pk=trace.pk).update(ended_at=trace.started_at + timedelta(hours=1))
    trace.refresh_from_db()
    task = make_span(trace, "task", "agentsite: Support desk", end=3600)
    priced = make_span(
        trace,
        "generation",
        "acme-mini",
        parent=task,
        start=0.1,
        end=1,
        model="acme-mini",
        input_tokens=1_000,
        cached_tokens=200,
        output_tokens=100,
        total_tokens=1_100,
    )
    unpriced = make_span(
        trace,
        "generation",
        "house-model",
        parent=task,
        start=1,
        end=2,
        model="house-model",
        input_tokens=400,
        output_tokens=100,
        total_tokens=500,
    )
    Span.objects.bulk_create([task, priced, unpriced])
    ModelPrice.objects.create(
        model="acme-mini",
        input_per_million=Decimal("0.40"),
        cached_input_per_million=Decimal("0.10"),
        output_per_million=Decimal("1.60"),
        valid_from=date(2020, 1, 1),
    )
    Feedback.objects.create(
        run=run,
        user=chen,
        score=FeedbackScore.DOWN,
        comment=f"Wrong amount! {XSS} chen@example.com",
    )
    return trace, run


def test_the_summary_says_how_the_run_went(client: Client, olga: Any) -> None:
    trace, run = summarised_trace()
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    start = html.index('id="trace-summary"')
    summary = html[start : html.index("</header>", start)]
    assert '<span class="outcome outcome-rejected">Completed, a call rejected</span>' in summary
    assert "refund_order rejected by rita: over the limit" in summary
    assert "<dt>Active</dt><dd" in summary and ">2.00 s</dd>" in summary
    assert ">59 min 58 s</dd>" in summary  # an hour, less its two seconds of work
    assert "1,400 (200 cached) · 200" in summary  # tokens in (cached) · out
    # 800 × 0.40 + 200 × 0.10 + 100 × 1.60 per million: $0.000500; the other model unpriced.
    assert '<span class="money">$0.000500</span>' in summary
    assert "no price for house-model" in summary
    assert "Add a price for" not in summary  # an operator who may not add prices
    assert "<dd>chen</dd>" in summary
    # Her input and her comment are masked and escaped; the thumbs down is there.
    assert "[email]" in summary and "chen@example.com" not in html
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in summary
    assert (
        '<svg class="thumb"' in summary and "Thumbs down" in summary and "Wrong amount!" in summary
    )
    assert "I refunded $20.00 on order 7." in summary


def test_the_summary_links_the_conversation_and_the_price_form_once_they_exist(
    client: Client, olga: Any
) -> None:
    trace, _ = summarised_trace()
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    try:
        conversation = reverse("trace_conversation", args=[trace.group_id])
    except NoReverseMatch:  # helper "sessions" builds it
        assert f"?conversation={trace.group_id}" in html
    else:
        assert f'href="{conversation}"' in html
    keeper = grant(make_staff("pia"), "tracing.view_trace", "tracing.add_modelprice")
    client.force_login(keeper)
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    try:
        add = pricing.add_price_url("house-model")
    except NoReverseMatch:  # helper "list" adds the price admin
        assert "Add a price for" not in html
    else:
        assert (
            f'href="{escape(add)}" title="Add a price for house-model">no price for house-model</a>'
            in html
        )


# --- the live status ------------------------------------------------------------------------


def test_a_finished_trace_is_not_live_and_a_waiting_one_says_waiting(
    client: Client, olga: Any
) -> None:
    trace, run = summarised_trace(status=TraceStatus.OK, outcome=TraceOutcome.COMPLETED)
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    assert "ws-connect" not in html and 'data-trace-state="done"' in html
    assert '<span id="trace-live-state" class="live-status" data-state="done"' in html
    assert ">Finished</span>" in html and "data-live-status" not in html

    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.WAITING)
    Trace.objects.filter(pk=trace.pk).update(status=TraceStatus.WAITING)
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    assert f'ws-connect="/ws/traces/{trace.trace_id}/"' in html
    assert 'data-live-label="Waiting for approval"' in html

    # A run still working: its trace is live, even if a tool's span failed meanwhile.
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    Trace.objects.filter(pk=trace.pk).update(status=TraceStatus.ERROR)
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    assert 'data-live-label="Live"' in html and 'data-trace-state="running"' in html
    # Its run finished, but the exporter has not stored the root span yet: still live.
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
    Trace.objects.filter(pk=trace.pk).update(status=TraceStatus.OK)
    Span.objects.filter(trace=trace, parent_id__isnull=True).update(ended_at=None)
    html = text(client.get(reverse("trace_tree", args=[trace.trace_id])))
    assert 'data-trace-state="running"' in html


# --- the generation panel -------------------------------------------------------------------


RESPONSES_INPUT = [
    {"role": "system", "content": "You are the support desk."},
    {"content": f"Where is order 7? {XSS}", "role": "user"},
    {
        "type": "function_call",
        "name": "lookup_order",
        "arguments": '{"order_id": 7}',
        "call_id": "call_1",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "Order 7 shipped."},
]
RESPONSES_OUTPUT = [
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "It shipped yesterday.", "annotations": []}],
    }
]
CHAT_INPUT = [
    {"role": "system", "content": "You are the support desk."},
    {"role": "user", "content": [{"type": "text", "text": "Refund order 7"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "issue_refund", "arguments": '{"amount": 20}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_9", "content": "Refunded $20."},
]
CHAT_OUTPUT = [{"role": "assistant", "content": f"Done: $20 back. {XSS}"}]


def generation_panel(client: Client, data: dict[str, Any], **fields: Any) -> str:
    trace = make_trace()
    span = make_span(
        trace, "generation", "acme-mini", span_data={"type": "generation", **data}, **fields
    )
    span.save()
    url = reverse("trace_span", args=[trace.trace_id, span.span_id])
    return text(client.get(url, **HTMX))


def messages(html: str) -> list[tuple[str, str]]:
    """(role, what) of each message shown, in order."""
    found = re.findall(
        r'<div class="msg msg-\w+ msg-kind-(\w+)">\s*<p class="msg-head"><span class="msg-role">'
        r"([^<]+)</span>",
        html,
    )
    return [(role, kind) for kind, role in found]


def test_the_generation_panel_reads_responses_items_as_a_conversation(
    client: Client, olga: Any
) -> None:
    html = generation_panel(
        client,
        {"model": "acme-mini", "input": RESPONSES_INPUT, "output": RESPONSES_OUTPUT},
        model="acme-mini",
        input_tokens=300,
        output_tokens=20,
    )
    assert messages(html) == [
        ("system", "text"),
        ("user", "text"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]
    assert '<code class="msg-fn">lookup_order</code>' in html
    assert "&quot;order_id&quot;: 7" in html and "Order 7 shipped." in html
    assert "It shipped yesterday." in html
    assert XSS not in html and "&lt;script&gt;" in html
    # The raw JSON is one click away, folded; the model's cost (unpriced here) is named.
    assert '<details class="block"><summary>Output</summary>' in html
    assert "no price for acme-mini" in html


def test_the_generation_panel_reads_chat_completions_messages_too(
    client: Client, olga: Any
) -> None:
    ModelPrice.objects.create(
        model="acme-*",
        input_per_million=Decimal("1"),
        output_per_million=Decimal("2"),
        valid_from=date(2020, 1, 1),
    )
    html = generation_panel(
        client,
        {"model": "acme-mini", "input": CHAT_INPUT, "output": CHAT_OUTPUT},
        model="acme-mini",
        input_tokens=1_000_000,
        cached_tokens=0,
        output_tokens=500_000,
    )
    assert messages(html) == [
        ("system", "text"),
        ("user", "text"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]
    assert "Refund order 7" in html and '<code class="msg-fn">issue_refund</code>' in html
    assert "&quot;amount&quot;: 20" in html and "call_9" in html and "Refunded $20." in html
    assert XSS not in html
    assert '<span class="money">$2.00</span>' in html  # 1M in × $1 + 0.5M out × $2


def test_a_generation_without_stored_messages_says_so(client: Client, olga: Any) -> None:
    html = generation_panel(client, {"model": "m", "input": None, "output": None})
    assert "Not stored (the trace leaves model inputs out)." in html
    assert messages(html) == []


def test_a_running_traces_many_spans_waiting_at_the_root_come_a_page_at_a_time(
    client: Client,
) -> None:
    """While a run works, its spans arrive before their parents (a span is exported when it
    ends): a big running trace can hold thousands of them at the root level."""
    trace = make_trace(status=TraceStatus.RUNNING)
    waiting = [
        make_span(trace, "function", f"tool {n}", parent="span_not_yet", start=n / 100)
        for n in range(2_500)
    ]
    Span.objects.bulk_create(waiting, batch_size=1000)
    ids = [span.span_id for span in waiting]
    url = reverse("trace_roots", args=[trace.trace_id])
    assert "/login" in client.get(url, **HTMX)["HX-Redirect"]
    assert client.get(url).status_code == 302
    client.force_login(make_user(username="alice"))
    assert client.get(url, **HTMX).status_code == 403
    client.force_login(make_viewer("olga"))

    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    assert shown(html) == ids[: trees.CHILD_PAGE]
    assert f'{url}?start=100&amp;stop=2500"' in html
    page = text(client.get(url, {"start": 100, "stop": 2500}, **HTMX))
    assert shown(page) == ids[100:200] and "start=200&amp;stop=2500" in page
    # A refresh keeps the pages of roots the reader loaded.
    refresh = reverse("trace_tree", args=[trace.trace_id])
    assert shown(text(client.get(refresh, {"more": [f"{trees.ROOTS}:300"]}))) == ids[:300]


def test_a_span_gone_between_the_two_queries_leaves_the_tree_well_formed() -> None:
    shape = trees.Skeleton.of([("a", None, 0), ("b", "a", 0), ("c", "b", 0)])
    view = trees.View(shape, whole=True)
    items = view.items(view.visible(None))
    assert items.count(trees.CLOSE) == 2
    made = make_trace()
    a, c = make_span(made, "task", "a", span_id="a"), make_span(made, "custom", "c", span_id="c")
    tree = trees.arrange(shape, items, {"a": a, "c": c})  # "b" was pruned meanwhile
    assert [row.span.span_id for row in tree.rows] == ["a", "c"]
    assert tree.items.count(trees.CLOSE) == 1  # only a's subtree is closed
