"""Withdraw and Stop in a real Chromium against a real daphne server, which runs the agent.

- alice withdraws a request that waits: it leaves rita's open inbox without a reload, the
  agent answers that nothing was done, and alice's next message works.
- alice stops a reply being written: what was already said stays on the page (and after a
  reload), the run ends as cancelled, and her next message works.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus
from demo.models import OrderEvent
from engine.models import AgentRun, RunStatus
from tests.browser import log_in, open_new_chat, say
from tests.factories import PASSWORD, make_reviewer
from tests.live import start_site, stop_site
from tests.live import test_database_url as current_database_url

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # alice is the demo customer who owns orders 42, 44 and 46.
    pytest.mark.usefixtures("orders"),
]


@pytest.fixture
def slow_site(django_db_blocker: Any, tmp_path_factory: Any) -> Any:
    """A server whose offline model writes a word every 0.15 s: time to press Stop."""
    with django_db_blocker.unblock():
        database_url = current_database_url()
    site = start_site(
        database_url,
        tmp_path_factory.mktemp("slow") / "daphne.log",
        {"AGENTSITE_DEMO_STREAM_DELAY": "0.15"},
    )
    yield site
    stop_site(site)


def wait_for_run(**lookup: Any) -> AgentRun:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        run = AgentRun.objects.filter(**lookup).order_by("-pk").first()
        if run is not None:
            return run
        time.sleep(0.1)
    raise AssertionError(f"no run {lookup}")


def test_a_withdrawn_request_leaves_the_open_inbox_and_the_agent_answers(
    live_site: Any, page: Any, browser: Any, alice: Any, screenshots: Path
) -> None:
    make_reviewer("rita", PASSWORD)
    open_new_chat(page, live_site)
    say(page, "cancel order 42")
    waiting = page.locator(".run-waiting")
    expect(waiting).to_contain_text("A person will confirm: cancel an order")
    request = ApprovalRequest.objects.get(status=ApprovalStatus.PENDING)

    # rita has her inbox open in another browser.
    other = browser.new_context(viewport={"width": 1280, "height": 860})
    ritas = other.new_page()
    ritas.set_default_timeout(10_000)
    log_in(ritas, live_site, "rita", PASSWORD, then="/inbox/")
    expect(ritas.locator("[data-live-status]")).to_have_text("Live")
    expect(ritas.locator("#pending-rows.htmx-request")).to_have_count(0)
    row = ritas.locator(f"#request-{request.pk}")
    expect(row).to_have_class(re.compile(r"\brow-pending\b"))

    page.screenshot(path=str(screenshots / "chat-withdraw.png"), caret="initial")
    page.get_by_role("button", name="Withdraw").click()

    # Gone from rita's open inbox, without a reload.
    expect(row).to_have_count(0, timeout=3_000)
    expect(ritas.locator("#pending-count")).to_have_text("0 pending")
    # alice's chat: the agent answered that nothing was done; the conversation is free.
    turn = page.locator(f"#run-{request.run_id}")
    expect(turn).to_have_attribute("data-status", "completed", timeout=10_000)
    # Told to her as hers: on the call's note, and in the agent's answer.
    expect(turn).to_contain_text("You withdrew this request; nothing was done.")
    expect(turn).to_contain_text("You withdrew the request to cancel order 42")
    request.refresh_from_db()
    assert request.status == ApprovalStatus.WITHDRAWN
    assert request.decided_by is not None and request.decided_by.get_username() == "alice"
    assert not OrderEvent.objects.filter(tool_call_id=request.call_id).exists()

    say(page, "hello")
    latest = wait_for_run(conversation=request.run.conversation, input="hello")
    expect(page.locator(f"#run-{latest.pk}")).to_have_attribute(
        "data-status", "completed", timeout=10_000
    )
    page.screenshot(path=str(screenshots / "chat-withdrawn.png"), caret="initial")
    other.close()


def test_stop_mid_stream_keeps_the_partial_reply_and_a_new_message_works(
    slow_site: Any, page: Any, alice: Any, screenshots: Path
) -> None:
    open_new_chat(page, slow_site)
    say(page, "hello")
    run = wait_for_run(input="hello")
    stream = page.locator(f"#run-{run.pk}-text")
    expect(stream).to_contain_text("offline demo")  # a few words in, many to come

    page.get_by_role("button", name="Stop").click()

    turn = page.locator(f"#run-{run.pk}")
    expect(turn).to_have_attribute("data-status", "cancelled", timeout=5_000)
    expect(turn.locator(".run-cancelled")).to_contain_text("You stopped this reply")
    partial = turn.locator(".msg-assistant .bubble")
    expect(partial).to_contain_text("I'm the offline demo")
    said = partial.inner_text()
    assert "Try:" not in said  # it was stopped before the end of the reply
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    page.screenshot(path=str(screenshots / "chat-stopped.png"), caret="initial")

    # After a reload, the same: the words said stay.
    page.reload()
    expect(page.locator(f"#run-{run.pk} .msg-assistant .bubble")).to_have_text(said)

    say(page, "hello")
    latest = wait_for_run(input="hello", pk__gt=run.pk)
    expect(page.locator(f"#run-{latest.pk}")).to_have_attribute(
        "data-status", "completed", timeout=20_000
    )
    # The stopped words are still there, above the new turn.
    expect(page.locator(".msg-assistant").first).to_have_text(said)
