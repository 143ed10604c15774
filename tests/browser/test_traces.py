"""The trace viewer in a real Chromium against a real daphne server.

A run that grows an open trace page must execute inside that server, so that its exporter
announces each batch on the server's own channel layer: it is started the way a person
starts one, by an end user's chat message POSTed to the server (`chat_send`), and its second
half by a reviewer's approval POSTed to the server. Traces only looked at are made here: in
the database, or by a demo run in this process whose spans are flushed before the page opens.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from demo.seed import seed_orders
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.browser import in_thread, log_in
from tests.conftest import Traces
from tests.factories import (
    make_conversation,
    make_reviewer,
    make_span,
    make_trace,
    make_user,
    make_viewer,
)
from tests.tracing.test_trace_views import HANDOFF_AND_TOOLS, script_demo_model
from tracing.models import Span, Trace

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # The 10,000 spans of a test here would push every later test's traces weeks back.
    pytest.mark.usefixtures("own_numbers"),
]

PASSWORD = "pass-for-tests"


def operator(username: str = "olga") -> Any:
    user = make_viewer(username)
    user.set_password(PASSWORD)
    user.save()
    return user


def open_trace(
    page: Any,
    live_site: Any,
    trace_id: str,
    username: str = "olga",
    state: str | re.Pattern[str] = "Finished",
) -> None:
    """Open a trace's page: a finished trace's says so (no socket), a live one's once its
    socket is open and the first re-sync is done."""
    log_in(page, live_site, username, PASSWORD, then=f"/traces/{trace_id}/")
    expect(page.locator("#trace-live-state")).to_have_text(state)
    expect(page.locator("#trace-tree.htmx-request")).to_have_count(0)  # the first re-sync


# Where each bar of the waterfall is drawn, against where its markup says (percent of the bar
# cell), and each row's indent (rem from the row's edge to its caret) against its depth.
WATERFALL = """() => [...document.querySelectorAll("#trace-tree .row")].map((row) => {
  const bar = row.querySelector(".bar"), span = bar.querySelector("rect");
  const cell = row.querySelector(".bar-cell").getBoundingClientRect();
  const box = bar.getBoundingClientRect();
  const rem = parseFloat(getComputedStyle(document.documentElement).fontSize);
  return {
    left: parseFloat(span.getAttribute("x")), width: parseFloat(span.getAttribute("width")),
    drawnLeft: (box.left - cell.left) / cell.width * 100,
    drawnWidth: box.width / cell.width * 100,
    depth: parseInt(row.dataset.depth, 10),
    indent: (row.querySelector(".caret").getBoundingClientRect().left -
      row.getBoundingClientRect().left) / rem,
  };
})"""


def assert_placed(rows: list[dict[str, Any]]) -> None:
    assert rows and any(r["left"] > 0 for r in rows) and any(r["depth"] > 0 for r in rows)
    for r in rows:
        assert abs(r["drawnLeft"] - r["left"]) < 0.5, r
        assert r["width"] < 0.5 or abs(r["drawnWidth"] - r["width"]) < 0.5, r  # 2px minimum
        assert abs(r["indent"] - (0.6 + r["depth"])) < 0.05, r  # .6rem, then 1rem a level


def assert_waterfall_placed(page: Any) -> None:
    """Every bar is drawn where its SVG attributes say and every row is indented by its
    depth (the CSP allows no inline style; nothing is placed by script)."""
    assert_placed(page.evaluate(WATERFALL))


def row(page: Any, span: Span) -> Any:
    return page.locator(f'#trace-tree .row:has(> .name-cell a[data-span="{span.span_id}"])')


def made_trace(**fields: Any) -> tuple[Trace, dict[str, Span]]:
    """A trace shaped like a demo run with a tool call and a handoff (finished, unless
    `fields` say otherwise)."""
    fields.setdefault("workflow_name", "agentsite: Support desk")
    trace = make_trace(total_tokens=612, **fields)
    task = make_span(trace, "task", "agentsite: Support desk", end=1.2)
    desk = make_span(trace, "agent", "Support desk", parent=task, start=0.01, end=0.6)
    turn = make_span(trace, "turn", "turn 1: Support desk", parent=desk, start=0.02, end=0.6)
    generation = make_span(
        trace,
        "generation",
        "offline-demo",
        parent=turn,
        start=0.03,
        end=0.4,
        span_data={
            "type": "generation",
            "model": "offline-demo",
            "usage": {"input_tokens": 201, "output_tokens": 9},
            "output": [{"type": "function_call", "name": "lookup_order"}],
        },
    )
    tool = make_span(
        trace,
        "function",
        "lookup_order",
        parent=turn,
        start=0.41,
        end=0.5,
        span_data={
            "type": "function",
            "name": "lookup_order",
            "input": '{"order_id": 7}',
            "output": "Order 7 for Chen Wei: Noise-cancelling headphones, status shipped.",
        },
    )
    handoff = make_span(
        trace,
        "handoff",
        "Support desk → Billing",
        parent=turn,
        start=0.55,
        end=0.56,
        span_data={"type": "handoff", "from_agent": "Support desk", "to_agent": "Billing"},
    )
    billing = make_span(trace, "agent", "Billing", parent=task, start=0.6, end=1.2)
    spans = {
        "task": task,
        "desk": desk,
        "turn": turn,
        "generation": generation,
        "tool": tool,
        "handoff": handoff,
        "billing": billing,
    }
    Span.objects.bulk_create(spans.values())
    return trace, spans


def test_a_subtree_folds_and_unfolds_and_a_span_opens_its_details(
    live_site: Any, page: Any
) -> None:
    operator()
    trace, spans = made_trace()

    open_trace(page, live_site, trace.trace_id)
    expect(page.locator("#trace-tree .row")).to_have_count(7)
    expect(page.get_by_role("heading", name="agentsite: Support desk")).to_be_visible()
    tool, handoff, billing = (
        row(page, spans["tool"]),
        row(page, spans["handoff"]),
        row(page, spans["billing"]),
    )
    expect(tool).to_be_visible()
    assert_waterfall_placed(page)

    # Fold the Support desk agent: its turn and the turn's spans go, Billing stays.
    row(page, spans["desk"]).locator(".caret").click()
    for hidden in ("turn", "generation", "tool", "handoff"):
        expect(row(page, spans[hidden])).to_be_hidden()
    expect(billing).to_be_visible()
    # And unfold it again.
    row(page, spans["desk"]).locator(".caret").click()
    expect(tool).to_be_visible()
    expect(handoff).to_be_visible()

    # "Collapse all" leaves the roots; "Expand all" brings everything back.
    page.get_by_role("button", name="Collapse all").click()
    expect(page.locator("#trace-tree .row:visible")).to_have_count(1)
    page.get_by_role("button", name="Expand all").click()
    expect(page.locator("#trace-tree .row:visible")).to_have_count(7)

    page.evaluate("window.notReloaded = true")
    tool.locator("a.span-link").click()
    panel = page.get_by_role("complementary", name="Span details")
    expect(panel).to_contain_text("lookup_order")
    expect(panel.locator("pre.code").first).to_contain_text('"order_id": 7')
    expect(panel).to_contain_text("Order 7 for Chen Wei")
    expect(tool).to_have_class(re.compile(r"\bis-selected\b"))
    expect(page).to_have_url(
        re.compile(rf"/traces/{trace.trace_id}/spans/{spans['tool'].span_id}/$")
    )

    handoff.locator("a.span-link").click()
    expect(panel.locator(".headline")).to_have_text("Support desk → Billing")
    expect(handoff).to_have_class(re.compile(r"\bis-selected\b"))
    expect(tool).not_to_have_class(re.compile(r"\bis-selected\b"))
    assert page.evaluate("window.notReloaded") is True

    # The span's URL is a page of its own.
    page.reload()
    expect(panel.locator(".headline")).to_have_text("Support desk → Billing")
    expect(row(page, spans["handoff"])).to_have_class(re.compile(r"\bis-selected\b"))


def test_a_refreshed_tree_is_placed_as_soon_as_it_is_swapped_in(live_site: Any, page: Any) -> None:
    """A re-read tree (on every reconnect and every stored batch) is drawn placed at once, not
    only once htmx has settled it: no frame of bars piled up at the left."""
    operator()
    trace, _ = made_trace(status="running")
    open_trace(page, live_site, trace.trace_id, state="Live")
    page.evaluate(
        """() => {
      window.placedAtSwap = null;
      document.addEventListener("htmx:afterSwap", (event) => {
        if (event.detail.target.id !== "trace-tree") return;
        window.placedAtSwap = (MEASURE)();
      });
      htmx.trigger(document.body, "resync");
    }""".replace("MEASURE", WATERFALL)
    )
    page.wait_for_function("() => window.placedAtSwap !== null")
    at_swap = page.evaluate("window.placedAtSwap")
    assert len(at_swap) == 7
    assert_placed(at_swap)
    assert_waterfall_placed(page)


def test_without_javascript_the_waterfall_is_placed_and_indented(
    live_site: Any, browser: Any
) -> None:
    """With JavaScript off (and the strict policy on), each bar is drawn at its span's start,
    as wide as its duration, its label beside it, the time marks across the scale, each row
    indented by its depth, and a subtree still folds."""
    operator()
    trace, spans = made_trace()
    context = browser.new_context(
        viewport={"width": 1280, "height": 860}, java_script_enabled=False
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    log_in(page, live_site, "olga", PASSWORD, then=f"/traces/{trace.trace_id}/")
    expect(page.locator("#trace-tree .row")).to_have_count(7)
    expect(page.locator("[data-tree-buttons]")).to_be_hidden()  # no script ran
    rem = 16  # the site's root font size, in px
    total = 1.2  # the task's duration, all of the trace
    depths = {
        "task": 0,
        "desk": 1,
        "turn": 2,
        "generation": 3,
        "tool": 3,
        "handoff": 3,
        "billing": 1,
    }
    for key, span in spans.items():
        line = row(page, span)
        cell = line.locator(".bar-cell").bounding_box()
        bar = line.locator(".bar").bounding_box()
        label = line.locator(".bar-time").bounding_box()
        caret = line.locator(".caret").bounding_box()
        box = line.bounding_box()
        assert cell and bar and label and caret and box, key
        assert span.started_at and span.ended_at and spans["task"].started_at
        seconds = (span.ended_at - span.started_at).total_seconds()
        start = (span.started_at - spans["task"].started_at).total_seconds()
        assert abs(bar["x"] - (cell["x"] + cell["width"] * start / total)) < 2, key
        assert abs(bar["width"] - max(2, cell["width"] * seconds / total)) < 2, key
        assert abs(bar["height"] - 0.7 * rem) < 1, key
        assert abs(caret["x"] - box["x"] - (0.6 + depths[key]) * rem) < 1, key
        place = line.locator(".bar-time").get_attribute("class") or ""
        if "is-after" in place:
            assert label["x"] >= bar["x"] + bar["width"], key
        elif "is-before" in place:
            assert label["x"] + label["width"] <= bar["x"], key
        else:
            assert bar["x"] <= label["x"] < label["x"] + label["width"] <= bar["x"] + bar["width"]
    # The task and Billing end at the right: their labels go inside and before their bars.
    expect(row(page, spans["task"]).locator(".bar-time")).to_have_class("bar-time is-inside")
    expect(row(page, spans["billing"]).locator(".bar-time")).to_have_class("bar-time is-before")
    scale = page.locator(".axis-scale").bounding_box()
    ticks = [box for n in range(5) if (box := page.locator(".tick").nth(n).bounding_box())]
    assert scale and len(ticks) == 5
    assert abs(ticks[0]["x"] - scale["x"]) < 2
    assert abs(ticks[4]["x"] + ticks[4]["width"] - scale["x"] - scale["width"]) < 2
    middle = ticks[2]["x"] + ticks[2]["width"] / 2
    assert abs(middle - scale["x"] - scale["width"] / 2) < 2
    expect(page.locator(".tick").nth(4)).to_have_text("1.20 s")

    row(page, spans["desk"]).locator(".caret").click()  # <details> folds without script
    expect(row(page, spans["tool"])).to_be_hidden()
    expect(row(page, spans["billing"])).to_be_visible()
    context.close()


def test_back_restores_the_previous_span_under_the_policy(live_site: Any, page: Any) -> None:
    """htmx keeps each pushed URL's page in its history cache and puts it back on Back: the
    restored waterfall is placed again, and nothing in it breaks the policy."""
    operator()
    trace, spans = made_trace()
    open_trace(page, live_site, trace.trace_id)
    panel = page.get_by_role("complementary", name="Span details")
    row(page, spans["tool"]).locator("a.span-link").click()
    expect(panel).to_contain_text("Order 7 for Chen Wei")
    row(page, spans["handoff"]).locator("a.span-link").click()
    expect(panel.locator(".headline")).to_have_text("Support desk → Billing")

    page.go_back()
    expect(page).to_have_url(
        re.compile(rf"/traces/{trace.trace_id}/spans/{spans['tool'].span_id}/$")
    )
    expect(panel).to_contain_text("Order 7 for Chen Wei")
    assert_waterfall_placed(page)


def test_an_open_trace_page_grows_while_the_run_executes_in_the_server(
    live_site: Any, page: Any, browser: Any
) -> None:
    seed_orders()
    alice = make_user(username="alice", password=PASSWORD)
    make_reviewer("rita")
    operator()
    conversation = make_conversation(owner=alice, agent_name="support")

    # Alice sends a message through the server, which runs the agent on its own loop.
    alices = browser.new_context(viewport={"width": 1280, "height": 860})
    alice_page = alices.new_page()
    alice_page.set_default_timeout(10_000)
    log_in(alice_page, live_site, "alice", PASSWORD, then=f"/chats/{conversation.session_id}/")
    sent = alice_page.request.post(
        f"{live_site.url}/chats/{conversation.session_id}/messages/",
        form={"text": "cancel order 42"},
        headers={"X-CSRFToken": csrf_token(alices)},
    )
    assert sent.ok, sent.status
    run = wait_for(lambda: AgentRun.objects.filter(conversation=conversation).first())

    # The operator opens the run's trace at once: its spans are not stored yet.
    open_trace(page, live_site, run.trace_id, state=re.compile("Live|Waiting for approval"))
    page.evaluate("window.notReloaded = true")
    rows = page.locator("#trace-tree .row")
    # Task, agent, the demo's input guardrail, turn, generation, and the call that waits for
    # a reviewer.
    expect(rows).to_have_count(6)
    expect(rows.filter(has_text="cancel_order")).to_have_count(1)
    expect(page.locator("#trace-summary .status")).to_have_text("Waiting")
    expect(page.locator("#trace-live-state")).to_have_text("Waiting for approval")

    # Rita approves, through the server too: the server resumes the run.
    request = wait_for(lambda: ApprovalRequest.objects.filter(run=run).first())
    ritas = browser.new_context()
    rita_page = ritas.new_page()
    rita_page.set_default_timeout(10_000)
    log_in(rita_page, live_site, "rita", PASSWORD, then=f"/inbox/{request.pk}/")
    decided = rita_page.request.post(
        f"{live_site.url}/inbox/{request.pk}/decide/",
        form={"action": "approve", "seen_hash": request.arguments_hash, "message": ""},
        headers={"X-CSRFToken": csrf_token(ritas)},
    )
    assert decided.ok, decided.status

    # The open page grows: the decision, then the resumed half, and the run ends OK.
    expect(rows.filter(has_text="approve · rita")).to_have_count(1)
    expect(rows.filter(has_text="resumed")).to_have_count(1)
    expect(rows).to_have_count(6 + 1 + 5)
    expect(page.locator("#trace-summary .status")).to_have_text("OK")
    # Once its last spans are stored, the page stops saying "Live".
    expect(page.locator("#trace-live-state")).to_have_text("Finished")
    expect(page.locator("#trace-summary .outcome")).to_have_text("Completed, a call approved")
    assert page.evaluate("window.notReloaded") is True
    assert_waterfall_placed(page)  # the tree re-read by htmx is placed too
    wait_for(lambda: AgentRun.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).first())
    alices.close()
    ritas.close()


def csrf_token(context: Any) -> str:
    return next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")


def wait_for[T](find: Callable[[], T | None], within: float = 15) -> T:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = find()
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError("not found in time")


def test_screenshot_of_the_trace_viewer(
    live_site: Any,
    page: Any,
    browser: Any,
    traces: Traces,
    monkeypatch: pytest.MonkeyPatch,
    screenshots: Path,
) -> None:
    """docs/screenshots/traces.png: a demo run with a tool call and a handoff, its tool call
    selected; and the same page on a phone, where the tree comes before the details."""
    seed_orders()
    monkeypatch.setattr("engine.executor.submit", lambda job, run_id: None)
    operator()
    chen = make_user(username="chen")  # the demo customer of order 7
    conversation = make_conversation(owner=chen, agent_name="support")

    def work() -> int:
        earlier = runs.start_run(conversation, "where is order 7", chen)
        script_demo_model(monkeypatch, [HANDOFF_AND_TOOLS[0], HANDOFF_AND_TOOLS[3]])
        asyncio.run(runs.execute(earlier.pk))
        script_demo_model(monkeypatch, HANDOFF_AND_TOOLS)
        run = runs.start_run(conversation, "I was charged twice for order 7, refund $20", chen)
        asyncio.run(runs.execute(run.pk))
        traces.flush()
        return run.pk

    run = AgentRun.objects.get(pk=in_thread(work))
    assert run.status == RunStatus.COMPLETED, run.error
    tool = Span.objects.filter(trace_id=run.trace_id, name="lookup_order").get()

    open_trace(page, live_site, run.trace_id)
    row(page, tool).locator("a.span-link").click()
    panel = page.get_by_role("complementary", name="Span details")
    expect(panel).to_contain_text("Order 7 for Chen Wei")
    expect(row(page, tool)).to_have_class(re.compile(r"\bis-selected\b"))
    page.mouse.move(0, 0)
    page.screenshot(path=str(screenshots / "traces.png"))

    phone = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    phone_page = phone.new_page()
    phone_page.set_default_timeout(10_000)
    log_in(phone_page, live_site, "olga", PASSWORD, then=f"/traces/{run.trace_id}/")
    row(phone_page, tool).locator("a.span-link").click()
    expect(phone_page.get_by_role("complementary", name="Span details")).to_contain_text(
        "lookup_order"
    )
    width = phone_page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the trace page scrolls sideways on a phone ({width}px)"
    tree_box = phone_page.locator("#trace-tree").bounding_box()
    panel_box = phone_page.locator("#span-panel").bounding_box()
    assert tree_box and panel_box and panel_box["y"] >= tree_box["y"] + tree_box["height"]
    phone_page.screenshot(path=str(screenshots / "traces-phone.png"), full_page=True)

    phone_page.goto(f"{live_site.url}/traces/")
    expect(phone_page.locator("table.trace-table tbody tr")).to_have_count(2)
    width = phone_page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the trace list scrolls sideways on a phone ({width}px)"
    phone.close()
    page.goto(f"{live_site.url}/traces/")
    expect(page.locator("table.trace-table tbody tr")).to_have_count(2)
    page.screenshot(path=str(screenshots / "traces-list.png"))


# --- big traces, the generation panel, long names, phones -----------------------------------


def big_trace(count: int = 10_000, **fields: Any) -> tuple[Trace, list[Span]]:
    from tests.tracing.test_trace_views import realistic_spans

    trace = make_trace(**fields)
    spans = realistic_spans(trace, count)
    Span.objects.bulk_create(spans, batch_size=1000)
    Trace.objects.filter(pk=trace.pk).update(ended_at=spans[0].ended_at)
    return trace, spans


def test_a_10000_span_trace_opens_with_its_top_levels_and_loads_subtrees_on_demand(
    live_site: Any, page: Any
) -> None:
    operator()
    trace, spans = big_trace(status="running")  # live: its refresh must keep what was loaded
    turns = [span for span in spans if span.span_type == "turn"]
    first, later = turns[0], turns[150]

    open_trace(page, live_site, trace.trace_id, state="Live")
    rows = page.locator("#trace-tree a.span-link")
    expect(rows).to_have_count(2 + 100)  # the task, its agent, a first page of turns
    expect(row(page, first)).to_be_visible()
    expect(row(page, first)).to_contain_text("2 spans")
    expect(page.locator("#trace-tree")).not_to_contain_text("lookup_order")
    page.screenshot(path="/tmp/detail-big-trace.png")

    # A folded turn opens from the keyboard and loads its two spans.
    page.locator(f"#node-{first.span_id} > .row summary").focus()
    page.keyboard.press("Enter")
    expect(rows).to_have_count(2 + 100 + 2)
    generation = next(s for s in spans if s.parent_id == first.span_id)
    expect(row(page, generation)).to_be_visible()
    assert page.evaluate("window.location.pathname") == f"/traces/{trace.trace_id}/"

    # "Show 100 more" brings the next page of turns; open one of them too.
    more = page.locator("#trace-tree .tree-more", has_text="Show 100 more of")
    more.focus()
    page.keyboard.press("Enter")
    expect(rows).to_have_count(2 + 200 + 2)
    # The keyboard's focus goes on to the first turn it brought.
    expect(row(page, turns[100]).locator("a.span-link")).to_be_focused()
    row(page, later).locator(".caret").click()
    expect(rows).to_have_count(2 + 200 + 4)
    page.screenshot(path="/tmp/detail-big-trace-expanded.png")

    # A live refresh re-reads the tree and keeps all of it.
    page.evaluate("window.notReloaded = true")
    with page.expect_response(re.compile(r"/tree/\?")) as refresh:
        page.evaluate('htmx.trigger(document.body, "resync")')
    assert "open=" in refresh.value.url and "more=" in refresh.value.url
    expect(page.locator("#trace-tree.htmx-request")).to_have_count(0)
    expect(rows).to_have_count(2 + 200 + 4)
    expect(row(page, generation)).to_be_visible()
    assert page.evaluate("window.notReloaded") is True

    # A span's details open from a loaded subtree as from any row.
    row(page, generation).locator("a.span-link").click()
    expect(page.get_by_role("complementary", name="Span details")).to_contain_text("gpt-4.1-mini")


def conversation_trace() -> tuple[Trace, Span, Span]:
    """A finished trace with a model call in the Responses shape, and a span whose name is
    longer than its row."""
    trace = make_trace(workflow_name="agentsite: Support desk")
    task = make_span(trace, "task", "agentsite: Support desk", end=1)
    generation = make_span(
        trace,
        "generation",
        "acme-mini",
        parent=task,
        start=0.1,
        end=0.6,
        model="acme-mini",
        input_tokens=420,
        output_tokens=30,
        span_data={
            "type": "generation",
            "model": "acme-mini",
            "usage": {"input_tokens": 420, "output_tokens": 30},
            "input": [
                {"role": "system", "content": "You are the support desk of the shop."},
                {"role": "user", "content": "Where is order 7? <b>now</b>"},
                {
                    "type": "function_call",
                    "name": "lookup_order",
                    "arguments": '{"order_id": 7}',
                    "call_id": "call_7",
                },
                {
                    "type": "function_call_output",
                    "call_id": "call_7",
                    "output": "Order 7: headphones, shipped yesterday.",
                },
            ],
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Order 7 shipped yesterday."}],
                }
            ],
        },
    )
    long_name = (
        "lookup_order_history_for_the_customer_with_every_refund_and_every_shipment_"
        "of_the_last_twelve_months"
    )
    tool = make_span(
        trace,
        "function",
        long_name,
        parent=task,
        start=0.6,
        end=0.9,
        span_data={"type": "function", "name": long_name, "input": "{}", "output": "none"},
    )
    Span.objects.bulk_create([task, generation, tool])
    return trace, generation, tool


def test_the_generation_panel_reads_as_a_conversation_and_long_names_can_be_read(
    live_site: Any, page: Any
) -> None:
    operator()
    trace, generation, tool = conversation_trace()
    open_trace(page, live_site, trace.trace_id)
    panel = page.get_by_role("complementary", name="Span details")
    row(page, generation).locator("a.span-link").click()
    messages = panel.locator(".msg")
    expect(messages).to_have_count(5)
    expect(messages.nth(1)).to_contain_text("Where is order 7? <b>now</b>")  # text, escaped
    expect(messages.nth(2)).to_contain_text("calls lookup_order")
    expect(messages.nth(2).locator("pre")).to_contain_text('"order_id": 7')
    expect(messages.nth(3)).to_contain_text("shipped yesterday.")
    expect(messages.nth(4)).to_contain_text("Order 7 shipped yesterday.")
    expect(panel.locator(".span-cost")).to_contain_text("no price for acme-mini")
    raw = panel.locator("details.block", has_text="Output").first
    expect(raw.locator("pre")).to_be_hidden()  # the JSON is one click away
    raw.locator("summary").click()
    expect(raw.locator("pre")).to_contain_text('"output_text"')
    page.mouse.move(0, 0)
    page.screenshot(path="/tmp/detail-generation.png")

    # The long name is cut in its row, but whole in its title, on focus and in the panel.
    name = row(page, tool).locator(".span-name")
    link = row(page, tool).locator("a.span-link")
    expect(link).to_have_attribute("title", tool.name)
    cut = name.evaluate("e => e.scrollWidth > e.clientWidth")
    assert cut, "the test's name should not fit its row"
    link.focus()
    assert name.evaluate("e => e.scrollWidth <= e.clientWidth + 1")  # wrapped, all shown
    link.click()
    expect(panel.get_by_role("heading", name=tool.name)).to_be_visible()
    page.screenshot(path="/tmp/detail-long-name.png")


def test_on_a_phone_a_spans_details_open_where_the_reader_is(live_site: Any, browser: Any) -> None:
    operator()
    trace, spans = big_trace(count=400)  # a long page on a phone
    phone = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    page = phone.new_page()
    page.set_default_timeout(10_000)
    open_trace(page, live_site, trace.trace_id)
    deep = [span for span in spans if span.span_type == "function"][60]
    link = row(page, deep).locator("a.span-link")
    link.scroll_into_view_if_needed()
    link.click()
    panel = page.locator("#span-panel")
    expect(panel).to_contain_text("lookup_order")
    page.wait_for_function(
        """() => {
      const box = document.getElementById("span-panel").getBoundingClientRect();
      return box.top >= 0 && box.top < window.innerHeight;
    }"""
    )
    page.screenshot(path="/tmp/detail-phone-panel.png")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the trace page scrolls sideways on a phone ({width}px)"
    # And back to the span's row in the tree.
    page.get_by_role("link", name="Back to the span in the tree").click()
    page.wait_for_function(
        """(id) => {
      const link = document.querySelector(`#trace-tree a.span-link[data-span="${id}"]`);
      const box = link.getBoundingClientRect();
      return box.top >= 0 && box.bottom <= window.innerHeight;
    }""",
        arg=deep.span_id,
    )
    page.screenshot(path="/tmp/detail-phone-back.png")
    phone.close()


def test_the_summary_says_how_the_run_went_and_what_the_user_thought(
    live_site: Any, page: Any
) -> None:
    from tests.tracing.test_tree import summarised_trace

    operator()
    trace, _ = summarised_trace(status="ok")
    open_trace(page, live_site, trace.trace_id)
    summary = page.locator("#trace-summary")
    expect(summary.locator(".outcome")).to_have_text("Completed, a call rejected")
    expect(summary).to_contain_text("refund_order rejected by rita: over the limit")
    expect(summary).to_contain_text("59 min 58 s")
    expect(summary).to_contain_text("no price for house-model")
    expect(summary.locator(".feedback-down")).to_contain_text("Wrong amount!")
    expect(summary.locator(".feedback-down")).to_contain_text("<script>alert(1)</script>")
    page.screenshot(path="/tmp/detail-summary.png")
