"""The reviewer's workbench (issue 15) in a real Chromium, against a real daphne server: a row
that explains its call, and a reviewer's own request that needs another reviewer."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalDecision, ApprovalStatus
from tests.factories import make_reviewer, make_user
from tests.test_browser_inbox import (
    PASSWORD,
    demo,  # noqa: F401  (fixture: orders, runs that pause)
    open_inbox,
    pause,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("demo"),
]


def test_a_row_explains_its_call_and_her_own_request_needs_another_reviewer(
    live_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    rita = make_reviewer("rita", PASSWORD)
    delivered = pause("cancel order 46", alice)
    own = pause("cancel order 999", rita)

    open_inbox(page, live_site, "rita")
    row = page.locator(f"#request-{delivered.pk}")
    expect(row).to_contain_text("Cancel an order that has not been delivered yet.")
    expect(row.locator(".risk")).to_have_text("risk: irreversible")
    arguments = row.get_by_label("Arguments")
    expect(arguments.locator("dt")).to_have_text(["Order Id"])
    expect(arguments.locator("dd")).to_have_text(["46"])
    warning = row.locator(".fact-warning")
    expect(warning).to_contain_text("has already been delivered, so it cannot be cancelled")
    expect(row.get_by_label("What the call would touch")).to_contain_text("Delivered")
    # The raw JSON is one click away.
    raw = row.locator("details.raw-arguments pre")
    expect(raw).to_be_hidden()
    row.get_by_text("Raw arguments (JSON)").click()
    expect(raw).to_be_visible()
    expect(raw).to_contain_text('"order_id": 46')
    expect(row.get_by_role("button", name="Approve", exact=True)).to_be_enabled()

    mine = page.locator(f"#request-{own.pk}")
    expect(mine.locator("[data-needs-another-reviewer]")).to_have_text("needs another reviewer")
    expect(mine.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    expect(mine.get_by_role("button", name="Reject", exact=True)).to_be_enabled()
    expect(mine.locator(".fact-warning")).to_contain_text("999: not in this user's account")
    page.screenshot(path="/tmp/r-workbench-inbox.png", full_page=True)

    # Her own request's page says so too; she may reject it, with a note for reviewers.
    mine.get_by_role("link", name="Open").click()
    decision = page.get_by_role("region", name="Decision")
    expect(decision).to_contain_text("needs another reviewer")
    expect(decision.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    expect(decision.get_by_role("button", name="Approve always (this run)")).to_be_disabled()
    page.get_by_label("Message to the agent").fill("Order 999 is not yours.")
    page.get_by_label("Internal note").fill("Testing my own account.")
    page.screenshot(path="/tmp/r-workbench-request.png", full_page=True)
    decision.get_by_role("button", name="Reject").click()
    expect(decision).to_contain_text("Rejected")
    expect(decision.locator(".decision-note")).to_have_text("Testing my own account.")
    decided = ApprovalDecision.objects.get(request=own)
    assert (decided.reviewer, decided.approved, decided.note) == (
        rita,
        False,
        "Testing my own account.",
    )
    own.refresh_from_db()
    assert own.status == ApprovalStatus.REJECTED
