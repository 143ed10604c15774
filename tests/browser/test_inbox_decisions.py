"""Deciding in the inbox, in a real Chromium against a real daphne server: a row that explains
its call, a reviewer's own request that needs another reviewer, deciding with the keyboard
alone, a new request announced in the live region, and an edit of a call's arguments before
approving it."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalDecision, ApprovalStatus, DecisionKind
from demo.models import Order
from engine.models import RunStatus
from tests.browser import (
    PASSWORD,
    looks,
    open_inbox,
    pause,
    wait_for_run,
)
from tests.factories import make_reviewer, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "submitted"),
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
    page.screenshot(path="/tmp/r-inbox-inbox.png", full_page=True)

    # Her own request's page says so too; she may reject it, with a note for reviewers.
    mine.get_by_role("link", name="Open").click()
    decision = page.get_by_role("region", name="Decision")
    expect(decision).to_contain_text("needs another reviewer")
    expect(decision.get_by_role("button", name="Approve", exact=True)).to_be_disabled()
    expect(decision.get_by_role("button", name="Approve always (this run)")).to_be_disabled()
    page.get_by_label("Message to the agent").fill("Order 999 is not yours.")
    page.get_by_label("Internal note").fill("Testing my own account.")
    page.screenshot(path="/tmp/r-inbox-request.png", full_page=True)
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


def test_keyboard_only_a_reviewer_approves_three_requests_in_a_row_and_rejects_one(
    live_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    requests = [pause(f"cancel order {number}", alice) for number in (42, 44, 23)]
    last = pause("cancel order 58", make_user(username="hugo"))

    open_inbox(page, live_site, "rita")
    # The skip link is the first stop of the keyboard, and leads to the requests.
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to the requests")
    expect(skip).to_be_focused()
    expect(skip).to_be_visible()

    rows = page.locator("#pending-rows > li.row-pending")
    expect(rows).to_have_count(4)
    page.keyboard.press("Enter")
    expect(page.locator("#pending-rows")).to_be_focused()
    page.keyboard.press("j")  # focus moves into the list: the newest first
    expect(rows.first.locator("[data-row-focus]")).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("k")
    expect(page.locator(f"#request-{last.pk} [data-row-focus]")).to_be_focused()
    page.keyboard.press("j")  # hugo's is the newest; alice's three follow, newest first
    for request in reversed(requests):
        focused = page.locator(f"#request-{request.pk} [data-row-focus]")
        expect(focused).to_be_focused()
        page.keyboard.press("a")
        expect(page.locator(f"#request-{request.pk}")).to_contain_text("by rita")
    page.screenshot(path="/tmp/r-inbox-keyboard.png", full_page=True)

    # After the last of alice's, focus went back to the one left: reject it with a message.
    expect(page.locator(f"#request-{last.pk} [data-row-focus]")).to_be_focused()
    page.keyboard.press("r")
    message = page.locator(f"#row-message-{last.pk}")
    expect(message).to_be_focused()
    page.keyboard.type("Order 58 is not cancellable today.")
    page.screenshot(path="/tmp/r-inbox-reject.png", full_page=True)
    page.keyboard.press("Control+Enter")
    expect(page.locator(f"#request-{last.pk}")).to_contain_text("Rejected")

    for request in requests:
        request.refresh_from_db()
        assert request.status == ApprovalStatus.APPROVED, request.pk
    last.refresh_from_db()
    assert last.status == ApprovalStatus.REJECTED
    assert ApprovalDecision.objects.get(request=last).message == (
        "Order 58 is not cancellable today."
    )


def test_a_new_request_is_announced_in_the_live_region(live_site: Any, page: Any) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    pause("cancel order 42", alice)
    open_inbox(page, live_site, "rita")
    announcer = page.locator("[aria-live='polite'][data-announcer]")
    expect(announcer).to_have_text("")  # what was there already is not news

    new = pause("cancel order 44", alice)
    # A reconnect's re-read (live.js) brings it, as a push would.
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    expect(page.locator(f"#request-{new.pk}")).to_be_visible()
    expect(announcer).to_have_text("New request: cancel_order, asked by alice.")


def cancellation_in_ritas_inbox(page: Any, live_site: Any) -> tuple[Any, Any]:
    """alice's "cancel order 42", paused; rita's open inbox on `page`; the request and its
    row."""
    request = pause("cancel order 42", make_user(username="alice"))
    make_reviewer("rita", PASSWORD)
    open_inbox(page, live_site, "rita")
    return request, page.locator(f"#request-{request.pk}")


def test_a_reviewer_edits_the_arguments_then_approves_and_the_edited_call_runs(
    live_site: Any, page: Any
) -> None:
    request, row = cancellation_in_ritas_inbox(page, live_site)
    row.get_by_role("link", name="Edit, then approve").click()
    # The form comes from the tool's schema, prefilled, opened by the link.
    order = page.get_by_label("Order Id")
    expect(order).to_be_visible()
    expect(order).to_have_value("42")
    # A number's box looks like the page's other boxes, as wide as its field.
    field, message = looks(order), looks(page.get_by_label("Message to the agent"))
    assert field["radius"] == message["radius"] == "8px", (field, message)
    assert field["padding"] == message["padding"] and field["height"] >= 36, field
    assert field["width"] == looks(page.locator(".edit-field").first)["width"]
    order.fill("44")
    page.screenshot(path="/tmp/inbox-shots/request-edit-form.png", full_page=True)
    page.get_by_role("button", name="Approve with these arguments").click()

    decision = page.get_by_role("region", name="Decision")
    expect(decision).to_contain_text("Approved")
    expect(decision).to_contain_text("Arguments edited by rita")
    expect(decision.locator("[data-edited-call]")).to_have_text("cancel_order(order_id=44)")
    decided = ApprovalDecision.objects.get(request=request)
    assert (decided.kind, decided.edited_arguments) == (DecisionKind.EDITED, {"order_id": 44})

    # The server resumes the run: the edited call ran, and only it.
    wait_for_run(request.run_id, RunStatus.COMPLETED)
    statuses = dict(Order.objects.filter(number__in=[42, 44]).values_list("number", "status"))
    assert statuses == {42: Order.Status.PLACED, 44: Order.Status.CANCELLED}


def test_after_an_edit_the_open_request_pages_show_the_call_as_it_ran(
    live_site: Any, page: Any, browser: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    make_reviewer("bob", PASSWORD)
    request = pause("cancel order 42", alice)
    # bob has the request's page open too: what changes on it is pushed.
    bobs = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    bobs.set_default_timeout(10_000)
    open_inbox(bobs, live_site, "bob", then=f"/inbox/{request.pk}/")
    open_inbox(page, live_site, "rita", then=f"/inbox/{request.pk}/")
    for each in (page, bobs):
        each.evaluate("window.notReloaded = true")

    page.get_by_text("Edit the arguments, then approve").click()
    page.get_by_label("Order Id").fill("44")
    page.get_by_role("button", name="Approve with these arguments").click()

    for each in (page, bobs):
        decision = each.get_by_role("region", name="Decision")
        expect(decision).to_contain_text("Arguments edited by rita")
        # The card says what ran, then what the model asked.
        card = each.get_by_role("region", name="Request")
        ran = card.get_by_label("It ran with")
        expect(ran.locator("dt")).to_have_text(["Order Id The order number to cancel."])
        expect(ran.locator("dd")).to_have_text(["44"])
        expect(card.locator("h3")).to_have_text(
            [
                "It ran with arguments edited by rita",
                "The model asked not run as asked",
                "What the call would touch",
            ]
        )
        # The transcript's line of the call is the call that ran.
        current = each.locator(".line-call.is-current")
        expect(current.locator(".who-label")).to_have_text(
            "approved by rita, with edited arguments"
        )
        expect(current.locator("code")).to_have_text("cancel_order(order_id=44)")
        assert each.evaluate("window.notReloaded") is True
        # "The model asked" and "It ran with" start their calls at the same place.
        calls = decision.locator(".edit-record dd")
        expect(calls).to_have_count(2)
        lefts = [box["x"] for box in (calls.nth(0).bounding_box(), calls.nth(1).bounding_box())]
        assert lefts[0] == lefts[1], lefts
    page.screenshot(path="/tmp/inbox-shots/request-edited.png", full_page=True)
    bobs.screenshot(path="/tmp/inbox-shots/request-edited-phone.png", full_page=True)

    # A reload shows the same: the run resumed with the edited call.
    wait_for_run(request.run_id, RunStatus.COMPLETED)
    page.reload()
    expect(page.get_by_role("region", name="Request").get_by_label("It ran with")).to_contain_text(
        "44"
    )
    expect(page.locator(".line-call.is-current code")).to_have_text("cancel_order(order_id=44)")


def test_an_empty_answer_as_the_tool_keeps_its_box_open_with_the_error_under_it(
    live_site: Any, page: Any
) -> None:
    request, row = cancellation_in_ritas_inbox(page, live_site)
    row.get_by_text("Respond as the tool").click()
    output = row.get_by_label("The tool's output")
    output.fill("   ")  # nothing to answer with
    row.get_by_role("button", name="Send as the tool's output").click()

    # The box is still open, with what she typed, and says what is wrong under it.
    expect(output).to_have_attribute("aria-invalid", "true")
    expect(output).to_be_visible()
    expect(output).to_have_value("   ")
    expect(output).to_be_focused()
    error = page.locator(f"#{output.get_attribute('aria-describedby')}")
    expect(error).to_have_text(
        "Write the result the agent should read as the tool's output; it is empty."
    )
    expect(error).to_be_visible()
    # Right under the box, and nowhere else.
    box, under = output.bounding_box(), error.bounding_box()
    assert 0 <= under["y"] - (box["y"] + box["height"]) < 24, (box, under)
    expect(row.locator(".row-notice")).to_have_count(0)
    page.screenshot(path="/tmp/inbox-shots/inbox-respond-error.png")
    assert request.__class__.objects.get(pk=request.pk).is_pending

    output.fill("Order 42 was cancelled by hand.")
    row.get_by_role("button", name="Send as the tool's output").click()
    expect(row).to_contain_text("Answered")
    decided = ApprovalDecision.objects.get(request=request)
    assert (decided.kind, decided.message) == (
        DecisionKind.RESPONDED,
        "Order 42 was cancelled by hand.",
    )


def test_a_rows_reject_asks_for_an_optional_message_and_note_first(
    live_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("rita", PASSWORD)
    first = pause("cancel order 42", alice)
    second = pause("cancel order 44", alice)

    open_inbox(page, live_site, "rita")
    row = page.locator(f"#request-{first.pk}")
    reject = row.get_by_role("button", name="Reject", exact=True)
    expect(reject).to_have_attribute("aria-expanded", "false")
    reject.click()
    # Nothing is decided yet: a small form opens, its message focused.
    expect(reject).to_have_attribute("aria-expanded", "true")
    message = row.get_by_label("Message to the agent")
    expect(message).to_be_focused()
    expect(row.get_by_label("Internal note")).to_be_visible()
    assert first.__class__.objects.get(pk=first.pk).is_pending
    page.screenshot(path="/tmp/inbox-shots/inbox-reject-box.png")

    # Cancel (or Escape) closes it and decides nothing; what was typed stays.
    message.fill("Order 42 already shipped; offer a return.")
    row.get_by_role("button", name="Cancel").click()
    expect(message).to_be_hidden()
    expect(reject).to_be_focused()
    expect(reject).to_have_attribute("aria-expanded", "false")
    page.keyboard.press("Enter")  # the keyboard opens it again
    expect(message).to_be_focused()
    expect(message).to_have_value("Order 42 already shipped; offer a return.")
    page.keyboard.press("Escape")
    expect(message).to_be_hidden()
    expect(reject).to_be_focused()
    assert first.__class__.objects.get(pk=first.pk).is_pending

    reject.click()
    row.get_by_label("Internal note").fill("Checked with the warehouse.")
    row.get_by_role("button", name="Reject the call").click()
    expect(row).to_contain_text("Rejected")
    decided = ApprovalDecision.objects.get(request=first)
    assert (decided.approved, decided.message, decided.note) == (
        False,
        "Order 42 already shipped; offer a return.",
        "Checked with the warehouse.",
    )

    # A quick reject with no message is one more click (or Ctrl+Enter in the box).
    other = page.locator(f"#request-{second.pk}")
    other.get_by_role("button", name="Reject", exact=True).click()
    expect(other.get_by_label("Message to the agent")).to_be_focused()
    page.keyboard.press("Control+Enter")
    expect(other).to_contain_text("Rejected")
    decided = ApprovalDecision.objects.get(request=second)
    assert (decided.approved, decided.message, decided.note) == (False, "", "")


def test_on_a_phone_an_arguments_long_hint_leaves_its_value_room(
    live_site: Any, browser: Any
) -> None:
    make_reviewer("rita", PASSWORD)
    request = pause("refund 80 on order 7", make_user(username="chen"))
    page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
    page.set_default_timeout(10_000)
    open_inbox(page, live_site, "rita", then=f"/inbox/{request.pk}/")

    arguments = page.get_by_role("region", name="Request").get_by_label("Arguments")
    expect(arguments.locator("dd")).to_have_text(["7", "$80.00"])
    box = arguments.bounding_box()
    lines = "(e) => { const r = document.createRange(); r.selectNodeContents(e); "
    lines += "return r.getClientRects().length; }"
    for value in arguments.locator("dd").all():
        # On one line, with room to spare: not a column of single characters.
        shown = value.bounding_box()
        assert shown["width"] >= box["width"] * 0.4, (shown, box)
        assert value.evaluate(lines) == 1
