"""The trace list in a real Chromium against a real daphne server: rows of runs of several
outcomes, the outcome and tool filters narrowing it, and two ticked rows exported as two
JSON lines (the export streams from the server's event loop)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser import log_in
from tests.browser.test_traces import PASSWORD, operator
from tests.factories import make_user
from tests.live import flush_traces
from tests.tracing.test_list_views import UNPRICED, priced, traced_run
from tracing.models import Feedback, Trace, TraceOutcome

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path("/tmp")


def test_the_list_filters_by_outcome_and_tool_and_exports_the_ticked_rows(
    live_site: Any, page: Any
) -> None:
    operator()
    priced()
    traced = {
        "completed": traced_run(
            TraceOutcome.COMPLETED,
            username="alice",
            text="Where is my order 42? Mail me at alice@example.com",
            tools=("lookup_order",),
        ),
        "rejected": traced_run(
            TraceOutcome.REJECTED,
            username="bruno",
            text="Cancel order 3 now",
            reason="cancel_order: rejected by rita: it already shipped",
            tools=("lookup_order", "cancel_order"),
            waiting=754.0,
        ),
        "failed": traced_run(
            TraceOutcome.FAILED,
            username="chen",
            text="Refund order 7",
            reason="The model provider is unavailable (503)",
            model=UNPRICED,
        ),
        "approved": traced_run(
            TraceOutcome.APPROVED,
            username="eva",
            text="Refund $20 on order 15",
            reason="issue_refund: approved by rita",
            tools=("issue_refund",),
            waiting=95.0,
        ),
        "guardrail": traced_run(
            TraceOutcome.GUARDRAIL,
            username="hugo",
            text="Here is my card 4111 1111 1111 1111",
            reason="Blocked: the message holds a card number",
            model="",
        ),
    }
    run = traced["rejected"].run
    assert run is not None
    Feedback.objects.create(run=run, user=make_user(), score=-1, comment="too slow")

    # Only these traces: a test before this one on the same process may have left a trace
    # that its live site stored (a transactional test's database is flushed after it, not
    # before; seen once in the suite on two processes: 6 rows).
    flush_traces(live_site)  # what the server still holds of them, stored now, then deleted
    Trace.objects.exclude(pk__in=[trace.pk for trace in traced.values()]).delete()
    log_in(page, live_site, "olga", PASSWORD, then="/traces/")
    rows = page.locator("table.trace-list tbody tr")
    expect(rows).to_have_count(5)
    rejected_row = page.locator(f"#trace-{traced['rejected'].pk}")
    expect(rejected_row.locator(".outcome")).to_have_text("Completed, a call rejected")
    expect(rejected_row).to_contain_text("it already shipped")
    expect(rejected_row).to_contain_text("12 min 34 s")
    expect(rejected_row.locator(".rating-down")).to_be_visible()
    expect(page.locator(f"#trace-{traced['failed'].pk} .no-price")).to_have_text(
        f"no price for {UNPRICED}"
    )
    expect(page.locator("table.trace-list")).not_to_contain_text("alice@example.com")
    expect(page.locator("table.trace-list")).not_to_contain_text("4111 1111")
    # Nothing ticked: nothing to export.
    export = page.get_by_role("button", name="Export selected (JSONL)")
    expect(export).to_be_disabled()
    page.screenshot(path=str(SHOTS / "list-traces.png"), full_page=True)

    # The outcome filter narrows the list to the rejected call, and keeps itself.
    page.get_by_label("Outcome").select_option(label="Completed, a call rejected")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rejected_row).to_be_visible()
    expect(page.get_by_label("Outcome")).to_have_value("rejected")

    # The tool filter: the traces that called lookup_order.
    page.get_by_role("link", name="Clear").click()
    expect(rows).to_have_count(5)
    page.get_by_label("Tool").fill("lookup_order")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    expect(page.locator(f"#trace-{traced['completed'].pk}")).to_be_visible()
    expect(rejected_row).to_be_visible()
    page.screenshot(path=str(SHOTS / "list-traces-tool.png"), full_page=True)

    # Tick two rows of the whole list and export them.
    page.get_by_role("link", name="Clear").click()
    expect(rows).to_have_count(5)
    ticked = [traced["rejected"], traced["approved"]]
    for trace in ticked:
        page.get_by_label(f"Select trace {trace.trace_id}").check()
    expect(export).to_be_enabled()
    with page.expect_download() as download:
        export.click()
    assert download.value.suggested_filename == "traces.jsonl"
    lines = Path(download.value.path()).read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [line["trace_id"] for line in exported] == [trace.trace_id for trace in ticked]
    assert exported[0]["outcome"] == "rejected" and exported[0]["user"] == "bruno"
    assert [tool["name"] for tool in exported[0]["tools"]] == ["lookup_order", "cancel_order"]
    assert exported[0]["feedback"] == [{"score": -1, "comment": "too slow"}]

    # "Select every trace" ticks the page; unticking one leaves the rest.
    page.get_by_label("Select every trace on this page").check()
    expect(page.locator('input[name="trace"]:checked')).to_have_count(5)
    page.get_by_label(f"Select trace {traced['failed'].trace_id}").uncheck()
    expect(page.get_by_label("Select every trace on this page")).not_to_be_checked()
    expect(page.locator('input[name="trace"]:checked')).to_have_count(4)

    # On a phone the rows stack, each cell labelled.
    page.set_viewport_size({"width": 390, "height": 844})
    expect(rejected_row.locator('[data-label="Outcome"]')).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the trace list scrolls sideways on a phone ({width}px)"
    rejected_row.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "list-traces-phone.png"), full_page=False)


def test_the_cost_page_shows_the_tables_and_the_models_without_a_price(
    live_site: Any, page: Any
) -> None:
    operator()
    priced()
    traced_run(TraceOutcome.COMPLETED, username="alice", usage=(1_000_000, 200_000, 100_000))
    traced_run(TraceOutcome.FAILED, username="chen", model=UNPRICED, usage=(3_000, 0, 700))
    log_in(page, live_site, "olga", PASSWORD, then="/traces/")
    page.get_by_role("navigation", name="Operations").get_by_role("link", name="Costs").click()
    expect(page.get_by_role("heading", name="Costs and tokens")).to_be_visible()
    page.get_by_label("From", exact=True).fill("2026-11-01")
    page.get_by_label("To", exact=True).fill("2026-11-30")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#cost-by-day")).to_contain_text("$1.30")
    unpriced = page.get_by_role("region", name="Models without a price")
    expect(unpriced).to_contain_text(UNPRICED)
    expect(unpriced).to_contain_text("3,700")
    expect(page.locator("#cost-by-user")).to_contain_text("alice")
    page.screenshot(path=str(SHOTS / "list-costs.png"), full_page=True)
