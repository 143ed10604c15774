"""The reviewers' inbox in a real Chromium, against a real daphne server.

Pending requests are made by pausing runs of the demo agent in this process (its executor
stubbed): committed rows the server reads. Decisions are POSTed to the server, which resumes
the runs and publishes on its own channel layer, so what a second reviewer sees change is a
real push. A push about a NEW request must come from the server too: one test starts a
server whose sweep picks up a run queued here, the way it recovers a lost job, so the run
executes and pauses in the server.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from conversations.models import SessionItem
from demo.models import Order
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.approvals.test_views import XSS
from tests.browser import in_thread, log_in, open_inbox, pause, wait_for_run
from tests.factories import (
    PASSWORD,
    make_conversation,
    make_request,
    make_reviewer,
    make_run,
    make_user,
)
from tests.live import start_site, stop_site
from tests.live import test_database_url as current_database_url

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # The demo shop's orders, and runs started here that pause without running on.
    pytest.mark.usefixtures("orders", "submitted"),
]


@pytest.fixture
def sweeping_site(django_db_blocker: Any, live_site: Any, tmp_path_factory: Any) -> Any:
    """A server that sweeps every second and takes over any run queued for a second."""
    with django_db_blocker.unblock():
        database_url = current_database_url()
    site = start_site(
        database_url,
        tmp_path_factory.mktemp("sweeping") / "daphne.log",
        {"AGENTSITE_SWEEP_SECONDS": "1", "AGENTSITE_STUCK_RUN_TIMEOUT": "1"},
    )
    yield site
    stop_site(site)


def test_an_approval_leaves_both_reviewers_inboxes_at_once(
    live_site: Any, page: Any, browser: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    make_reviewer("bob", PASSWORD)
    first = pause("cancel order 42", alice)
    second = pause("cancel order 23", alice)

    open_inbox(page, live_site, "rita")
    rows = page.locator("#pending-rows > li.row-pending")
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_id(f"request-{second.pk}")  # newest first
    expect(page).to_have_title("(2) Inbox · agentsite")

    other = browser.new_context(viewport={"width": 1280, "height": 860})
    bobs = other.new_page()
    bobs.set_default_timeout(10_000)
    open_inbox(bobs, live_site, "bob")
    expect(bobs.locator("#pending-rows > li.row-pending")).to_have_count(2)

    row = page.locator(f"#request-{first.pk}")
    expect(row).to_contain_text("asked by alice")
    row.get_by_role("button", name="Approve", exact=True).click()

    expect(row).to_have_class(re.compile(r"\brow-decided\b"))
    expect(row).to_contain_text("Approved")
    expect(row).to_contain_text("by rita")
    expect(page.locator("#pending-count")).to_have_text("1 pending")
    expect(page).to_have_title("(1) Inbox · agentsite")

    # Bob did nothing: the server's push took the request out of his list.
    bobs_row = bobs.locator(f"#request-{first.pk}")
    expect(bobs_row).to_contain_text("by rita", timeout=2_000)
    expect(bobs_row.get_by_role("button")).to_have_count(0)
    expect(bobs.locator("#pending-rows > li.row-pending")).to_have_count(1, timeout=2_000)
    expect(bobs).to_have_title("(1) Inbox · agentsite", timeout=2_000)

    # And the server resumed the run: the order is cancelled.
    wait_for_run(first.run_id, RunStatus.COMPLETED)
    assert Order.objects.get(number=42).status == "cancelled"
    assert Order.objects.get(number=23).status == "placed"
    other.close()


def test_a_new_request_appears_in_the_open_inbox_without_a_reload(
    sweeping_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    open_inbox(page, sweeping_site, "rita")
    expect(page.get_by_text("All caught up.")).to_be_visible()
    page.evaluate("window.notReloaded = true")

    conversation = make_conversation(owner=alice, agent_name="support")
    run = in_thread(lambda: runs.start_run(conversation, "cancel order 42", alice))
    deadline = time.monotonic() + 15
    while not (request := ApprovalRequest.objects.filter(run=run).first()):
        assert time.monotonic() < deadline, AgentRun.objects.get(pk=run.pk).status
        time.sleep(0.05)

    # Paused in the server, which pushed the row: on the page within a second of the commit.
    row = page.locator(f"#request-{request.pk}")
    expect(row).to_be_visible(timeout=1_000)
    expect(row).to_contain_text("cancel_order")
    expect(row).to_contain_text("asked by alice")
    expect(page.locator("#pending-count")).to_have_text("1 pending")
    expect(page).to_have_title("(1) Inbox · agentsite")
    expect(page.get_by_text("All caught up.")).to_be_hidden()
    assert page.evaluate("window.notReloaded") is True

    # The pushed row works like any other.
    row.get_by_role("button", name="Approve", exact=True).click()
    expect(row).to_contain_text("by rita")
    wait_for_run(run.pk, RunStatus.COMPLETED)


def test_the_filters_offer_the_agent_and_tool_of_a_request_that_arrives_live(
    sweeping_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    chen = make_user(username="chen")  # the demo customer of order 7
    make_reviewer("rita", PASSWORD)
    make_request(run=make_run(owner=alice), agent_name="Billing", tool_name="cancel_order")

    open_inbox(page, sweeping_site, "rita")
    agents, tools = page.locator("#filter-agent"), page.locator("#filter-tool")
    expect(agents.locator("option")).to_have_text(["All agents", "Billing"])
    expect(tools.locator("option")).to_have_text(["All tools", "cancel_order"])
    tools.select_option("cancel_order")  # chosen, not applied yet
    # A second inbox, filtered: the new request is not in its list, its choices are.
    filtered = page.context.new_page()
    filtered.set_default_timeout(10_000)
    filtered.goto(f"{sweeping_site.url}/inbox/?tool=cancel_order")
    expect(filtered.locator("[data-live-status]")).to_have_text("Live")
    expect(filtered.locator("#pending-rows.htmx-request")).to_have_count(0)
    page.evaluate("window.notReloaded = true")

    conversation = make_conversation(owner=chen, agent_name="support")
    run = in_thread(lambda: runs.start_run(conversation, "refund 80 on order 7", chen))
    deadline = time.monotonic() + 15
    while not (request := ApprovalRequest.objects.filter(run=run).first()):
        assert time.monotonic() < deadline, AgentRun.objects.get(pk=run.pk).status
        time.sleep(0.05)
    assert (request.agent_name, request.tool_name) == ("Support desk", "issue_refund")

    expect(page.locator(f"#request-{request.pk}")).to_be_visible()
    expect(agents.locator("option")).to_have_text(["All agents", "Billing", "Support desk"])
    expect(tools.locator("option")).to_have_text(["All tools", "cancel_order", "issue_refund"])
    expect(tools).to_have_value("cancel_order")  # her choice stays
    assert page.evaluate("window.notReloaded") is True
    page.screenshot(path="/tmp/inbox-shots/inbox-filters-live.png")

    expect(filtered.locator(f"#request-{request.pk}")).to_have_count(0)
    filtered_tools = filtered.locator("#filter-tool")
    expect(filtered_tools.locator("option")).to_have_text(
        ["All tools", "cancel_order", "issue_refund"]
    )
    expect(filtered_tools).to_have_value("cancel_order")
    # The new choice filters like any other.
    filtered_tools.select_option("issue_refund")
    filtered.get_by_role("button", name="Filter").click()
    expect(filtered).to_have_url(re.compile(r"/inbox/\?.*tool=issue_refund"))
    expect(filtered.locator("#pending-rows > li.row-pending")).to_have_count(1)
    expect(filtered.locator(f"#request-{request.pk}")).to_be_visible()


def test_a_rejection_with_a_message_is_in_the_history(live_site: Any, page: Any) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    request = pause("cancel order 42", alice)

    open_inbox(page, live_site, "rita", then=f"/inbox/{request.pk}/")
    conversation = page.get_by_role("region", name="Conversation")
    expect(conversation).to_contain_text("cancel order 42")
    expect(conversation.locator(".line-call.is-current")).to_contain_text(
        "cancel_order(order_id=42)"
    )
    expect(page.locator(".args-full")).to_contain_text('"order_id": 42')

    page.get_by_label("Message").fill("Order 42 already left the warehouse; offer a return.")
    page.get_by_role("button", name="Reject").click()

    decision = page.get_by_role("region", name="Decision")
    expect(decision).to_contain_text("Rejected")
    expect(decision).to_contain_text("by rita")
    expect(decision).to_contain_text("offer a return")
    expect(page).to_have_title(re.compile(r"^cancel_order · Inbox"))  # nothing pending

    page.get_by_role("link", name="History").click()
    expect(page).to_have_url(re.compile(r"/inbox/history/$"))
    history = page.locator("table.history tbody tr")
    expect(history).to_have_count(1)
    expect(history.first).to_contain_text("Rejected")
    expect(history.first).to_contain_text("rita")
    expect(history.first).to_contain_text("Order 42 already left the warehouse; offer a return.")
    expect(history.first).to_contain_text("cancel_order(order_id=42)")

    wait_for_run(request.run_id, RunStatus.COMPLETED)
    assert Order.objects.get(number=42).status == "placed"


def test_bulk_approve_decides_every_selected_request(live_site: Any, page: Any) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    requests = [
        pause(text, alice) for text in ("cancel order 42", "cancel order 23", "cancel order 7")
    ]

    open_inbox(page, live_site, "rita")
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(3)
    approve_selected = page.get_by_role("button", name="Approve selected")
    expect(approve_selected).to_be_disabled()

    page.get_by_label("Select all").check()
    expect(page.locator("[data-selected-count]")).to_have_text("3 selected")
    approve_selected.click()
    # It asks first (tests/browser/test_inbox_bulk.py), listing the three.
    dialog = page.get_by_role("dialog", name="Approve 3 requests?")
    expect(dialog.locator(".confirm-row")).to_have_count(3)
    dialog.get_by_role("button", name="Approve 3 requests").click()

    expect(page.locator("#flash")).to_contain_text("Approved 3 requests.")
    expect(page.locator("#pending-rows > li.row-decided")).to_have_count(3)
    expect(page.locator("#pending-count")).to_have_text("0 pending")
    expect(page.get_by_text("All caught up.")).to_be_visible()
    expect(page).to_have_title("Inbox · agentsite")
    for request in requests:
        wait_for_run(request.run_id, RunStatus.COMPLETED)


def test_model_and_user_text_is_shown_as_text(live_site: Any, page: Any) -> None:
    make_reviewer("rita", PASSWORD)
    run = make_run(input=f"please {XSS}")
    request = make_request(run=run, tool_name="send_email", arguments={"body": XSS, "to": XSS})
    SessionItem.objects.create(
        conversation=run.conversation, payload={"role": "user", "content": XSS}
    )
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)

    open_inbox(page, live_site, "rita")
    row = page.locator(f"#request-{request.pk}")
    expect(row.locator("pre.args")).to_contain_text(f'"body": "{XSS}"')
    expect(row).to_contain_text(f"please {XSS}")

    page.goto(f"{live_site.url}/inbox/{request.pk}/")
    expect(page.get_by_role("region", name="Conversation")).to_contain_text(XSS)
    expect(page.locator(".args-full")).to_contain_text(XSS)
    assert page.locator("script:not([src])").count() == 0  # none at all: the CSP refuses them
    assert dialogs == []


def test_the_inbox_works_without_javascript(live_site: Any, browser: Any) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    request = pause("cancel order 42", alice)
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(10_000)

    log_in(page, live_site, "rita", PASSWORD, then="/inbox/?tool=cancel_order")
    page.locator(f"#request-{request.pk}").get_by_role("button", name="Approve").click()

    expect(page).to_have_url(re.compile(r"/inbox/\?tool=cancel_order$"))
    expect(page.locator("#flash")).to_contain_text("Approved cancel_order(order_id=42).")
    expect(page.get_by_text("Nothing pending for this filter.")).to_be_visible()

    page.goto(f"{live_site.url}/inbox/{request.pk}/")
    expect(page.get_by_role("region", name="Decision")).to_contain_text("Approved")
    context.close()


def test_screenshots_of_the_inbox(
    live_site: Any, page: Any, browser: Any, screenshots: Path
) -> None:
    """docs/screenshots/: the inbox on a laptop and on a phone, and one request."""
    alice = make_user(username="alice")
    chen = make_user(username="chen")  # the demo customer of order 7
    make_reviewer("rita", PASSWORD)
    pause("email chen.wei@example.com about my refund", chen)
    pause("research refund policy", alice)
    pause("refund 80 on order 7", chen)
    request = pause("cancel order 42", alice)

    open_inbox(page, live_site, "rita")
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(4)
    page.locator(f"#request-{request.pk}").get_by_role("checkbox").check()
    page.screenshot(path=str(screenshots / "inbox.png"))

    page.goto(f"{live_site.url}/inbox/{request.pk}/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    page.screenshot(path=str(screenshots / "inbox-request.png"))

    phone = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    phone_page = phone.new_page()
    phone_page.set_default_timeout(10_000)
    open_inbox(phone_page, live_site, "rita")
    expect(phone_page.locator("#pending-rows > li.row-pending")).to_have_count(4)
    width = phone_page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways on a phone ({width}px)"
    phone_page.screenshot(path=str(screenshots / "inbox-phone.png"))
    phone.close()

    ravi = make_reviewer("ravi", PASSWORD)

    def decide_the_others() -> None:
        for other in ApprovalRequest.objects.exclude(pk=request.pk):
            if other.tool_name == "issue_refund":
                decision = runs.Decision.reject(
                    "Over the limit for order 7; refund 50 and escalate."
                )
            else:
                decision = runs.Decision.approve(always=other.tool_name == "send_email")
            runs.decide(other, ravi, decision)

    in_thread(decide_the_others)
    page.goto(f"{live_site.url}/inbox/history/")
    expect(page.locator("table.history tbody tr")).to_have_count(3)
    page.screenshot(path=str(screenshots / "inbox-history.png"))


def test_a_logout_in_another_tab_closes_the_live_inbox(live_site: Any, page: Any) -> None:
    make_reviewer("rita", PASSWORD)
    open_inbox(page, live_site, "rita")
    expect(page.locator("[data-live-status]")).to_have_text("Live")

    other = page.context.new_page()
    other.goto(f"{live_site.url}/inbox/")
    other.get_by_role("button", name="Log out").click()
    expect(other.get_by_role("button", name="Log out")).to_have_count(0)

    # The socket was closed with 4403: no endless "Reconnecting…".
    expect(page.locator("[data-live-status]")).to_have_text("Log in again", timeout=5_000)
    page.wait_for_timeout(1_500)
    expect(page.locator("[data-live-status]")).to_have_text("Log in again")
    other.close()
