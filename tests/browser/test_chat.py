"""The chat page in a real Chromium against a real daphne server: runs execute inside that
server, on its loop, and reach the page over its socket."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from conversations.models import Conversation, SessionItem
from engine import executor, runs
from tests.browser import (
    WAITING,
    WATCH_STREAM,
    log_in,
    open_new_chat,
    say,
    still_same_document,
    wait_until_live,
)
from tests.factories import PASSWORD, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # alice is the demo customer who owns orders 42, 44 and 46.
    pytest.mark.usefixtures("orders"),
]


def test_the_reply_streams_in_and_a_paused_call_shows_live(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)
    page.evaluate(WATCH_STREAM)

    say(page, "where is order 44")  # one of alice's own orders

    reply = page.locator(".msg-assistant .markdown").last
    expect(reply).to_contain_text("Here is what I found:")
    expect(reply).to_contain_text("shipped")
    expect(page.locator(".msg-user .bubble").last).to_have_text("where is order 44")
    expect(page.locator(".note-tool").last).to_contain_text("what was refunded (order 44)")
    lengths = page.evaluate("window.__streamLengths")
    assert len(lengths) >= 3, lengths  # the text grew word by word before the final reply
    assert lengths == sorted(lengths)
    expect(page.get_by_label("Message")).to_have_value("")

    say(page, "cancel order 42")

    expect(page.get_by_text(WAITING)).to_be_visible()
    expect(page.locator(".msg-user .bubble").last).to_have_text("cancel order 42")
    # While the run waits, another message is refused, clearly, and kept in the box.
    say(page, "and refund it")
    expect(page.locator("#composer-error")).to_contain_text("waiting for a reviewer's approval")
    expect(page.get_by_label("Message")).to_have_value("and refund it")

    # A reviewer decides in another process (this one): no push of it can reach the server's
    # in-memory channel layer, so the waiting page finds out by re-reading the database.
    rita = make_user(username="rita")
    rita.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    rita = type(rita).objects.get(pk=rita.pk)
    request = ApprovalRequest.objects.get(tool_name="cancel_order")
    # In a plain thread: Playwright keeps an event loop in this one, where async_to_sync
    # (the run engine publishes with it) refuses to run.
    decider = threading.Thread(target=runs.decide, args=(request, rita, runs.Decision.approve()))
    decider.start()
    decider.join()
    assert executor.inprocess().wait_idle(timeout=20)
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text(
        "is now cancelled", timeout=25_000
    )
    expect(page.get_by_text(WAITING)).to_have_count(0)
    assert still_same_document(page)


def test_a_script_in_her_message_is_only_text(live_site: Any, page: Any, alice: Any) -> None:
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    url = open_new_chat(page, live_site)
    payload = '<img src=x onerror="alert(1)"><script>alert(2)</script> **hi**'

    say(page, payload)

    expect(page.locator(".msg-user .bubble").first).to_have_text(payload)
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text("offline demo model")
    page.goto(url)
    expect(page.locator(".msg-user .bubble").first).to_have_text(payload)
    assert page.locator(".messages img, .messages script").count() == 0
    page.wait_for_timeout(200)
    assert dialogs == []


def test_she_renames_the_chat_and_undoes_her_last_message(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)
    box = page.get_by_label("Message")
    box.fill("where is order 44")
    box.press("Shift+Enter")  # a new line, not a send
    box.press_sequentially("thanks!")
    box.press("Enter")
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text("shipped")
    sent = page.locator(".msg-user .bubble").last.evaluate("el => el.textContent")
    assert sent == "where is order 44\nthanks!"

    page.get_by_text("Options").click()
    page.get_by_label("Title").fill("Headphones <order 7>")
    page.get_by_role("button", name="Rename").click()
    expect(page.get_by_test_id("chat-title")).to_have_text("Headphones <order 7>")
    expect(page).to_have_title("Headphones <order 7> · agentsite")

    page.get_by_text("Options").click()
    page.get_by_role("button", name="Undo last message").click()
    expect(page.get_by_text("Your last message and its reply were removed.")).to_be_visible()
    expect(page.locator(".msg")).to_have_count(0)
    expect(page.get_by_text("Start the conversation")).to_be_visible()

    page.goto(live_site.url + "/chats/")
    expect(page.get_by_role("link", name=re.compile("Headphones <order 7>"))).to_be_visible()


def test_the_page_re_reads_its_messages_when_it_re_syncs(
    live_site: Any, page: Any, alice: Any
) -> None:
    url = open_new_chat(page, live_site)
    say(page, "where is order 44")
    # `.markdown`: the finished reply, rendered from the database, not the words streaming in.
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text("shipped")

    # Written while the page's socket was down, say: no push announces it.
    conversation = Conversation.objects.get(session_id=url.rstrip("/").rsplit("/", 1)[-1])
    SessionItem.objects.create(
        conversation=conversation,
        payload={
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Written *while you were away*."}],
        },
    )
    page.wait_for_timeout(300)
    expect(page.get_by_text("while you were away")).to_have_count(0)

    # live.js fires this on every (re)connect of the socket.
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")

    expect(page.locator(".markdown em")).to_have_text("while you were away")
    assert still_same_document(page)


MARKDOWN_REPLY = (
    "**Order 7 has shipped** — your noise-cancelling headphones are on their way.\n\n"
    "How returns work:\n\n"
    "1. Unused items can be returned within **30 days** of delivery.\n"
    "2. Print a free return label from your account.\n"
    "3. The refund follows once the parcel is checked.\n\n"
    "Quote `RMA-7` on the parcel; the [returns policy](https://example.com/returns) "
    "has the details."
)


# An element's text contrast against the first opaque background behind it (WCAG 2 ratio).
CONTRAST = """element => {
  const rgb = text => text.match(/[0-9.]+/g).map(Number);
  const lum = ([r, g, b]) => {
    const f = c => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  let node = element, back = null;
  while (node && !back) {
    const color = rgb(getComputedStyle(node).backgroundColor);
    if (color.length < 4 || color[3] > 0) back = color;
    node = node.parentElement;
  }
  back = back || [255, 255, 255];
  const [a, b] = [lum(rgb(getComputedStyle(element).color)), lum(back)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def test_screenshots_of_a_chat_with_markdown_and_a_paused_call(
    live_site: Any, page: Any, browser: Any, alice: Any, screenshots: Path
) -> None:
    url = open_new_chat(page, live_site)
    conversation = Conversation.objects.get(session_id=url.rstrip("/").rsplit("/", 1)[-1])
    for payload in [
        {"role": "user", "content": "Hi! Where is order 7, and how do returns work?"},
        {
            "type": "function_call",
            "call_id": "call_shot_1",
            "name": "lookup_order",
            "arguments": '{"order_id": 7}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_shot_1",
            "output": "Order 7 for Chen Wei: Noise-cancelling headphones, $89.00, shipped.",
        },
        {
            "type": "function_call",
            "call_id": "call_shot_2",
            "name": "convert_time",
            "arguments": '{"source_timezone": "Mars/Olympus", "time": "09:30"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_shot_2",
            "output": "Tool error: Invalid timezone: 'No time zone found with key Mars/Olympus'",
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": MARKDOWN_REPLY}],
        },
    ]:
        SessionItem.objects.create(conversation=conversation, payload=payload)
    Conversation.objects.filter(pk=conversation.pk).update(title="Order 7 and a cancellation")
    page.goto(url)
    wait_until_live(page)

    # A call that failed says so, readably (WCAG AA contrast against its background).
    failed = page.locator(".note-tool .failed")
    expect(failed).to_have_count(1)
    expect(failed).to_have_text("failed:")
    expect(page.locator(".note-tool").filter(has=page.locator(".failed"))).to_contain_text(
        "Invalid timezone: 'No time zone found with key Mars/Olympus'"
    )
    assert failed.evaluate(CONTRAST) >= 4.5

    say(page, "Please cancel order 42, I ordered it twice.")
    expect(page.get_by_text(WAITING)).to_be_visible()
    expect(page.locator(".markdown ol li")).to_have_count(3)

    page.screenshot(path=str(screenshots / "chat.png"))

    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    small = phone.new_page()
    small.set_default_timeout(10_000)
    log_in(small, live_site, "alice", PASSWORD, then=url.replace(live_site.url, ""))
    expect(small.get_by_text(WAITING)).to_be_visible()
    expect(small.locator("[data-live-status]")).to_have_text("Live")
    # Nothing sticks out sideways at phone width.
    assert small.evaluate("document.documentElement.scrollWidth") <= 390
    small.screenshot(path=str(screenshots / "chat-phone.png"))

    small.goto(live_site.url + "/chats/")
    small.screenshot(path=str(screenshots / "chats-phone.png"))
    phone.close()
