"""Bulk decisions in the inbox, in a real Chromium, against a real daphne server: the
confirmation lists exactly the selected rows, and cancelling it executes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalDecision, ApprovalRequest
from tests.browser import (
    PASSWORD,
    open_inbox,
    pause,
)
from tests.factories import make_reviewer, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "submitted"),
]


def test_bulk_approve_lists_exactly_the_selected_rows_and_cancelling_executes_nothing(
    live_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    first, second, third = (
        pause(text, alice) for text in ("cancel order 42", "cancel order 46", "cancel order 7")
    )

    open_inbox(page, live_site, "rita")
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(3)
    for request in (first, second):
        page.get_by_label(f"Select cancel_order request #{request.pk}").check()
    expect(page.locator("[data-selected-count]")).to_have_text("2 selected")
    page.get_by_role("button", name="Approve selected").click()

    dialog = page.get_by_role("dialog", name="Approve 2 requests?")
    expect(dialog).to_be_visible()
    listed = dialog.locator(".confirm-row")
    expect(listed).to_have_count(2)
    assert sorted(listed.evaluate_all("rows => rows.map(row => row.id)")) == sorted(
        f"confirm-request-{request.pk}" for request in (first, second)
    )
    # What will run: the tool, its labelled arguments, its risk and its warnings.
    row = dialog.locator(f"#confirm-request-{second.pk}")
    expect(row.locator(".tool")).to_have_text("cancel_order")
    expect(row.get_by_label("Arguments").locator("dd")).to_have_text(["46"])
    expect(row.locator(".risk")).to_have_text("risk: irreversible")
    expect(row.locator(".fact-warning")).to_contain_text("already been delivered")
    expect(dialog.get_by_label("Risks")).to_have_text("2 × risk: irreversible")
    page.screenshot(path="/tmp/b-bulk-confirm.png")

    # Cancelling executes nothing, whether by the button or by Escape; keys reach no row.
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Approve selected").click()
    expect(dialog).to_be_visible()
    page.keyboard.press("a")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(3)
    assert ApprovalDecision.objects.count() == 0
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {"pending"}

    page.get_by_role("button", name="Approve selected").click()
    dialog.get_by_role("button", name="Approve 2 requests").click()

    expect(page.locator("#flash")).to_contain_text("Approved 2 requests.")
    expect(dialog).to_be_hidden()
    expect(page.locator("#pending-rows > li.row-decided")).to_have_count(2)
    expect(page.locator(f"#request-{third.pk}")).to_have_class("row row-pending")
    assert sorted(ApprovalDecision.objects.values_list("request_id", flat=True)) == sorted(
        [first.pk, second.pk]
    )
    page.screenshot(path="/tmp/b-bulk-done.png", full_page=True)


def test_bulk_reject_of_all_shown_rows_carries_a_message(live_site: Any, page: Any) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    requests = [pause(text, alice) for text in ("cancel order 42", "cancel order 23")]

    open_inbox(page, live_site, "rita", then="/inbox/?tool=cancel_order")
    page.get_by_label("Select all").check()
    expect(page.locator("[data-select-all-label]")).to_have_text("Select all 2 shown")
    page.get_by_role("button", name="Reject selected").click()

    dialog = page.get_by_role("dialog", name="Reject 2 requests?")
    expect(dialog.locator(".confirm-row")).to_have_count(2)
    expect(dialog.get_by_label("Message to the agent")).to_be_focused()
    dialog.get_by_label("Message to the agent").fill("We do not cancel orders today.")
    dialog.get_by_label("Internal note").fill("Warehouse audit.")
    page.screenshot(path="/tmp/b-bulk-reject.png")
    dialog.get_by_role("button", name="Reject 2 requests").click()

    expect(page.locator("#flash")).to_contain_text("Rejected 2 requests.")
    decisions = ApprovalDecision.objects.filter(request__in=requests)
    assert {(d.approved, d.message, d.note) for d in decisions} == {
        (False, "We do not cancel orders today.", "Warehouse audit.")
    }
    assert decisions.count() == 2


def test_without_javascript_the_confirmation_is_a_page_of_its_own(
    live_site: Any, browser: Any
) -> None:
    alice = make_user(username="alice")
    rita = make_reviewer("rita", PASSWORD)
    first, second = (pause(text, alice) for text in ("cancel order 42", "cancel order 46"))
    own = pause("cancel order 999", rita)
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(f"{live_site.url}/accounts/login/?next=/inbox/")
    page.get_by_label("Username").fill("rita")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.get_by_label(f"Select cancel_order request #{second.pk}").check()
    page.get_by_label(f"Select cancel_order request #{own.pk}").check()
    page.get_by_role("button", name="Approve selected").click()
    expect(page.get_by_role("heading", name="Approve 1 request?")).to_be_visible()
    expect(page.locator(".confirm-row")).to_have_count(1)
    expect(page.locator(f"#confirm-request-{second.pk}")).to_contain_text("already been delivered")
    # Her own call is not approved, and the confirmation says so.
    expect(page.locator(".bulk-summary")).to_contain_text(
        "1 of the 2 selected will not be approved"
    )
    expect(page.locator(f"#set-aside-{own.pk}")).to_contain_text("another reviewer must approve")
    page.screenshot(path="/tmp/b-bulk-nojs.png", full_page=True)
    page.get_by_role("link", name="Cancel", exact=True).click()
    expect(page.get_by_role("heading", name="Inbox")).to_be_visible()
    assert ApprovalDecision.objects.count() == 0

    page.get_by_label(f"Select cancel_order request #{second.pk}").check()
    page.get_by_role("button", name="Approve selected").click()
    page.get_by_role("button", name="Approve 1 request").click()
    expect(page.locator("#flash")).to_contain_text("Approved 1 request.")
    assert list(ApprovalDecision.objects.values_list("request_id", flat=True)) == [second.pk]
    assert ApprovalRequest.objects.get(pk=first.pk).is_pending
    assert ApprovalRequest.objects.get(pk=own.pk).is_pending
    context.close()
