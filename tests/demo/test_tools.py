"""The demo acts for the person who asks: only her own orders and address, and another
customer's order answers exactly like a missing one."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest
from agents import RunContextWrapper
from django.test import Client
from django.urls import reverse

from demo import tools
from demo.models import Order, OrderEvent, SentEmail
from engine import facts, runs
from engine.context import RunContext
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_request, make_reviewer, make_run, make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def orders_table() -> list[tuple[Any, ...]]:
    return list(
        Order.objects.order_by("number").values_list(
            "number", "customer_id", "status", "amount", "refunded_amount", "customer_email"
        )
    )


def ask(user: Any, text: str) -> AgentRun:
    """`text` sent by `user` in a new conversation, run here until it ends or pauses; a
    pause is approved by rita and resumed, so whatever the tool says is what it did."""
    conversation = make_conversation(owner=user, agent_name="support")
    run = runs.start_run(conversation, text, user)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    if run.status == RunStatus.WAITING:
        for request in run.approval_requests.pending():
            runs.decide(request.pk, make_reviewer(), runs.Decision.approve())
        asyncio.run(runs.resume(run.pk))
        run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    return run


def tool_outputs(run: AgentRun) -> list[str]:
    from conversations.session import DjangoSession

    items = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    return [item["output"] for item in items if item.get("type") == "function_call_output"]


@pytest.mark.parametrize(
    "text",
    ["where is order 7", "cancel order 7", "refund 30 on order 7", "refund 80 on order 7"],
)
def test_alice_gets_nothing_of_another_customers_order(
    alice: Any, text: str, submitted: list
) -> None:
    before = orders_table()

    run = ask(alice, text)

    assert tool_outputs(run) == ["Order 7 was not found in your account."]
    assert "Chen" not in run.final_output and "headphones" not in run.final_output.lower()
    assert orders_table() == before
    assert OrderEvent.objects.count() == 0


@pytest.mark.parametrize("verb", ["where is order {}", "cancel order {}", "refund 30 on order {}"])
def test_another_customers_order_answers_like_a_missing_one(
    alice: Any, verb: str, submitted: list
) -> None:
    others = ask(alice, verb.format(7))
    missing = ask(alice, verb.format(999))

    assert tool_outputs(others) == [o.replace("999", "7") for o in tool_outputs(missing)]
    assert others.final_output == missing.final_output.replace("999", "7")
    # Same pauses too: the approval policies do not tell the two apart.
    assert others.pause_count == missing.pause_count


def test_alice_still_looks_up_cancels_and_refunds_her_own_orders(
    alice: Any, submitted: list
) -> None:
    looked_up = ask(alice, "where is order 44")
    assert tool_outputs(looked_up) == [
        "Order 44 for Alice Martin: Gooseneck kettle, 1 l, $54.00, status shipped."
    ]

    cancelled = ask(alice, "cancel order 42")
    assert tool_outputs(cancelled) == ["Order 42 (Burr coffee grinder) is now cancelled."]
    assert Order.objects.get(number=42).status == Order.Status.CANCELLED

    refunded = ask(alice, "refund 30 on order 46")
    assert "Refunded $30.00 on order 46" in tool_outputs(refunded)[0]
    assert Order.objects.get(number=46).refunded_amount == Decimal("30.00")
    assert Order.objects.get(number=7).status == Order.Status.SHIPPED


def test_the_customer_herself_works_on_her_order(submitted: list) -> None:
    chen = make_user(username="chen")

    run = ask(chen, "cancel order 7")

    assert tool_outputs(run) == ["Order 7 (Noise-cancelling headphones) is now cancelled."]
    assert Order.objects.get(number=7).status == Order.Status.CANCELLED


def test_alice_emails_only_herself_and_only_about_her_orders(alice: Any, submitted: list) -> None:
    about_other = ask(alice, "email alice@example.com about the delivery of order 7")
    to_other = ask(alice, "email chen.wei@example.com about the delivery of order 42")
    own = ask(alice, "email alice@example.com about the delivery of order 42")

    assert tool_outputs(about_other) == ["Order 7 was not found in your account."]
    assert tool_outputs(to_other) == [
        "Not sent: I can only email you at your own address, not at chen.wei@example.com."
    ]
    assert list(SentEmail.objects.values_list("to", flat=True)) == ["alice@example.com"]
    assert "recorded as sent" in tool_outputs(own)[0]


async def test_the_refund_policy_does_not_tell_another_customers_order_from_a_missing_one(
    alice: Any,
) -> None:
    # Order 15 is Eva's, with $20 refunded: 40 more would need eva's reviewer, not alice's.
    eva = await Order.objects.select_related("customer").aget(number=15)

    def policy_for(user: Any, number: int) -> Any:
        context = RunContext(user_id=user.pk, conversation_id=1, session_id="c", run_id=1)
        params = {"order_id": number, "amount": 40.0}
        return tools.refund_needs_approval(RunContextWrapper(context=context), params, "call")

    assert await policy_for(eva.customer, 15) is True
    assert await policy_for(alice, 15) is await policy_for(alice, 999) is False


def test_nobody_signed_in_gets_no_order(submitted: list) -> None:
    conversation = make_conversation(agent_name="support")
    run = runs.start_run(conversation, "where is order 42")
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()

    assert tool_outputs(run) == ["Nobody signed in asked for this, so nothing is done."]


def test_the_inbox_shows_whom_the_call_runs_for_and_the_order_it_touches(
    alice: Any, client: Client
) -> None:
    own = make_request(run=make_run(owner=alice), arguments={"order_id": 42})
    other = make_request(run=make_run(owner=alice), arguments={"order_id": 7})
    client.force_login(make_reviewer())

    html = client.get(reverse("inbox")).content.decode()
    detail = client.get(reverse("inbox_request", args=[own.pk])).content.decode()

    row = html[html.index(f'id="request-{own.pk}"') :]
    row = row[: row.index("</li>")]
    assert "asked by <strong>alice</strong>" in row
    for fact in ("Placed", "$120.00", "Alice Martin &lt;alice@example.com&gt;", "Burr coffee"):
        assert fact in row
        assert fact in detail
    other_row = html[html.index(f'id="request-{other.pk}"') :]
    other_row = other_row[: other_row.index("</li>")]
    assert "7: not in this user&#x27;s account; nothing will change" in other_row
    assert "Chen" not in other_row and "headphones" not in other_row.lower()


def test_a_facts_function_that_fails_says_facts_unavailable(alice: Any, client: Client) -> None:
    def broken(calls: Any) -> list[list[tuple[str, str]]]:
        raise RuntimeError("boom")

    request = make_request(run=make_run(owner=alice), tool_name="wire_money")
    facts.register("wire_money", broken)
    try:
        client.force_login(make_reviewer())
        response = client.get(reverse("inbox"))
    finally:
        facts.unregister("wire_money")

    assert response.status_code == 200
    assert f'id="request-{request.pk}"' in response.content.decode()
    assert 'class="call-facts"' not in response.content.decode()
    assert "Facts unavailable" in response.content.decode()
