"""Small helpers for browser tests."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect


def log_in(page: Any, live_site: Any, username: str, password: str, then: str = "/") -> None:
    """Log in through the real login form, then open `then`."""
    page.goto(f"{live_site.url}/accounts/login/?next={then}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
