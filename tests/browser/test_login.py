"""Logging in, in a real Chromium: a send after a logout in another tab goes to the login
page, and the typed message is back in the composer after logging in again."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from engine.models import AgentRun
from tests.browser import log_in
from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "alice-pass-123"
TYPED = "Please cancel order 42,\nI ordered the wrong size."


def test_a_send_after_a_logout_elsewhere_keeps_the_typed_message(live_site: Any, page: Any) -> None:
    make_user(username="alice", password=PASSWORD)
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    chat_url = page.url
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    page.get_by_label("Message").fill(TYPED)

    other = page.context.new_page()
    other.goto(f"{live_site.url}/chats/")
    other.get_by_role("button", name="Log out").click()
    expect(other.get_by_role("navigation").get_by_role("link", name="Log in")).to_be_visible()
    other.close()

    page.get_by_role("button", name="Send").click()
    page.wait_for_url(re.compile(r"/accounts/login/\?next="))
    # The whole page is the login page, not a login form inside the composer.
    expect(page.locator("#composer")).to_have_count(0)
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.wait_for_url(chat_url)
    expect(page.get_by_label("Message")).to_have_value(TYPED)
    assert AgentRun.objects.count() == 0
    # Restored once: a reload shows the composer empty again.
    page.reload()
    expect(page.get_by_label("Message")).to_have_value("")


def test_a_message_beyond_the_upload_limit_stays_in_the_composer(
    live_site: Any, page: Any, screenshots: Any
) -> None:
    make_user(username="alice", password=PASSWORD)
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    box = page.get_by_label("Message")
    # 3 MB: beyond Django's 2.5 MB upload limit, so the server refuses it unread.
    page.evaluate("document.querySelector('#composer textarea').value = 'x'.repeat(3000000)")
    box.press("Enter")
    expect(page.get_by_role("alert")).to_contain_text("The message is too long")
    assert page.evaluate("document.querySelector('#composer textarea').value.length") == 3_000_000
    assert AgentRun.objects.count() == 0
    # caret="initial": Playwright's default hides the caret with inline styles it leaves on
    # the page's inputs as style="", which htmx's next swap would copy (and the CSP refuse).
    page.screenshot(path=str(screenshots / "chat-too-long.png"), caret="initial")
    # She shortens it and sends: the composer works as before.
    box.fill("where is order 7")
    box.press("Enter")
    expect(page.locator(".msg-user .bubble").last).to_have_text("where is order 7")
    expect(page.get_by_label("Message")).to_have_value("")
