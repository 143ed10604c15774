"""The end user's chat keeps, in plain words, what a person or a rule did with a call that
waited: edited (what changed, money as money), answered instead of the tool, rejected with
the message, approved by a rule, withdrawn by her; and a Stop of hers is hers."""

from __future__ import annotations

import asyncio
import html
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalPolicy, PolicyAction, PolicyCondition
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.conversations.test_views import page_text
from tests.factories import client_of, make_reviewer, pause_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("demo")]


def resumed(run: AgentRun) -> AgentRun:
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    return run


def chat_of(run: AgentRun) -> str:
    """Her chat page's text, as she reads it."""
    client: Client = client_of(run.conversation.owner)
    page = client.get(f"/chats/{run.conversation.session_id}/")
    assert page.status_code == 200
    return html.unescape(page_text(page))


def test_her_chat_says_a_reviewer_changed_her_refund_and_how(submitted: list[Any]) -> None:
    run = pause_run("refund 80 on order 42")
    waiting = chat_of(run)
    # Money as money on the waiting card, the tool author's aside to the model left out.
    assert "A person will confirm: refund part or all of an order (order 42, amount $80.00)" in (
        waiting
    )
    assert "80.0)" not in waiting and "asker" not in waiting

    rita = make_reviewer("rita")
    runs.decide(
        run.approval_requests.get(), rita, runs.Decision.edit({"order_id": 42, "amount": 60.0})
    )
    text = chat_of(resumed(run))

    assert "Refunded $60.00" in text
    assert "rita changed your request before it ran: amount $80.00 → $60.00." in text
    # The call as it ran, in plain words.
    assert "refund part or all of an order (order 42, amount $60.00)" in text.lower()


def test_her_chat_says_a_reviewer_answered_instead_of_the_tool(submitted: list[Any]) -> None:
    run = pause_run("email alice@example.com about my refund")
    runs.decide(
        run.approval_requests.get(),
        make_reviewer("rita"),
        runs.Decision.respond("I phoned Alice instead."),
    )
    text = chat_of(resumed(run))

    assert "Not run: rita answered instead of the tool. “I phoned Alice instead.”" in text
    assert "→ I phoned Alice" not in text  # not shown as what the tool returned


def test_her_chat_says_who_rejected_it_and_why(submitted: list[Any]) -> None:
    run = pause_run("cancel order 42")
    runs.decide(
        run.approval_requests.get(), make_reviewer("rita"), runs.Decision.reject("Already packed.")
    )
    text = chat_of(resumed(run))

    assert "Not approved by rita; nothing was done. “Already packed.”" in text


def test_her_chat_says_a_rule_approved_it(submitted: list[Any]) -> None:
    policy = ApprovalPolicy.objects.create(
        name="Refunds up to 100", action=PolicyAction.APPROVE, tool_name="issue_refund"
    )
    PolicyCondition.objects.create(policy=policy, argument="amount", operator="<=", value="100")
    owner = pause_run.__globals__["customer_for"]("refund 80 on order 42")
    run = runs.start_run(
        pause_run.__globals__["make_conversation"](owner=owner, agent_name="support"),
        "refund 80 on order 42",
        owner,
    )
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    if run.status == RunStatus.RESUMING:
        run = resumed(run)
    assert run.status == RunStatus.COMPLETED, run.error

    assert "Approved by the rule “Refunds up to 100”." in chat_of(run)


def test_her_chat_says_she_withdrew_it(submitted: list[Any]) -> None:
    run = pause_run("cancel order 42")
    runs.withdraw(run.approval_requests.get(), run.conversation.owner)
    text = chat_of(resumed(run))

    assert "You withdrew this request; nothing was done." in text
    assert "You withdrew the request to cancel order 42, so nothing was done." in text
    assert "not approved" not in text


def test_her_stop_is_told_to_her_as_hers(submitted: list[Any]) -> None:
    run = pause_run("cancel order 42")
    owner = run.conversation.owner
    runs.decide(run.approval_requests.get(), make_reviewer("rita"), runs.Decision.approve())
    runs.stop(run, owner)  # decided, not resumed yet: cancelled at once
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED

    text = chat_of(run)
    assert "You stopped this reply" in text
    assert f"Stopped by {owner.get_username()}" not in text
