"""The chat page in a real Chromium while the server's Redis is down and after it is back: the
page says that live updates are paused, shows the reply by re-reading, and is live again once
Redis answers, without a reload and without restarting daphne."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from demo.seed import seed_orders
from tests.browser import log_in, say, wait_until_live
from tests.factories import make_user
from tests.live import LiveSite, start_site, stop_site
from tests.live import test_database_url as live_database_url
from tests.services import RedisServer, running_redis

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "alice-pass-123"
PAUSED = "Live updates paused — re-reading every 5 s."


@pytest.fixture
def site_with_redis(tmp_path: Path) -> Iterator[tuple[LiveSite, RedisServer]]:
    seed_orders()
    make_user(username="alice", password=PASSWORD)
    with running_redis(tmp_path / "redis") as redis:
        site = start_site(
            live_database_url(), tmp_path / "site.log", extra_env={"REDIS_URL": redis.url}
        )
        try:
            yield site, redis
        finally:
            stop_site(site)


def test_the_chat_says_live_updates_are_paused_and_re_reads_until_redis_is_back(
    site_with_redis: tuple[LiveSite, RedisServer], page: Any, screenshots: Path
) -> None:
    site, redis = site_with_redis
    log_in(page, site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    wait_until_live(page)
    page.evaluate("window.__sameDocument = true")
    notice = page.locator("[data-live-paused]")
    expect(notice).to_have_count(0)

    redis.stop()
    expect(notice).to_have_text(PAUSED)
    expect(page.locator("[data-live-status]")).to_have_text("Live updates paused")

    # Sent while nothing can be pushed: the reply appears when the page re-reads.
    say(page, "where is order 44")  # one of alice's own orders
    reply = page.locator(".msg-assistant .markdown").last
    expect(reply).to_contain_text("shipped", timeout=12_000)
    expect(notice).to_have_text(PAUSED)
    # caret="initial": hiding the caret would put a style attribute on the focused composer,
    # which the CSP then refuses when htmx settles the next composer swap.
    page.screenshot(path=str(screenshots / "chat-live-paused.png"), caret="initial")

    redis.start()
    expect(notice).to_have_count(0, timeout=12_000)
    expect(page.locator("[data-live-status]")).to_have_text("Live")

    # Live again: the next reply is pushed, not waited for.
    say(page, "where is order 7 again")
    expect(page.locator(".msg-assistant .markdown")).to_have_count(2, timeout=4_000)
    assert page.evaluate("window.__sameDocument === true")  # never reloaded
    assert "Traceback" not in site.log(), site.log()
