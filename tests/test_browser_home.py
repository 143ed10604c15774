"""The home page and the admin login in a real Chromium, against a real daphne server."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_visitor_sees_the_demo_notice_and_can_log_in(live_site: Any, page: Any) -> None:
    make_user(username="alice", password="alice-pass-123")

    page.goto(live_site.url + "/")
    expect(page.get_by_test_id("offline-demo-notice")).to_be_visible()
    # The stylesheet was served and applied (a calm, non-default background).
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(247, 247, 245)"

    page.get_by_role("link", name="Log in").first.click()
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("alice-pass-123")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(live_site.url + "/chats/")
    expect(page.get_by_role("button", name="Log out")).to_be_visible()


def test_an_admin_logs_into_django_admin(live_site: Any, page: Any) -> None:
    make_user(username="boss", password="boss-pass-123", is_staff=True, is_superuser=True)

    page.goto(live_site.url + "/admin/")
    page.get_by_label("Username").fill("boss")
    page.get_by_label("Password").fill("boss-pass-123")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("link", name="Conversations").first).to_be_visible()
    expect(page.get_by_test_id("offline-demo-notice")).to_be_visible()
