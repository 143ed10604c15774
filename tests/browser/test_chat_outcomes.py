"""alice's chat in Chromium says what a reviewer did with her request (an edit, in money),
names who answers in her message box after a handoff, offers the offline model's examples
on an empty chat, sends without a console error, and works without JavaScript."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from engine import executor, runs
from tests.browser import log_in, open_new_chat, say, still_same_document
from tests.browser.test_chat import CONTRAST
from tests.factories import PASSWORD, make_reviewer

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders"),
]

PHONE = {"width": 390, "height": 844}


def console_errors(page: Any) -> list[str]:
    errors: list[str] = []
    page.on(
        "console",
        lambda message: errors.append(message.text) if message.type == "error" else None,
    )
    return errors


def test_her_chat_shows_the_reviewer_s_edit_in_money(
    live_site: Any, page: Any, alice: Any, screenshots: Path
) -> None:
    errors = console_errors(page)
    open_new_chat(page, live_site)

    say(page, "refund 80 on order 42")
    waiting = page.locator(".waiting-line")
    expect(waiting).to_have_text(
        "A person will confirm: refund part or all of an order (order 42, amount $80.00)"
    )

    request = ApprovalRequest.objects.get(tool_name="issue_refund")
    edit = runs.Decision.edit({"order_id": 42, "amount": 60.0})
    # In a plain thread: Playwright keeps an event loop in this one.
    decider = threading.Thread(target=runs.decide, args=(request, make_reviewer("rita"), edit))
    decider.start()
    decider.join()
    assert executor.inprocess().wait_idle(timeout=20)

    note = page.locator(".note-tool").last
    outcome = note.get_by_test_id("call-outcome")
    expect(outcome).to_have_text(
        "rita changed your request before it ran: amount $80.00 → $60.00.", timeout=20_000
    )
    expect(note).to_contain_text("Refund part or all of an order (order 42, amount $60.00)")
    expect(note).to_contain_text("Refunded $60.00")
    assert outcome.evaluate(CONTRAST) >= 4.5
    assert still_same_document(page)
    page.screenshot(path=screenshots / "chat-edited.png", full_page=True)
    page.set_viewport_size(PHONE)
    expect(outcome).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.screenshot(path=screenshots / "chat-edited-phone.png", full_page=True)
    # Sending and the live pushes never missed their target (htmx's oobErrorNoTarget).
    assert [error for error in errors if "oob" in error.lower()] == [], errors


def test_the_message_box_names_who_answers_after_a_handoff(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)
    box = page.get_by_label("Message")
    expect(box).to_have_attribute("placeholder", "Message Support desk…")

    say(page, "I have a billing question")

    expect(page.get_by_test_id("answering")).to_have_text("Billing")
    expect(box).to_have_attribute("placeholder", "Message Billing…")


def test_an_empty_chat_offers_what_the_offline_model_understands(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)
    examples = page.get_by_test_id("chat-examples").get_by_role("button")
    expect(examples.first).to_have_text("where is order 44")
    expect(page.get_by_role("button", name="cancel order 42")).to_be_visible()

    page.get_by_role("button", name="cancel order 42").click()

    box = page.get_by_label("Message")
    expect(box).to_have_value("cancel order 42")
    expect(box).to_be_focused()


def test_without_javascript_a_sent_message_gets_its_reply(
    live_site: Any, browser: Any, alice: Any
) -> None:
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(15_000)
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    expect(page.get_by_text("Connecting…")).to_have_count(0)

    page.get_by_label("Message").fill("where is order 44")
    page.get_by_role("button", name="Send").click()

    # The page reads itself again until the reply is there: no typing dots forever.
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text(
        "Here is what I found", timeout=20_000
    )
    expect(page.locator(".typing")).to_have_count(0)
    expect(page.get_by_text("Connecting…")).to_have_count(0)
    context.close()
