"""The whole product in two browsers: alice asks, rita approves, both pages follow live.

Everything goes through a real daphne server, so the run executes on its loop and every push
crosses its channel layer; nothing is reloaded.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from demo.models import Order
from demo.seed import seed_orders
from tests.browser import log_in, pause
from tests.factories import make_user
from tests.live import free_port, start_site, stop_site
from tests.live import test_database_url as current_database_url

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "demo-pass-123"
WAITING = "A person will confirm: cancel an order that has not been delivered yet (order 42)"


def make_people() -> tuple[Any, Any]:
    seed_orders()
    alice = make_user(username="alice", password=PASSWORD)
    rita = make_user(username="rita", password=PASSWORD)
    rita.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    return alice, rita


def new_context(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    return page


def test_an_approval_travels_live_from_alice_to_rita_and_back(
    live_site: Any, page: Any, browser: Any
) -> None:
    make_people()
    # rita's inbox is open, and stays open.
    log_in(page, live_site, "rita", PASSWORD, then="/inbox/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(0)
    page.evaluate("window.__sameDocument = true")

    # alice, in another browser, asks to cancel an order.
    chat = new_context(browser)
    log_in(chat, live_site, "alice", PASSWORD, then="/chats/")
    chat.get_by_role("button", name="New conversation").click()
    chat.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    expect(chat.locator("[data-live-status]")).to_have_text("Live")
    expect(chat.locator("#messages.htmx-request")).to_have_count(0)
    chat.evaluate("window.__sameDocument = true")
    box = chat.get_by_label("Message")
    box.fill("cancel order 42")
    box.press("Enter")
    expect(chat.get_by_text(WAITING)).to_be_visible()

    # rita's inbox shows it without reload, with a count in the title.
    row = page.locator("#pending-rows > li.row-pending")
    expect(row).to_have_count(1, timeout=5_000)
    expect(row).to_contain_text("cancel_order")
    expect(row).to_contain_text("asked by alice")
    expect(page).to_have_title(re.compile(r"^\(1\) "))

    row.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(0)

    # alice's chat shows the tool's result and the reply, without reload.
    # In plain words for her, with who approved it.
    note = chat.locator(".note-tool").last
    expect(note).to_contain_text("Cancel an order that has not been delivered yet (order 42)")
    expect(note.get_by_test_id("call-outcome")).to_have_text("Approved by rita.")
    expect(chat.locator(".msg-assistant .markdown").last).to_contain_text(
        "cancelled", timeout=15_000
    )
    expect(chat.get_by_text(WAITING)).to_have_count(0)
    assert Order.objects.get(number=42).status == "cancelled"
    assert page.evaluate("window.__sameDocument === true")
    assert chat.evaluate("window.__sameDocument === true")
    chat.context.close()


def test_a_rejection_message_reaches_alice_live(live_site: Any, page: Any, browser: Any) -> None:
    make_people()
    chat = new_context(browser)
    log_in(chat, live_site, "alice", PASSWORD, then="/chats/")
    chat.get_by_role("button", name="New conversation").click()
    chat.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    expect(chat.locator("[data-live-status]")).to_have_text("Live")
    expect(chat.locator("#messages.htmx-request")).to_have_count(0)
    box = chat.get_by_label("Message")
    box.fill("cancel order 42")
    box.press("Enter")
    expect(chat.get_by_text(WAITING)).to_be_visible()

    request = ApprovalRequest.objects.get(tool_name="cancel_order")
    log_in(page, live_site, "rita", PASSWORD, then=f"/inbox/{request.pk}/")
    page.get_by_label(re.compile("message", re.IGNORECASE)).fill("Orders ship in 2 hours, sorry")
    page.get_by_role("button", name="Reject", exact=True).click()
    expect(page.get_by_text(re.compile("Rejected"))).not_to_have_count(0)

    expect(chat.locator(".msg-assistant .markdown").last).to_contain_text(
        "Orders ship in 2 hours, sorry", timeout=15_000
    )
    assert Order.objects.get(number=42).status == "placed"
    chat.context.close()


def test_the_open_inbox_reconnects_and_resyncs_after_a_server_restart(
    django_db_blocker: Any, page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The request below is paused here, in the test process, and must not run on here.
    monkeypatch.setattr("engine.executor.submit", lambda job, run_id: None)
    alice, _ = make_people()
    with django_db_blocker.unblock():
        database_url = current_database_url()
    port = free_port()
    site = start_site(database_url, tmp_path / "first.log", port=port)
    try:
        log_in(page, site, "rita", PASSWORD, then="/inbox/")
        expect(page.locator("[data-live-status]")).to_have_text("Live")
        expect(page.locator("#pending-rows > li.row-pending")).to_have_count(0)
        page.evaluate("window.__sameDocument = true")

        stop_site(site)
        expect(page.locator("[data-live-status]")).to_have_text("Reconnecting…")
        # While the server is down, a request arrives (nobody can push it).
        request = pause("cancel order 42", alice)
        site = start_site(database_url, tmp_path / "second.log", port=port)

        # The page reconnected by itself and re-read the inbox.
        expect(page.locator("[data-live-status]")).to_have_text("Live", timeout=30_000)
        expect(page.locator(f"#request-{request.pk}")).to_be_visible()
        expect(page).to_have_title(re.compile(r"^\(1\) "))
        assert page.evaluate("window.__sameDocument === true")
    finally:
        stop_site(site)


def test_a_page_retries_its_socket_at_least_every_15_s_however_long_the_server_was_down(
    page: Any, live_site: Any
) -> None:
    """The cause of a flaky restart test above (CI, stop 36): a socket dropped without a close
    frame (1006, a stopped server) was retried on the ws extension's own schedule, which waits
    up to 64 s after six failed tries; the page found the restarted server 30 s late."""
    make_people()
    log_in(page, live_site, "rita", PASSWORD, then="/inbox/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    waits = page.evaluate(
        "Array.from({length: 40}, (_, tries) => htmx.config.wsReconnectDelay(tries))"
    )
    assert 500 <= waits[0] <= 1000
    assert max(waits) <= 15_000
    assert min(waits[6:]) >= 7_500  # still backing off: half the most at least
