"""The product on an OpenAI-compatible server (the local provider, speaking Chat Completions),
in two browsers against a real daphne site: alice asks, the reply streams, she asks to cancel
an order, rita approves in her inbox, alice's page shows the reply. Nothing is reloaded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from demo.models import Order
from demo.seed import seed_orders
from tests.browser import WATCH_STREAM, log_in, say, still_same_document, wait_until_live
from tests.factories import make_reviewer, make_user
from tests.live import LiveSite, start_site, stop_site
from tests.live import test_database_url as current_database_url
from tests.provider import LocalProvider, text, tool_call, use_local_provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "provider-pass-123"
LOOKED_UP = "Order 42, the Burr coffee grinder, is placed: it leaves our warehouse tomorrow."
WAITING = "A person will confirm: cancel an order that has not been delivered yet (order 44)"
CANCELLED = "Order 44 is cancelled; you will not be charged for the kettle."


@pytest.fixture
def provider_site(
    settings: Any,
    local_provider: LocalProvider,
    django_db_blocker: Any,
    tmp_path: Path,
) -> Iterator[LiveSite]:
    """A live site whose agents are served by the local provider (Chat Completions)."""
    env = use_local_provider(settings, local_provider, "chat_completions")
    with django_db_blocker.unblock():
        database_url = current_database_url()
    site = start_site(database_url, tmp_path / "daphne.log", extra_env=env)
    yield site
    stop_site(site)


def test_a_turn_streams_pauses_and_resumes_through_a_compatible_server(
    provider_site: LiveSite,
    local_provider: LocalProvider,
    page: Any,
    browser: Any,
    screenshots: Path,
) -> None:
    seed_orders()
    make_user(username="alice", password=PASSWORD)
    make_reviewer("rita", PASSWORD)
    # A visible pace, so that the page receives the reply word by word.
    local_provider.pace = 0.05
    local_provider.script(
        tool_call("lookup_order", {"order_id": 42}, "call_look_42"),
        text(LOOKED_UP),
        tool_call("cancel_order", {"order_id": 44}, "call_cancel_44"),
        text(CANCELLED),
    )

    log_in(page, provider_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    page.evaluate(WATCH_STREAM)

    say(page, "where is my order 42?")

    reply = page.locator(".msg-assistant .markdown").last
    expect(reply).to_have_text(LOOKED_UP)
    expect(page.locator(".note-tool").last).to_contain_text("what was refunded (order 42)")
    lengths = page.evaluate("window.__streamLengths")
    assert len(lengths) >= 3, lengths  # the text grew in several steps before the reply
    assert lengths == sorted(lengths) and lengths[-1] <= len(LOOKED_UP)

    say(page, "please cancel order 44")
    expect(page.get_by_text(WAITING)).to_be_visible()

    # rita's inbox, in a browser of her own, shows the call and takes her approval.
    inbox = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
    inbox.set_default_timeout(10_000)
    log_in(inbox, provider_site, "rita", PASSWORD, then="/inbox/")
    row = inbox.locator("#pending-rows > li.row-pending")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("cancel_order")
    expect(row).to_contain_text("asked by alice")
    row.get_by_role("button", name="Approve", exact=True).click()
    expect(inbox.locator("#pending-rows > li.row-pending")).to_have_count(0)

    # alice's page follows: the call ran, and the model's answer to its output arrived.
    expect(page.locator(".msg-assistant .markdown").last).to_have_text(CANCELLED, timeout=15_000)
    expect(page.get_by_text(WAITING)).to_have_count(0)
    expect(page.locator(".note-tool").last).to_contain_text("not been delivered yet (order 44)")
    assert still_same_document(page)
    assert Order.objects.get(number=44).status == Order.Status.CANCELLED
    paths = [request.path for request in local_provider.requests]
    assert paths == ["/v1/chat/completions"] * 4
    resumed = local_provider.requests[-1].body["messages"]
    (output,) = [m for m in resumed if m.get("tool_call_id") == "call_cancel_44"]
    assert "cancelled" in output["content"]
    page.screenshot(path=str(screenshots / "chat-compatible-provider.png"), caret="initial")
    inbox.context.close()
