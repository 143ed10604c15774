"""The home page and the admin in a real Chromium, against a real daphne server; and the
harness's Content Security Policy watch, which fails any browser test the policy refuses
something in."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from conversations.models import SessionItem
from tests.factories import make_conversation, make_user

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


def test_the_admin_s_scripts_and_styles_work_under_the_policy(live_site: Any, page: Any) -> None:
    boss = make_user(username="boss", password="boss-pass-123", is_staff=True, is_superuser=True)
    conversation = make_conversation(owner=boss)
    SessionItem.objects.create(conversation=conversation, payload={"role": "user", "content": "hi"})
    page.goto(live_site.url + "/admin/login/?next=/admin/auth/user/")
    page.get_by_label("Username").fill("boss")
    page.get_by_label("Password").fill("boss-pass-123")
    page.get_by_role("button", name="Log in").click()
    # The change list loaded, its scripts run: a click before actions.js binds its toggle
    # ticks the toggle alone (seen on a busy machine).
    page.wait_for_url("**/admin/auth/user/")
    page.wait_for_load_state("load")

    # The change list's actions script: "select all" ticks every row.
    page.locator("#action-toggle").check()
    expect(page.locator("input.action-select").first).to_be_checked()
    expect(page.locator(".action-counter")).to_contain_text("1 of 1 selected")

    # The change form's widgets are built by scripts (the two-box permission picker).
    page.goto(f"{live_site.url}/admin/auth/user/{boss.pk}/change/")
    expect(page.locator("#id_user_permissions_from")).to_be_visible()

    # Our admin stylesheet: the session items' JSON wraps.
    page.goto(f"{live_site.url}/admin/conversations/conversation/{conversation.pk}/change/")
    payload = page.locator("pre.pretty-json").first
    expect(payload).to_contain_text('"content": "hi"')
    assert payload.evaluate("el => getComputedStyle(el).whiteSpace") == "pre-wrap"


def test_a_page_the_policy_refuses_something_in_is_reported(
    page: Any, csp_problems: list[str]
) -> None:
    """The watch itself: an inline style, an inline script and an eval under a strict policy
    are each reported, and so is a page without the policy; then the list is emptied, so
    this test passes."""
    html = (
        '<!doctype html><p style="color: red">styled</p>'
        '<script src="/script.js"></script><script>document.title = "inline ran"</script>'
    )
    policy = "default-src 'self'"

    def serve(route: Any) -> None:
        headers = {"Content-Security-Policy": policy}
        if route.request.url.endswith("/script.js"):
            route.fulfill(body='eval("1 + 1")', content_type="text/javascript", headers=headers)
        else:
            route.fulfill(body=html, content_type="text/html", headers=headers)

    page.route("http://csp-check.test/**", serve)
    page.goto("http://csp-check.test/")
    expect(page.get_by_text("styled")).to_be_visible()
    page.wait_for_function("document.readyState === 'complete'")
    assert page.title() != "inline ran"
    page.wait_for_timeout(200)  # the reports arrive asynchronously
    reported = "\n".join(csp_problems)
    assert "style-src-attr" in reported
    assert "script-src-elem" in reported
    assert "eval" in reported

    # A page of a local server (the site's, in every other test) without the header.
    page.route("http://127.0.0.1:9/**", lambda route: route.fulfill(body="<p>plain</p>"))
    page.goto("http://127.0.0.1:9/plain/")
    assert csp_problems[-1] == "no Content-Security-Policy header on http://127.0.0.1:9/plain/"
    csp_problems.clear()
