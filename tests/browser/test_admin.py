"""The admin's bulk decisions on approval requests (`approvals/admin.py`), in a real Chromium
against a real daphne server: the action asks first (the inbox's confirmation), and confirming
comes back to the change list with the outcome."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalDecision, ApprovalStatus
from tests.browser import pause
from tests.factories import PASSWORD, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "submitted"),
]

REQUESTS = "/admin/approvals/approvalrequest/"


def open_changelist(page: Any, live_site: Any) -> None:
    make_user(username="boss", is_staff=True, is_superuser=True)
    page.goto(f"{live_site.url}/admin/login/?next={REQUESTS}")
    page.get_by_label("Username").fill("boss")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"**{REQUESTS}")
    # A box ticked before the change list's actions script binds is not counted.
    page.wait_for_load_state("load")


@pytest.mark.parametrize(
    ("verb", "done", "status"),
    [
        ("Approve", "Approved", ApprovalStatus.APPROVED),
        ("Reject", "Rejected", ApprovalStatus.REJECTED),
    ],
)
def test_a_confirmed_bulk_action_comes_back_to_the_change_list_with_its_outcome(
    live_site: Any, page: Any, verb: str, done: str, status: ApprovalStatus
) -> None:
    request = pause("cancel order 42", make_user(username="alice"))
    open_changelist(page, live_site)

    row = page.locator("#result_list tbody tr").filter(has_text="cancel_order(order_id=42)")
    row.locator("input.action-select").check()
    page.locator("select[name=action]").select_option(label=f"{verb} selected")
    # The action's "Run" button (a column's sort link has that name too).
    page.locator("button[name=index]").click()

    confirmation = page.get_by_role("heading", name=f"{verb} 1 request?")
    expect(confirmation).to_be_visible()
    page.get_by_role("button", name=f"{verb} 1 request").click()

    expect(page.locator("ul.messagelist li").filter(has_text=f"{done} 1 request.")).to_be_visible()
    expect(page).to_have_url(f"{live_site.url}{REQUESTS}")
    expect(row.locator("td.field-status")).to_have_text(status.label)
    # Nothing of the confirmation is left to press again.
    expect(page.get_by_role("button", name=f"{verb} 1 request")).to_have_count(0)
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    request.refresh_from_db()
    assert request.status == status
