"""One trace's page for operators: a big trace opens with its top levels and loads the rest on
demand, a live refresh keeps what the reader loaded, the generation panel reads as a
conversation, and the summary says how the run went (outcome, time, cost, feedback)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.factories import make_span, make_trace, make_user, make_viewer
from tests.test_trace_views import realistic_spans
from tracing import tree as trees
from tracing.models import Span, Trace

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
XSS = "<script>alert(1)</script>"


@pytest.fixture
def olga(client: Client) -> Any:
    user = make_viewer()
    client.force_login(user)
    return user


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
    assert html.count("<details") == html.count("</details>")
    assert "10000" in html or "10,000" in html  # the summary counts every span
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
    assert html.count("<details") == html.count("</details>")

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
    assert html.count("<details") == html.count("</details>")


def test_the_path_to_an_error_deep_in_a_big_trace_is_shown(client: Client, olga: Any) -> None:
    trace, spans = big_trace()
    failed = [span for span in spans if span.span_type == "function"][2000]
    Span.objects.filter(pk=failed.pk).update(error={"message": "Order service timed out"})
    html = text(client.get(reverse("trace_detail", args=[trace.trace_id])))
    ids = shown(html)
    turn = next(span for span in spans if span.span_id == failed.parent_id)
    assert ids.index(turn.span_id) < ids.index(failed.span_id)
    assert html.count("<details") == html.count("</details>")


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
