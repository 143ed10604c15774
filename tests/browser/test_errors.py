"""A failed htmx request explains itself on the page, in a real Chromium, and what was typed
stays in the composer: a conversation deleted in another tab (404), the site unreachable."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import Conversation
from engine.models import AgentRun
from tests.browser import log_in
from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "alice-pass-123"


def _new_chat(page: Any, live_site: Any) -> None:
    make_user(username="alice", password=PASSWORD)
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    expect(page.locator("[data-live-status]")).to_have_text("Live")


def test_a_send_to_a_deleted_conversation_says_so_and_keeps_the_text(
    live_site: Any, page: Any, screenshots: Any
) -> None:
    _new_chat(page, live_site)
    problem = page.locator("#request-problem")
    expect(problem).to_be_hidden()
    Conversation.objects.all().delete()  # in another tab, say
    page.get_by_label("Message").fill("where is order 7")
    page.get_by_role("button", name="Send").click()
    expect(problem).to_be_visible()
    expect(problem).to_contain_text("That is no longer there")
    expect(page.get_by_label("Message")).to_have_value("where is order 7")
    page.screenshot(path=str(screenshots / "request-problem.png"), caret="initial")
    problem.get_by_role("button", name="Dismiss").click()
    expect(problem).to_be_hidden()
    assert AgentRun.objects.count() == 0


def test_an_unreachable_site_says_so_and_the_next_send_clears_it(live_site: Any, page: Any) -> None:
    _new_chat(page, live_site)
    problem = page.locator("#request-problem")
    page.route("**/messages/", lambda route: route.abort("connectionrefused"))
    page.get_by_label("Message").fill("where is order 7")
    page.get_by_role("button", name="Send").click()
    expect(problem).to_contain_text("The site could not be reached")
    expect(page.get_by_label("Message")).to_have_value("where is order 7")
    assert AgentRun.objects.count() == 0
    page.unroute("**/messages/")
    page.get_by_role("button", name="Send").click()
    expect(problem).to_be_hidden()
    expect(page.locator(".msg-user .bubble").last).to_have_text("where is order 7")
