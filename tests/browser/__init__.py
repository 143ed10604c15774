"""Small helpers for the browser tests of this folder."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections
from playwright.sync_api import expect


def log_in(page: Any, live_site: Any, username: str, password: str, then: str = "/") -> None:
    """Log in through the real login form, then open `then`; return once that page's load
    event came (its stylesheets are in: a layout read before, under load, measured the page
    unstyled)."""
    page.goto(f"{live_site.url}/accounts/login/?next={then}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    page.wait_for_load_state("load")


def in_thread[T](work: Callable[[], T]) -> T:
    """Run `work` in a thread of its own: Playwright keeps an event loop running in the
    test's thread, where neither `asyncio.run`, `async_to_sync` nor the SDK's trace processor
    may run. The thread's database connections are closed after it."""

    def wrapped() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(wrapped).result(timeout=30)
