"""The reviewers' policy pages in a real Chromium, against the session's
daphne server: a reviewer who may manage the rules writes "approve refunds ≤ 20" in the real
form; a refund of 15 then never reaches her inbox, while a refund of 80 does, saying that no
policy applies. Pauses are made in this process as in tests/browser/test_inbox.py."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from playwright.sync_api import expect

from approvals.models import ApprovalDecision, ApprovalPolicy, ApprovalStatus
from demo.models import Order
from engine.permissions import MANAGE_POLICIES_PERMISSION
from tests.browser import (
    PASSWORD,
    log_in,
    open_inbox,
    pause,
)
from tests.factories import grant, make_reviewer, make_user

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "submitted", "pinned_policy_content_type"),
]

# Where the pictures of the pages go, to be looked at (not part of the work tree).
SHOTS = Path("/work/p-shots")
RULE = "approve refunds ≤ 20"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 860}


# The content type id the session's server remembers for ApprovalPolicy (see below).
PINNED_CONTENT_TYPE = 990_001


@pytest.fixture
def pinned_policy_content_type() -> None:
    """ApprovalPolicy's content type under one id in every test. Each change on the policy
    pages writes an admin LogEntry, whose content type the server process takes from
    Django's ContentType cache; but the server outlives the tests, and the flush after each
    test re-creates the content types under new ids, so a second test's entry would name a
    content type that is gone (FOREIGN KEY constraint failed). The permissions follow it, in
    the same transaction (the foreign keys are checked at commit)."""
    with transaction.atomic():
        current = ContentType.objects.get(app_label="approvals", model="approvalpolicy")
        if current.pk == PINNED_CONTENT_TYPE:
            return
        ContentType.objects.filter(pk=current.pk).update(id=PINNED_CONTENT_TYPE)
        Permission.objects.filter(content_type_id=current.pk).update(
            content_type_id=PINNED_CONTENT_TYPE
        )
    ContentType.objects.clear_cache()


def shoot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_a_rule_written_in_the_page_approves_a_small_refund_and_a_large_one_reaches_the_inbox(
    live_site: Any, page: Any
) -> None:
    alice = make_user(username="alice")
    grant(make_reviewer("rita", PASSWORD), MANAGE_POLICIES_PERMISSION)
    # Alice's order 42 ($120) was refunded $40 already: any refund above $10 asks a reviewer.
    Order.objects.filter(number=42).update(refunded_amount=Decimal("40"))

    open_inbox(page, live_site, "rita")
    page.get_by_role("navigation", name="Inbox").get_by_role("link", name="Policies").click()
    expect(page.get_by_text("No rules yet")).to_be_visible()
    page.get_by_role("link", name="New rule").first.click()

    page.get_by_label("Name").fill(RULE)
    page.locator("#id_tool_name").fill("issue_refund")
    page.get_by_label("Action").select_option("approve")
    rows = page.locator("[data-condition-row]")
    expect(rows).to_have_count(2)  # blank rows, for a page without JavaScript too
    page.get_by_role("button", name="Add a condition").click()
    expect(rows).to_have_count(3)
    expect(page.locator("#id_conditions-2-argument")).to_be_focused()
    page.locator("#id_conditions-0-argument").fill("amount")
    page.locator("#id_conditions-0-operator").select_option("<=")
    page.locator("#id_conditions-0-value").fill("20")
    page.get_by_label("Description").fill("Small refunds need nobody.")
    shoot(page, "policy-new-desktop")
    page.get_by_role("button", name="Create rule").click()

    policy = ApprovalPolicy.objects.get()
    row = page.locator(f"#policy-{policy.pk}")
    expect(page.locator(".flash-success")).to_contain_text(f"Rule “{RULE}” created")
    expect(row).to_contain_text("amount is at most 20")
    expect(row).to_contain_text("issue_refund")
    expect(row.locator("[data-policy-state]")).to_have_text("On")
    assert [(c.argument, c.operator, c.value) for c in policy.conditions.all()] == [
        ("amount", "<=", "20")
    ]
    assert policy.updated_by is not None and policy.updated_by.username == "rita"

    # Her inbox is open when the two refunds pause.
    page.get_by_role("navigation", name="Inbox").get_by_role("link", name="Pending").click()
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.get_by_text("All caught up.")).to_be_visible()
    small = pause("refund 15 on order 42", alice)
    large = pause("refund 80 on order 42", alice)
    assert small.status == ApprovalStatus.APPROVED
    decision = ApprovalDecision.objects.get(request=small)
    assert (decision.reviewer, decision.policy_name) == (None, RULE)

    # A reconnect's re-read (live.js) brings what is pending, as a push would.
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    large_row = page.locator(f"#request-{large.pk}")
    expect(large_row).to_be_visible()
    expect(large_row.locator("[data-policy]")).to_contain_text("No policy applies")
    expect(page.locator(f"#request-{small.pk}")).to_have_count(0)
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(1)
    shoot(page, "inbox-with-policy-line")

    # The history says who decided the small one: the rule, by name.
    page.get_by_role("link", name="History").click()
    expect(page.locator(f"#decision-row-{decision.pk} [data-policy-decided]")).to_have_text(
        f"policy {RULE}"
    )

    # The list and the edit page, on a desktop and on a phone.
    page.get_by_role("link", name="Policies").click()
    expect(row).to_contain_text("1 decision")
    shoot(page, "policies-desktop")
    row.get_by_role("link", name=f"Edit “{RULE}”").click()
    expect(page.get_by_label("Name")).to_have_value(RULE)
    shoot(page, "policy-edit-desktop")
    page.set_viewport_size(PHONE)
    shoot(page, "policy-edit-phone")
    page.get_by_role("link", name="← Policies").click()
    shoot(page, "policies-phone")
    page.set_viewport_size(DESKTOP)

    # Off with one click; the list says so.
    row.get_by_role("button", name=f"Turn off “{RULE}”").click()
    expect(row.locator("[data-policy-state]")).to_have_text("Off")
    policy.refresh_from_db()
    assert not policy.enabled


def test_without_javascript_the_form_offers_blank_condition_rows(
    live_site: Any, browser: Any
) -> None:
    grant(make_reviewer("rita", PASSWORD), MANAGE_POLICIES_PERMISSION)
    context = browser.new_context(viewport=DESKTOP, java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(10_000)
    log_in(page, live_site, "rita", PASSWORD, then="/inbox/policies/new/")
    expect(page.locator("[data-condition-row]")).to_have_count(2)
    expect(page.get_by_role("button", name="Add a condition")).to_be_hidden()
    expect(page.get_by_text("Need more conditions?")).to_be_visible()
    page.get_by_label("Name").fill("No refunds above 100")
    page.locator("#id_tool_name").fill("issue_refund")
    page.get_by_label("Action").select_option("reject")
    page.get_by_label("Message to the agent").fill("Refunds above $100 go through finance.")
    page.locator("#id_conditions-1-argument").fill("amount")
    page.locator("#id_conditions-1-operator").select_option(">")
    page.locator("#id_conditions-1-value").fill("many")
    page.get_by_role("button", name="Create rule").click()
    # Not valid: the input is all still there, the error beside its field.
    expect(page.locator("#id_conditions-1-value")).to_have_value("many")
    expect(page.get_by_label("Message to the agent")).to_have_value(
        "Refunds above $100 go through finance."
    )
    expect(page.locator(".condition-value .field-error")).to_contain_text("write a number")
    page.locator("#id_conditions-1-value").fill("100")
    page.get_by_role("button", name="Create rule").click()
    expect(page.locator(".flash-success")).to_contain_text("Rule “No refunds above 100” created")
    policy = ApprovalPolicy.objects.get()
    assert [(c.argument, c.operator, c.value) for c in policy.conditions.all()] == [
        ("amount", ">", "100")
    ]
    context.close()


# The form's refusal of a name no agent has, and its new box, looked at on both widths.
FORM_SHOTS = Path("/tmp/policy-shots")


def test_a_tool_no_agent_has_is_refused_naming_the_closest_and_mcp_tools_are_suggested(
    live_site: Any, page: Any
) -> None:
    grant(make_reviewer("rita", PASSWORD), MANAGE_POLICIES_PERMISSION)
    log_in(page, live_site, "rita", PASSWORD, then="/inbox/policies/new/")
    # Every agent and every tool, the warehouse's MCP tools too, before any request exists.
    for tool in ("issue_refund", "research", "stock_level", "restock"):
        expect(page.locator(f'#known-tools option[value="{tool}"]')).to_have_count(1)
    for agent in ("Support desk", "Billing", "Researcher", "Warehouse"):
        expect(page.locator(f'#known-agents option[value="{agent}"]')).to_have_count(1)
    # A new approving rule approves only what the facts do not warn about, unless unticked;
    # a rule that rejects or asks has no such box.
    warnings = page.get_by_label("Approve only when the facts show no warnings")
    expect(warnings).to_be_checked()
    page.get_by_label("Action").select_option("reject")
    expect(warnings).to_be_hidden()
    page.get_by_label("Action").select_option("approve")
    expect(warnings).to_be_visible()

    page.get_by_label("Name").fill("Refunds up to $60 go through")
    page.locator("#id_tool_name").fill("issue_refunds")
    page.locator("#id_conditions-0-argument").fill("amount")
    page.locator("#id_conditions-0-operator").select_option("<=")
    page.locator("#id_conditions-0-value").fill("60")
    page.get_by_role("button", name="Create rule").click()

    error = page.locator("#id_tool_name_error")
    expect(error).to_contain_text("No registered agent has a tool called “issue_refunds”")
    expect(error).to_contain_text("Did you mean issue_refund?")
    anyway = page.get_by_label("Save anyway (the agent or tool may come later)")
    expect(anyway).to_be_visible()
    expect(anyway).not_to_be_checked()
    expect(warnings).to_be_checked()
    assert not ApprovalPolicy.objects.exists()
    FORM_SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(FORM_SHOTS / "policy-error-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(FORM_SHOTS / "policy-error-phone.png"), full_page=True)
    # What a phone shows at once: the refusal with its box, then the facts' box.
    for name, target in (("error", error), ("warnings", warnings)):
        target.evaluate("element => element.scrollIntoView({block: 'center'})")
        page.screenshot(path=str(FORM_SHOTS / f"policy-{name}-phone-screen.png"))
    page.set_viewport_size(DESKTOP)

    # The suggestion taken: saved, and the list says it needs no warnings.
    page.locator("#id_tool_name").fill("issue_refund")
    page.get_by_role("button", name="Create rule").click()
    expect(page.locator(".flash-success")).to_contain_text("created")
    policy = ApprovalPolicy.objects.get()
    assert (policy.tool_name, policy.requires_no_warnings) == ("issue_refund", True)
    row = page.locator(f"#policy-{policy.pk}")
    expect(row.locator("[data-policy-warnings]")).to_contain_text("only with no warnings")

    # A tool that comes later: refused, then saved once confirmed; the list says it matches
    # no call yet.
    page.get_by_role("link", name="New rule").first.click()
    page.get_by_label("Name").fill("Ask before gift cards")
    page.locator("#id_tool_name").fill("issue_gift_card")
    page.get_by_label("Action").select_option("ask")
    page.get_by_role("button", name="Create rule").click()
    expect(page.locator("#id_tool_name_error")).to_contain_text("“issue_gift_card”")
    page.get_by_label("Save anyway (the agent or tool may come later)").check()
    page.get_by_role("button", name="Create rule").click()
    expect(page.locator(".flash-warning")).to_contain_text(
        "saved although no registered agent has a tool called “issue_gift_card”"
    )
    later = ApprovalPolicy.objects.get(tool_name="issue_gift_card")
    expect(page.locator(f"#policy-{later.pk} [data-policy-unknown]")).to_contain_text(
        "No registered agent has a tool called “issue_gift_card”"
    )
    page.screenshot(path=str(FORM_SHOTS / "policies-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(FORM_SHOTS / "policies-phone.png"), full_page=True)
    page.set_viewport_size(DESKTOP)
