"""Pages fit the screens people read them on: a laptop's 1366 px and a phone's 390 px, with
nothing pushed out of sight sideways, no control cut short; and a notice of the site's (a
rename, a decision) sits in the page's flow, goes with its Dismiss button, by keyboard too,
and with the next thing sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ToolKind
from conversations.models import SessionItem
from engine import runs
from engine.models import AgentRun
from tests.browser import in_thread, log_in, say, wait_for_run, wait_until_live
from tests.browser.test_accessibility import working_day
from tests.conftest import Traces
from tests.factories import (
    PASSWORD,
    grant,
    make_conversation,
    make_request,
    make_reviewer,
    make_trace,
    make_user,
)
from tracing.models import Feedback

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # The demo shop's orders (alice owns 42, 44, 46); runs started here pause without going on.
    pytest.mark.usefixtures("orders", "submitted"),
]

LAPTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}

# How far the page reaches sideways, and the elements of `selector` that end beyond the
# viewport's right edge (or start before its left one).
SIDEWAYS = """selector => ({
  page: document.documentElement.scrollWidth,
  viewport: window.innerWidth,
  outside: [...document.querySelectorAll(selector)].filter((el) => {
    const box = el.getBoundingClientRect();
    return box.width && (box.left < 0 || box.right > window.innerWidth);
  }).map((el) => el.textContent.trim().slice(0, 30) || el.outerHTML.slice(0, 60)),
})"""

# The tables of `selector` that scroll sideways within their box: what they hold is wider.
SCROLLING = """selector => [...document.querySelectorAll(selector)]
  .filter((el) => el.scrollWidth > el.clientWidth + 1)
  .map((el) => `${el.className}: ${el.scrollWidth} px in ${el.clientWidth}`)"""


def assert_fits(page: Any, selector: str) -> None:
    """Nothing on `page` reaches beyond the viewport sideways, the elements of `selector` least
    of all."""
    seen = page.evaluate(SIDEWAYS, selector)
    assert seen["page"] <= seen["viewport"], seen
    assert seen["outside"] == [], seen


def open_as(
    browser: Any, live_site: Any, username: str, path: str, viewport: dict[str, int]
) -> Any:
    page = browser.new_context(viewport=viewport).new_page()
    page.set_default_timeout(10_000)
    log_in(page, live_site, username, PASSWORD, then=path)
    return page


# --- a laptop's screen ------------------------------------------------------------------------


def test_the_trace_list_fits_a_laptops_screen(live_site: Any, browser: Any, traces: Traces) -> None:
    """Its widest rows: a username that is an email address, a call rejected with its reason,
    a run waiting, ratings both ways, a model without a price."""
    rita = grant(make_reviewer(), "tracing.view_trace")
    alice = make_user(username="alice")
    lead = make_user(username="customer.service.lead@example.com")

    def work() -> None:
        for who, text in [
            (alice, "where is order 44"),
            (lead, "where is order 44"),
            (alice, "email alice@example.com about my refund"),
            (alice, "cancel order 42"),
        ]:
            started = runs.start_run(make_conversation(owner=who), text, who)
            asyncio.run(runs.execute(started.pk))
            run = AgentRun.objects.get(pk=started.pk)
            if text.startswith("email"):
                runs.decide(
                    run.approval_requests.get(),
                    rita,
                    runs.Decision.reject(message="No email about refunds without a manager."),
                )
                asyncio.run(runs.resume(run.pk))
            Feedback.objects.create(run=run, user=who, score=1)
            Feedback.objects.create(run=run, user=rita, score=-1)
        traces.flush()

    in_thread(work)
    page = open_as(browser, live_site, "rita", "/traces/", LAPTOP)
    expect(page.locator("table.trace-table tbody tr")).to_have_count(4)
    expect(page.get_by_text("customer.service.lead@example.com")).to_be_visible()

    assert page.evaluate(SCROLLING, ".table-scroll") == []
    assert_fits(page, "table.trace-table th, table.trace-table td")


def test_the_admins_request_list_fits_a_laptops_screen(live_site: Any, browser: Any) -> None:
    working_day()
    page = open_as(browser, live_site, "admin", "/admin/approvals/approvalrequest/", LAPTOP)
    expect(page.locator("#result_list tbody tr")).to_have_count(3)

    assert page.evaluate(SCROLLING, "#changelist .results") == []
    assert_fits(page, "#result_list th, #result_list td")


# --- a phone's screen -------------------------------------------------------------------------


def test_on_a_phone_the_header_keeps_every_link_on_the_screen(live_site: Any, browser: Any) -> None:
    """An admin's header has the most links: Chats, Inbox, Traces, Admin, the username, Log
    out. The admin site's own header too."""
    make_user(username="admin", is_staff=True, is_superuser=True)
    page = open_as(browser, live_site, "admin", "/chats/", PHONE)
    links = page.locator(".topbar nav a, .topbar nav button")
    expect(links).to_have_count(6)
    assert_fits(page, ".topbar, .topbar nav a, .topbar nav button")
    expect(page.get_by_role("button", name="Log out")).to_be_in_viewport()

    # The admin's pages, one whose title is a long id among them.
    trace = make_trace()
    for path in ("/admin/", f"/admin/tracing/trace/{trace.pk}/change/"):
        page.goto(live_site.url + path)
        assert_fits(page, "#header, #user-tools a, #user-tools button, #content h1, #content h2")
        expect(page.locator("#logout-form button")).to_be_in_viewport()


# Each select of `selector` whose chosen text is wider than the room it has (its box less its
# padding and the arrow's 20 px): the text shown is cut short.
CUT_SHORT = """selector => {
  const context = document.createElement("canvas").getContext("2d");
  return [...document.querySelectorAll(selector)].filter((select) => {
    const style = getComputedStyle(select);
    context.font = style.font;
    const text = context.measureText(select.selectedOptions[0].text).width;
    const room = select.clientWidth - parseFloat(style.paddingLeft) -
      parseFloat(style.paddingRight) - 20;
    return text > room;
  }).map((select) => `${select.name}: "${select.selectedOptions[0].text}"`);
}"""


def test_on_a_phone_the_filters_show_their_choices_whole(live_site: Any, browser: Any) -> None:
    """The inbox with every filter it may show (agents, tools, kinds of tool, MCP servers), the
    history and the trace list."""
    grant(make_reviewer(), "tracing.view_trace")
    make_request(tool_name="cancel_order")
    make_request(tool_name="restock", kind=ToolKind.MCP, server="warehouse")
    page = open_as(browser, live_site, "rita", "/inbox/", PHONE)
    expect(page.locator(".filters select")).to_have_count(4)
    for path, selects in [
        ("/inbox/", ".filters select"),
        ("/inbox/history/", ".filters select"),
        ("/traces/", ".trace-filters select"),
    ]:
        page.goto(live_site.url + path)
        assert page.evaluate(CUT_SHORT, selects) == [], path
        assert_fits(page, f"{selects}, .filter-buttons .btn")


def test_on_a_phone_the_history_reads_down_each_decision(live_site: Any, browser: Any) -> None:
    working_day()  # a call approved, one rejected with a message
    page = open_as(browser, live_site, "rita", "/inbox/history/", PHONE)
    calls = page.locator(".history .history-call")
    expect(calls).to_have_count(2)
    assert_fits(page, ".history td, .history td *")
    for call in calls.all():
        box = call.bounding_box()
        assert box and box["width"] > PHONE["width"] / 2, box  # not a sliver of its row


# --- notices ----------------------------------------------------------------------------------


def test_a_notice_sits_above_the_chat_and_goes_by_keyboard_or_with_the_next_message(
    live_site: Any, browser: Any
) -> None:
    alice = make_user(username="alice")
    chat = make_conversation(owner=alice, title="Order 44")
    SessionItem.objects.create(
        conversation=chat, payload={"role": "user", "content": "Where is order 44?"}
    )
    SessionItem.objects.create(
        conversation=chat,
        payload={
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Order 44 has shipped."}],
        },
    )
    for viewport in (LAPTOP, PHONE):
        page = open_as(browser, live_site, "alice", f"/chats/{chat.session_id}/", viewport)
        wait_until_live(page)

        page.get_by_text("Options").click()
        page.get_by_label("Title").fill("Order 44, shipped")
        page.get_by_role("button", name="Rename").click()
        notice = page.get_by_role("status").filter(has_text="Renamed.")
        expect(notice).to_be_visible()
        wait_until_live(page)

        # In the page's flow: the first message is all there, under nothing.
        first = page.locator(".msg").first
        expect(first).to_be_in_viewport(ratio=1)
        box, over = first.bounding_box(), notice.bounding_box()
        assert box and over and over["y"] + over["height"] <= box["y"], (over, box)
        assert first.evaluate(
            """el => { const box = el.getBoundingClientRect();
              return el.contains(document.elementFromPoint(box.x + box.width / 2,
                                                           box.y + box.height / 2)); }"""
        )

        # Dismissed from the keyboard: the button, then Enter; the focus stays in the page.
        dismiss = notice.get_by_role("button", name="Dismiss this notice")
        dismiss.focus()
        page.keyboard.press("Enter")
        expect(notice).to_have_count(0)
        assert page.evaluate("document.activeElement.tagName") == "MAIN"

        # Another notice goes as soon as she sends her next message (no reload comes).
        page.get_by_text("Options").click()
        page.get_by_label("Title").fill("Order 44")
        page.get_by_role("button", name="Rename").click()
        expect(page.get_by_role("status").filter(has_text="Renamed.")).to_be_visible()
        wait_until_live(page)
        page.evaluate("window.__sameDocument = true")
        say(page, "thanks")
        expect(page.locator(".msg-user .bubble").last).to_have_text("thanks")
        expect(page.locator("[data-flash]")).to_have_count(0)
        assert page.evaluate("window.__sameDocument === true")
        # Its reply is written before the next round (a message then is refused).
        wait_for_run(AgentRun.objects.filter(conversation=chat).latest("pk").pk, "completed")
        page.context.close()
