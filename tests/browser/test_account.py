"""The account's pages in a real Chromium: API tokens (everyone's) and email settings (a
reviewer's) share one tab bar and the site's styles (its buttons, inputs and cards), at
desktop and phone width."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser import PASSWORD, log_in, looks
from tests.factories import make_reviewer, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ACCENT = "rgb(47, 111, 94)"  # site.css --accent


def no_sideways_scroll(page: Any, width: int) -> None:
    scrolled = page.evaluate("document.documentElement.scrollWidth")
    assert scrolled <= width, f"the page scrolls sideways ({scrolled}px in {width}px)"


@pytest.mark.parametrize(("width", "height", "name"), [(1366, 768, "desktop"), (390, 844, "phone")])
def test_a_reviewers_account_pages_share_a_tab_bar_and_the_sites_styles(
    live_site: Any, browser: Any, width: int, height: int, name: str
) -> None:
    make_reviewer("rita", PASSWORD)
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(10_000)

    log_in(page, live_site, "rita", PASSWORD, then="/account/tokens/")
    page.get_by_label("Name").fill("laptop")
    days = page.get_by_label("Expires in (days)")
    days.fill("30")
    create = page.get_by_role("button", name="Create token")
    button, field = looks(create), looks(days)
    assert (button["background"], button["radius"]) == (ACCENT, "8px"), button
    assert button["padding"] >= 8 and button["height"] >= 34, button
    assert field["radius"] == "8px" and field["padding"] >= 8 and field["height"] >= 36, field
    assert looks(page.get_by_label("Name"))["height"] == field["height"]  # inputs alike

    expect(page.get_by_role("heading", level=1)).to_have_text("Your account")
    tabs = page.get_by_role("navigation", name="Your account")
    expect(tabs.get_by_role("link")).to_have_text(["API tokens", "Email settings"])
    expect(tabs.get_by_role("link", name="API tokens")).to_have_attribute("aria-current", "page")
    create.click()
    secret = page.get_by_test_id("new-token")
    expect(secret).to_be_visible()
    expect(page.locator("#pending-count")).to_have_count(0)  # not the inbox
    row = page.get_by_role("row", name="laptop")
    expect(row).to_contain_text("Read")
    expect(row.get_by_role("button", name="Revoke")).to_be_visible()
    no_sideways_scroll(page, width)
    page.screenshot(path=f"/tmp/inbox-shots/account-tokens-{name}.png", full_page=True)

    tabs.get_by_role("link", name="Email settings").click()
    expect(tabs.get_by_role("link", name="Email settings")).to_have_attribute(
        "aria-current", "page"
    )
    expect(page.get_by_role("heading", level=2)).to_have_text("Email notifications")
    page.get_by_label("A digest").check()
    page.get_by_label("Agents").fill("Support desk")
    save = page.get_by_role("button", name="Save")
    assert looks(save)["background"] == ACCENT and looks(save)["radius"] == "8px"
    no_sideways_scroll(page, width)
    save.click()
    expect(page.get_by_text("Saved your email settings.")).to_be_visible()
    expect(page.get_by_label("A digest")).to_be_checked()
    page.wait_for_load_state("load")
    page.screenshot(path=f"/tmp/inbox-shots/account-email-{name}.png", full_page=True)


def test_an_end_users_account_page_has_her_tokens_alone(live_site: Any, page: Any) -> None:
    make_user(username="alice", password=PASSWORD)
    log_in(page, live_site, "alice", PASSWORD, then="/account/tokens/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Your account")
    expect(page.get_by_role("link", name="Email settings")).to_have_count(0)
    expect(page.get_by_role("button", name="Create token")).to_be_visible()
