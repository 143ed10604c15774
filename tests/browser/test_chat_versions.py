"""Editing an earlier message in a real Chromium against a real daphne server: alice's
conversation forks at the message she edited, the agent answers the edited text, and the
Versions switcher takes her back to the original and forth again, with nothing of one
version shown in the other."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation
from engine.models import AgentRun
from tests.browser import PASSWORD, log_in, say, wait_until_live

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # alice is the demo customer who owns orders 42, 44 and 46.
    pytest.mark.usefixtures("orders"),
]

QUESTIONS = ["where is order 44", "where is order 46", "where is order 42"]
EDITED = "is order 42 shipped yet?"


def bubbles(page: Any) -> list[str]:
    return [text.strip() for text in page.locator(".msg-user .bubble").all_inner_texts()]


def replies(page: Any) -> Any:
    return page.locator(".msg-assistant .markdown")


def a_three_turn_conversation(page: Any, live_site: Any) -> str:
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    wait_until_live(page)
    for n, text in enumerate(QUESTIONS, start=1):
        say(page, text)
        expect(replies(page)).to_have_count(n)
        # Each reply has finished (its rating buttons come with the finished block).
        expect(page.locator(".turn[data-active]")).to_have_count(0)
    expect(page.get_by_test_id("edit-message")).to_have_count(3)
    return page.url


def test_she_edits_her_second_message_and_switches_between_the_versions(
    live_site: Any, page: Any, browser: Any, alice: Any, screenshots: Path
) -> None:
    url = a_three_turn_conversation(page, live_site)
    assert bubbles(page) == QUESTIONS
    original_replies = replies(page).all_inner_texts()

    # The blocks were pushed as she chatted; she edits in place, without reloading.
    second = page.locator(".msg-user").nth(1)
    second.get_by_test_id("edit-message").click()
    box = second.get_by_test_id("edit-text")
    expect(box).to_have_value(QUESTIONS[1])
    box.fill(EDITED)
    # The page re-reads its messages (as on every reconnect of its socket): what she typed
    # stays, in the open box, with the focus.
    with page.expect_response(re.compile(r"/history/$")):
        page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    expect(page.locator("#messages.htmx-request")).to_have_count(0)
    second = page.locator(".msg-user").nth(1)
    box = second.get_by_test_id("edit-text")
    expect(box).to_be_visible()
    expect(box).to_have_value(EDITED)
    expect(box).to_be_focused()
    page.screenshot(path=str(screenshots / "chat-edit.png"))
    second.get_by_test_id("edit-send").click()

    # The fork: turn 1 as it was, the edited turn 2 and the agent's answer to it.
    expect(page.get_by_test_id("version-current")).to_have_text("Edit 1")
    expect(replies(page)).to_have_count(2, timeout=25_000)
    expect(page.locator(".turn[data-active]")).to_have_count(0, timeout=25_000)
    assert bubbles(page) == [QUESTIONS[0], EDITED]
    assert QUESTIONS[2] not in page.locator("#messages").inner_text()
    edited_replies = replies(page).all_inner_texts()
    assert edited_replies[0] == original_replies[0]
    assert "42" in edited_replies[1]
    page.screenshot(path=str(screenshots / "chat-versions.png"))

    # Back to the original: its three turns, none of the edit. The switch loads the page
    # anew: its text is read once that page is loaded, live, and its first re-read landed
    # (read while it loaded, a reply's text once came with its markdown's trailing newline).
    page.get_by_role("button", name="Original").click()
    expect(page.get_by_test_id("version-current")).to_have_text("Original")
    page.wait_for_load_state("load")
    wait_until_live(page)
    expect(page.locator(".msg-user .bubble")).to_have_count(3)
    assert bubbles(page) == QUESTIONS
    assert replies(page).all_inner_texts() == original_replies
    assert EDITED not in page.locator("#messages").inner_text()

    # And forth again; a reload shows the version she chose last.
    page.get_by_role("button", name="Edit 1").click()
    expect(page.get_by_test_id("version-current")).to_have_text("Edit 1")
    page.goto(url)
    wait_until_live(page)
    assert bubbles(page) == [QUESTIONS[0], EDITED]
    conversation = Conversation.objects.get(session_id=url.rstrip("/").rsplit("/", 1)[-1])
    assert conversation.current_branch == "edit-1"

    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    small = phone.new_page()
    small.set_default_timeout(10_000)
    log_in(small, live_site, "alice", PASSWORD, then=url.replace(live_site.url, ""))
    wait_until_live(small)
    expect(small.get_by_test_id("version-current")).to_have_text("Edit 1")
    small.locator(".msg-user").nth(1).get_by_test_id("edit-message").click()
    expect(small.locator(".msg-user").nth(1).get_by_test_id("edit-text")).to_be_visible()
    # Nothing sticks out sideways at phone width.
    assert small.evaluate("document.documentElement.scrollWidth") <= 390
    small.screenshot(path=str(screenshots / "chat-versions-phone.png"))
    phone.close()


def test_an_edit_without_javascript_forks_too(
    live_site: Any, browser: Any, page: Any, alice: Any
) -> None:
    """The Edit control and the switcher are plain forms: a browser without scripts gets
    the new version as a page of its own."""
    url = a_three_turn_conversation(page, live_site)

    plain = browser.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 860})
    nojs = plain.new_page()
    log_in(nojs, live_site, "alice", PASSWORD, then=url.replace(live_site.url, ""))
    first = nojs.locator(".msg-user").first
    first.get_by_test_id("edit-message").click()
    first.get_by_test_id("edit-text").fill("where is order 46")
    first.get_by_test_id("edit-send").click()

    expect(nojs.get_by_test_id("version-current")).to_have_text("Edit 1")
    assert bubbles(nojs) == ["where is order 46"]
    # No page updates itself without scripts: she reloads until the agent has answered
    # (a switch is refused while it works).
    for _ in range(50):
        if nojs.locator(".turn[data-active]").count() == 0 and replies(nojs).count() == 1:
            break
        nojs.wait_for_timeout(300)
        nojs.reload()
    expect(replies(nojs)).to_have_count(1)
    nojs.get_by_role("button", name="Original").click()
    expect(nojs.get_by_test_id("version-current")).to_have_text("Original")
    assert bubbles(nojs) == QUESTIONS
    plain.close()


def test_a_version_chosen_in_one_window_is_shown_in_the_other(
    live_site: Any, page: Any, alice: Any
) -> None:
    """Two windows on one conversation: a version switch in one re-reads the other at once;
    a window that missed it (its re-read held) does not send a message on a version it does
    not show, keeps it in the box, and catches up."""
    url = a_three_turn_conversation(page, live_site)
    second = page.locator(".msg-user").nth(1)
    second.get_by_test_id("edit-message").click()
    second.get_by_test_id("edit-text").fill(EDITED)
    second.get_by_test_id("edit-send").click()
    expect(page.get_by_test_id("version-current")).to_have_text("Edit 1")
    expect(replies(page)).to_have_count(2, timeout=25_000)
    expect(page.locator(".turn[data-active]")).to_have_count(0, timeout=25_000)

    other = page.context.new_page()
    other.set_default_timeout(10_000)
    other.goto(url)
    wait_until_live(other)
    other.evaluate("window.__sameDocument = true")
    expect(other.get_by_test_id("version-current")).to_have_text("Edit 1")

    page.get_by_role("button", name="Original").click()
    expect(page.get_by_test_id("version-current")).to_have_text("Original")
    expect(other.get_by_test_id("version-current")).to_have_text("Original")
    expect(other.locator(".msg-user .bubble")).to_have_count(3)
    assert bubbles(other) == QUESTIONS
    assert other.evaluate("window.__sameDocument === true")  # re-read, not reloaded

    held: list[Any] = []

    def hold(route: Any) -> None:
        held.append(route)

    other.route(re.compile(r"/history/$"), hold)
    page.get_by_role("button", name="Edit 1").click()
    expect(page.get_by_test_id("version-current")).to_have_text("Edit 1")
    while not held:
        other.wait_for_timeout(20)
    say(other, "and order 46?")
    expect(other.locator("#composer-error")).to_contain_text("switched to another version")
    expect(other.get_by_label("Message")).to_have_value("and order 46?")

    for route in held:
        route.continue_()  # read now: the version there is
    other.unroute(re.compile(r"/history/$"), hold)
    expect(other.get_by_test_id("version-current")).to_have_text("Edit 1")
    assert bubbles(other) == [QUESTIONS[0], EDITED]
    conversation = Conversation.objects.get(session_id=url.rstrip("/").rsplit("/", 1)[-1])
    assert not AgentRun.objects.filter(conversation=conversation, input="and order 46?").exists()
    other.close()
