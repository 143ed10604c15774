"""A model that is rate limited, in a real Chromium against a real daphne server whose agents
are served by the local provider (tests/provider.py) over Chat Completions: alice reads that
the model is busy, not an exception; "Send again" (a double click) sends her message once the
provider answers again, and a draft she had started in the composer stays."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from engine import model_errors
from engine.models import AgentRun, RunStatus
from tests.browser import open_new_chat, say
from tests.live import start_site, stop_site
from tests.live import test_database_url as current_database_url
from tests.provider import LocalProvider, fail, text, use_local_provider

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # alice is the demo customer who owns orders 42, 44 and 46.
    pytest.mark.usefixtures("orders"),
]

REPLY = "Order 44 has shipped and arrives on Friday."


@pytest.fixture
def provider_site(
    settings: Any, local_provider: LocalProvider, django_db_blocker: Any, tmp_path: Path
) -> Any:
    env = use_local_provider(settings, local_provider, "chat_completions", retries=1, timeout=2)
    with django_db_blocker.unblock():
        database_url = current_database_url()
    site = start_site(database_url, tmp_path / "daphne.log", env)
    yield site
    stop_site(site)


def runs_settled(count: int, timeout: float = 10) -> list[AgentRun]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = list(AgentRun.objects.order_by("pk"))
        if len(runs) == count and all(run.is_finished for run in runs):
            return runs
        time.sleep(0.1)
    raise AssertionError(f"not {count} finished runs: {list(AgentRun.objects.values())}")


def test_a_rate_limited_model_says_so_and_send_again_works(
    provider_site: Any, local_provider: LocalProvider, page: Any, alice: Any, screenshots: Path
) -> None:
    local_provider.always(fail(429, retry_after=0.01))
    open_new_chat(page, provider_site)

    say(page, "where is order 44")

    failed = page.locator(".run-failed")
    expect(failed).to_contain_text("The agent couldn't finish this reply.")
    expect(failed.get_by_test_id("run-error")).to_have_text(model_errors.RATE_LIMITED)
    expect(page.locator(".turn .msg-user").last).to_have_text("where is order 44")
    send_again = failed.get_by_role("button", name="Send again")
    expect(send_again).to_be_visible()
    assert "RateLimitError" not in page.content()
    page.screenshot(path=str(screenshots / "chat-model-rate-limited.png"), caret="initial")
    [first] = runs_settled(1)
    assert first.status == RunStatus.FAILED and first.error_detail["status_code"] == 429

    # The model answers again; she had started typing something else meanwhile.
    local_provider.always(text(REPLY))
    page.get_by_label("Message").fill("and order 7?")
    send_again.dblclick()

    expect(page.locator(".msg-assistant .markdown").last).to_have_text(REPLY)
    expect(send_again).to_be_hidden()  # a later turn follows the failed one
    expect(page.get_by_label("Message")).to_have_value("and order 7?")
    failed_run, again = runs_settled(2)
    assert (again.status, again.input) == (RunStatus.COMPLETED, "where is order 44")
    page.screenshot(path=str(screenshots / "chat-model-sent-again.png"), caret="initial")
