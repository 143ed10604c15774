"""Rating a reply in a real Chromium against a real daphne server: the buttons arrive with a
reply pushed live, a thumbs down with a comment is stored without a reload (htmx), the reload
shows it pressed; without JavaScript the same form posts and comes back. The operator's
conversation page shows it."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation
from engine.models import AgentRun
from tests.browser import log_in, open_new_chat, say, wait_until_live
from tests.factories import PASSWORD, VIEWER, make_user
from tracing.models import Feedback

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # alice is the demo customer who owns orders 42, 44 and 46.
    pytest.mark.usefixtures("orders"),
]

SHOTS = "/tmp/sessions-{}.png"
# Every screenshot with caret="initial": Playwright's default hides the caret with an inline
# style on the focused box, which the site's policy refuses (tests/browser/test_login.py).


def test_a_thumbs_down_with_a_comment_on_a_live_reply_then_the_reload_shows_it(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)
    say(page, "where is order 44")
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text("shipped")

    # The finished reply arrived over the socket, with its buttons.
    down = page.get_by_role("button", name="Not helpful")
    up = page.get_by_role("button", name="Helpful", exact=True)
    expect(down).to_have_attribute("aria-pressed", "false")
    expect(up).to_have_attribute("aria-pressed", "false")
    down.click()
    expect(down).to_have_attribute("aria-pressed", "true")
    comment = page.get_by_label("What was wrong, or right? (optional)")
    expect(comment).to_be_focused()  # the box it opened, ready to type in
    comment.fill("It did not say when it arrives.")
    page.get_by_role("button", name="Send comment").click()
    expect(
        page.get_by_role("status").filter(has_text="Thanks, your comment is saved.")
    ).to_be_visible()
    assert page.evaluate("window.__sameDocument === true")  # no reload
    page.screenshot(path=SHOTS.format("chat-rated"), full_page=True, caret="initial")

    run = AgentRun.objects.get(conversation__owner=alice)
    row = Feedback.objects.get()
    assert (row.run_id, row.user_id, row.score) == (run.pk, alice.pk, -1)
    assert row.comment == "It did not say when it arrives."

    page.reload()
    # Live, and the re-read its socket starts has landed: a click in the same instant (no
    # person is that fast) could see that re-read, read before the click's write, land after.
    wait_until_live(page)
    expect(page.get_by_role("button", name="Not helpful")).to_have_attribute("aria-pressed", "true")
    expect(page.get_by_role("button", name="Helpful", exact=True)).to_have_attribute(
        "aria-pressed", "false"
    )
    expect(page.get_by_label("What was wrong, or right? (optional)")).to_have_value(
        "It did not say when it arrives."
    )

    # Changed her mind: the one row changes.
    page.get_by_role("button", name="Helpful", exact=True).click()
    expect(page.get_by_role("button", name="Helpful", exact=True)).to_have_attribute(
        "aria-pressed", "true"
    )
    assert list(Feedback.objects.values_list("score", flat=True)) == [1]

    # The operator reads it on the conversation's page.
    conversation = Conversation.objects.get(owner=alice)
    make_user(perms=[VIEWER], username="olga", password=PASSWORD)
    page.get_by_role("button", name="Log out").click()
    log_in(
        page, live_site, "olga", PASSWORD, then=f"/traces/conversations/{conversation.session_id}/"
    )
    expect(page.get_by_test_id("totals")).to_contain_text("alice")
    expect(page.locator(".turn-card")).to_have_count(1)
    expect(page.locator(".turn-feedback")).to_contain_text("It did not say when it arrives.")
    expect(page.locator("[data-input]")).to_have_text("where is order 44")
    page.screenshot(path=SHOTS.format("operator-conversation"), full_page=True, caret="initial")
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    page.screenshot(
        path=SHOTS.format("operator-conversation-phone"), full_page=True, caret="initial"
    )
    page.set_viewport_size({"width": 1280, "height": 860})
    page.goto(f"{live_site.url}/traces/conversations/")
    expect(page.locator(f'[data-session="{conversation.session_id}"]')).to_be_visible()
    page.screenshot(path=SHOTS.format("operator-conversations"), full_page=True, caret="initial")
    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(
        path=SHOTS.format("operator-conversations-phone"), full_page=True, caret="initial"
    )


def test_without_javascript_the_buttons_post_and_come_back_pressed(
    live_site: Any, browser: Any, alice: Any
) -> None:
    # A finished reply, run in the server (JavaScript on), then rated with it off.
    with_js = browser.new_context()
    page = with_js.new_page()
    open_new_chat(page, live_site)
    say(page, "where is order 44")
    expect(page.get_by_role("button", name="Not helpful")).to_be_visible()
    url = page.url
    with_js.close()

    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    log_in(page, live_site, "alice", PASSWORD, then=re.sub(r"^https?://[^/]+", "", url))
    page.get_by_role("button", name="Not helpful").click()
    expect(page.get_by_role("button", name="Not helpful")).to_have_attribute("aria-pressed", "true")
    expect(page.get_by_text("Thanks for your feedback.")).to_be_visible()
    assert list(Feedback.objects.values_list("score", "comment")) == [(-1, "")]
    # The comment box is open after a thumbs down: write, send, back on the page.
    page.get_by_label("What was wrong, or right? (optional)").fill("Too vague.")
    page.get_by_role("button", name="Send comment").click()
    expect(page.get_by_label("What was wrong, or right? (optional)")).to_have_value("Too vague.")
    expect(page.get_by_text("Thanks, your comment is saved.")).to_be_visible()
    assert list(Feedback.objects.values_list("score", "comment")) == [(-1, "Too vague.")]
    # No script, no socket: the page does not say it is connecting.
    expect(page.get_by_text("Connecting…")).to_have_count(0)
    page.screenshot(path=SHOTS.format("chat-no-js"), full_page=True, caret="initial")
    context.close()
