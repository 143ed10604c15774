"""The demo agents and tools, run end to end on the offline demo model."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from agents import FunctionTool, RunConfig, RunContextWrapper, Runner, RunResult, RunState
from agents.tool_context import ToolContext
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from openai.types.responses import ResponseTextDeltaEvent

from demo import tools
from demo.agents import billing, researcher, support_desk, warehouse
from demo.models import Order, OrderEvent, SentEmail
from engine import providers
from engine.context import RunContext, deserialize, serialize

# Tools run in worker threads with their own database connections: they must see committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def make_run_config(**kwargs: Any) -> RunConfig:
    return providers.run_config(**kwargs)


def acting_for(username: str = "alice") -> RunContext:
    """The context of a run asked by the seeded demo customer `username`."""
    user = get_user_model().objects.get(username=username)
    return RunContext(user_id=user.pk, conversation_id=1, session_id="conv_demo", run_id=1)


def alice() -> Any:
    return get_user_model().objects.get(username="alice")


def make_tool_context(
    tool_name: str, arguments: dict[str, Any], call_id: str, context: RunContext | None = None
) -> ToolContext[Any]:
    return ToolContext(
        context=context,
        tool_name=tool_name,
        tool_call_id=call_id,
        tool_arguments=json.dumps(arguments),
    )


async def run(text: str, customer: str = "alice") -> RunResult:
    """`text` asked by the demo customer `customer` (alice by default: orders 42, 44, 46)."""
    context = await sync_to_async(acting_for)(customer)
    return await Runner.run(support_desk, text, context=context, run_config=make_run_config())


async def approve_and_resume(result: RunResult) -> RunResult:
    state = result.to_state()
    for item in state.get_interruptions():
        state.approve(item)
    return await Runner.run(support_desk, state, run_config=make_run_config())


def get_tool(name: str) -> FunctionTool:
    return next(
        tool for tool in support_desk.tools if isinstance(tool, FunctionTool) and tool.name == name
    )


async def get_order(number: int) -> Order:
    return await Order.objects.aget(number=number)


def called_tools(result: RunResult) -> list[str]:
    return [item.raw_item.name for item in result.new_items if item.type == "tool_call_item"]


async def test_it_looks_up_an_order_without_approval() -> None:
    result = await run("where is order 7", customer="chen")

    assert called_tools(result) == ["lookup_order"]
    assert result.interruptions == []
    assert "shipped" in result.final_output
    assert "Noise-cancelling headphones" in result.final_output


async def test_it_pauses_a_cancellation_for_approval() -> None:
    result = await run("cancel order 42")

    assert result.final_output is None
    [interruption] = result.interruptions
    assert interruption.tool_name == "cancel_order"
    assert interruption.agent.name == "Support desk"
    assert json.loads(interruption.arguments or "{}") == {"order_id": 42}
    assert (await get_order(42)).status == Order.Status.PLACED


async def test_it_cancels_once_approved() -> None:
    result = await approve_and_resume(await run("cancel order 42"))

    assert result.interruptions == []
    assert (await get_order(42)).status == Order.Status.CANCELLED
    assert "Order 42 (Burr coffee grinder) is now cancelled." in result.final_output
    assert await OrderEvent.objects.filter(kind="cancelled").acount() == 1


async def test_it_relays_a_rejection_and_changes_nothing() -> None:
    paused = await run("cancel order 42")
    state = paused.to_state()
    state.reject(state.get_interruptions()[0], rejection_message="Rejected: it ships today.")

    result = await Runner.run(support_desk, state, run_config=make_run_config())

    assert "Rejected: it ships today." in result.final_output
    assert "not approved" in result.final_output
    assert (await get_order(42)).status == Order.Status.PLACED
    assert await OrderEvent.objects.acount() == 0


async def test_it_resumes_from_a_saved_state() -> None:
    paused = await run("cancel order 42")
    saved = paused.to_state().to_json(context_serializer=serialize, strict_context=True)

    state = await RunState.from_json(
        support_desk, saved, context_deserializer=deserialize, strict_context=True
    )
    state.approve(state.get_interruptions()[0])
    result = await Runner.run(support_desk, state, run_config=make_run_config())

    assert (await get_order(42)).status == Order.Status.CANCELLED
    assert "cancelled" in result.final_output


async def test_it_refuses_to_cancel_a_delivered_order() -> None:
    result = await approve_and_resume(await run("cancel order 3", customer="bruno"))

    assert "already been delivered" in result.final_output
    assert (await get_order(3)).status == Order.Status.DELIVERED


async def test_it_says_when_an_order_does_not_exist() -> None:
    result = await run("where is order 999")

    assert "Order 999 was not found in your account." in result.final_output


async def test_it_refunds_a_small_amount_without_approval() -> None:
    result = await run("refund 30 on order 42")

    assert result.interruptions == []
    assert "Refunded $30.00 on order 42" in result.final_output
    assert (await get_order(42)).refunded_amount == Decimal("30.00")


async def test_it_pauses_a_large_refund_for_approval() -> None:
    paused = await run("refund 80 on order 42")

    [interruption] = paused.interruptions
    assert interruption.tool_name == "issue_refund"
    assert json.loads(interruption.arguments or "{}") == {"order_id": 42, "amount": 80.0}
    assert (await get_order(42)).refunded_amount == Decimal("0")

    result = await approve_and_resume(paused)

    assert (await get_order(42)).refunded_amount == Decimal("80.00")
    assert "Refunded $80.00" in result.final_output


async def test_it_never_refunds_more_than_was_paid() -> None:
    await run("refund 50 on order 42")
    result = await approve_and_resume(await run("refund 80 on order 42"))

    assert "only $70.00 of $120.00 is left to refund" in result.final_output
    assert (await get_order(42)).refunded_amount == Decimal("50.00")


async def test_it_hands_billing_questions_to_billing() -> None:
    result = await run("I have a billing question")

    assert result.last_agent.name == "Billing"
    assert result.final_output.startswith("Hi, this is Billing.")


async def test_it_surfaces_the_researchers_approval_at_the_top() -> None:
    paused = await run("research refund policy")

    [interruption] = paused.interruptions
    assert interruption.agent.name == "Researcher"
    assert interruption.tool_name == "search_knowledge_base"
    assert json.loads(interruption.arguments or "{}") == {"query": "refund policy"}

    result = await approve_and_resume(paused)

    assert result.interruptions == []
    assert "Refunds go back to the original payment method" in result.final_output


async def test_it_streams_the_reply_word_by_word() -> None:
    context = await sync_to_async(acting_for)("chen")
    result = Runner.run_streamed(
        support_desk, "where is order 7", context=context, run_config=make_run_config()
    )
    deltas = [
        event.data.delta
        async for event in result.stream_events()
        if event.type == "raw_response_event" and isinstance(event.data, ResponseTextDeltaEvent)
    ]

    assert len(deltas) > 5
    assert "".join(deltas) == result.final_output
    assert "shipped" in result.final_output


async def test_it_pauses_a_streamed_run_for_approval() -> None:
    context = await sync_to_async(acting_for)("alice")
    result = Runner.run_streamed(
        support_desk, "cancel order 42", context=context, run_config=make_run_config()
    )
    async for _ in result.stream_events():
        pass

    [interruption] = result.interruptions
    assert interruption.tool_name == "cancel_order"
    assert (await get_order(42)).status == Order.Status.PLACED


async def test_it_holds_an_email_about_a_refund_for_approval() -> None:
    paused = await run("email alice@example.com about my refund")

    [interruption] = paused.interruptions
    assert interruption.tool_name == "send_email"
    assert await SentEmail.objects.acount() == 0

    result = await approve_and_resume(paused)

    email = await SentEmail.objects.aget()
    assert email.to == "alice@example.com"
    assert "recorded as sent" in result.final_output


async def test_it_sends_other_emails_without_approval() -> None:
    text = "email chen.wei@example.com about the delayed delivery of order 7"
    result = await run(text, customer="chen")

    assert result.interruptions == []
    assert await SentEmail.objects.filter(to="chen.wei@example.com").aexists()


async def test_it_emails_nobody_but_the_asker() -> None:
    # Order 7 is Chen Wei's (chen.wei@example.com); the tool emails only the one who asks.
    result = await run("email bob@example.com about the delayed delivery of order 7", "chen")

    assert result.interruptions == []
    assert "I can only email you at your own address, not at bob@example.com" in (
        result.final_output
    )
    assert await SentEmail.objects.acount() == 0


async def test_it_sends_an_email_that_names_no_order_to_the_askers_own_address() -> None:
    result = await run("email chen.wei@example.com about the delayed delivery", "chen")

    assert result.interruptions == []
    assert await SentEmail.objects.filter(to="chen.wei@example.com").aexists()


async def test_it_holds_refunds_for_approval_once_their_total_passes_the_threshold() -> None:
    first = await run("refund 45 on order 42")
    assert first.interruptions == []
    assert (await get_order(42)).refunded_amount == Decimal("45.00")

    # 45 more would make 90 refunded without a reviewer.
    paused = await run("refund 45 on order 42")
    [interruption] = paused.interruptions
    assert interruption.tool_name == "issue_refund"
    assert (await get_order(42)).refunded_amount == Decimal("45.00")

    await approve_and_resume(paused)
    assert (await get_order(42)).refunded_amount == Decimal("90.00")

    # However small, a refund on top of 90 waits too.
    [again] = (await run("refund 5 on order 42")).interruptions
    assert again.tool_name == "issue_refund"
    assert (await get_order(42)).refunded_amount == Decimal("90.00")


async def test_three_small_refunds_on_one_order_never_pass_the_threshold_unreviewed() -> None:
    for _ in range(3):
        await run("refund 45 on order 58", customer="hugo")

    assert (await get_order(58)).refunded_amount == Decimal("45.00")
    assert await OrderEvent.objects.filter(order__number=58).acount() == 1


def test_the_refund_itself_refuses_an_unreviewed_total_above_the_threshold() -> None:
    """Checked again under the order's lock: two calls that each passed the policy while
    nothing was refunded (in parallel, or from two conversations) cannot both go through."""
    assert "Refunded $45.00" in tools.refund(42, Decimal("45"), "call_1", customer=alice())

    refused = tools.refund(42, Decimal("45"), "call_2", customer=alice())

    assert "needs a reviewer's approval" in refused
    assert Order.objects.get(number=42).refunded_amount == Decimal("45.00")
    reviewed = tools.refund(42, Decimal("45"), "call_3", customer=alice(), reviewed=True)
    assert "Refunded $45.00" in reviewed
    assert Order.objects.get(number=42).refunded_amount == Decimal("90.00")


async def test_an_unapproved_refund_call_is_held_to_the_threshold() -> None:
    customer = await sync_to_async(alice)()
    await sync_to_async(tools.refund)(42, Decimal("40"), "call_earlier", customer=customer)
    arguments = {"order_id": 42, "amount": 30.0}
    asker = await sync_to_async(acting_for)()
    context = make_tool_context("issue_refund", arguments, "call_unapproved", asker)

    output = await get_tool("issue_refund").on_invoke_tool(context, json.dumps(arguments))

    assert "needs a reviewer's approval" in output
    assert (await get_order(42)).refunded_amount == Decimal("40.00")


def test_it_cancels_once_per_tool_call_id() -> None:
    first = tools.cancel(42, "call_same", customer=alice())
    second = tools.cancel(42, "call_same", customer=alice())

    assert first == second == "Order 42 (Burr coffee grinder) is now cancelled."
    assert OrderEvent.objects.filter(tool_call_id="call_same").count() == 1


def test_it_refunds_once_per_tool_call_id() -> None:
    tools.refund(42, Decimal("20"), "call_same", customer=alice())
    tools.refund(42, Decimal("20"), "call_same", customer=alice())
    tools.refund(42, Decimal("20"), "call_other", customer=alice())

    assert Order.objects.get(number=42).refunded_amount == Decimal("40.00")
    assert OrderEvent.objects.count() == 2


async def test_it_replays_a_tool_call_without_a_second_effect() -> None:
    arguments = {"order_id": 42, "amount": 30.0}
    asker = await sync_to_async(acting_for)()
    for _ in range(2):
        context = make_tool_context("issue_refund", arguments, "call_replayed", asker)
        output = await get_tool("issue_refund").on_invoke_tool(context, json.dumps(arguments))
        assert "Refunded $30.00 on order 42" in output

    assert (await get_order(42)).refunded_amount == Decimal("30.00")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"order_id": 42, "amount": 30.0}, False),
        ({"order_id": 42, "amount": 50.0}, False),
        ({"order_id": 42, "amount": 50.01}, True),
        ({"order_id": 42, "amount": 80.0}, True),
        ({"order_id": 42}, True),
        ({"order_id": 42, "amount": "lots"}, True),
        ({"order_id": 42, "amount": "30"}, True),
        ({"order_id": 42, "amount": True}, True),
        ({"order_id": 42, "amount": -5.0}, True),
        ({}, True),
        # Order 15 has $20.00 refunded already: the threshold is on the order's total.
        ({"order_id": 15, "amount": 30.0}, False),
        ({"order_id": 15, "amount": 30.01}, True),
        ({"amount": 30.0}, True),
        ({"order_id": "42", "amount": 30.0}, True),
        ({"order_id": 42.5, "amount": 30.0}, True),
        ({"order_id": True, "amount": 30.0}, True),
        # No such order: the tool says so, and refunds nothing.
        ({"order_id": 999, "amount": 30.0}, False),
        ({"order_id": 999, "amount": 80.0}, True),
    ],
)
async def test_it_requires_approval_for_large_or_unreadable_refunds(
    params: dict[str, Any], expected: bool
) -> None:
    # Order 15 is Eva's, the others alice's (or nobody's).
    customer = "eva" if params.get("order_id") == 15 else "alice"
    ctx = RunContextWrapper(context=await sync_to_async(acting_for)(customer))
    assert await tools.refund_needs_approval(ctx, params, "call_1") is expected


@pytest.mark.parametrize(
    ("subject", "expected"),
    [("About your REFUND", True), ("Your order has shipped", False), (None, True)],
)
async def test_it_requires_approval_for_emails_about_refunds(
    subject: str | None, expected: bool
) -> None:
    params = {"to": "alice@example.com", "subject": subject, "body": "Hello", "order_id": 42}
    assert await tools.email_needs_approval(None, params, "call_1") is expected


@pytest.mark.parametrize(
    ("to", "order_id", "expected"),
    [
        ("alice@example.com", 42, False),  # Alice Martin's own order
        ("Alice@Example.com", 42, False),
        # Whose address or order it is does not matter here (the policy must not tell them
        # apart): the tool emails only the asker, about her own orders.
        ("chen.wei@example.com", 42, False),
        ("bob@example.com", 42, False),
        ("alice@example.com", 7, False),
        ("alice@example.com", None, False),
        ("alice@example.com", 999, False),
        # Unreadable: waits.
        ("alice@example.com", "42", True),
        ("alice@example.com", True, True),
        (None, 42, True),
    ],
)
async def test_it_requires_approval_for_unreadable_emails_whoever_they_name(
    to: str | None, order_id: object, expected: bool
) -> None:
    params: dict[str, Any] = {"to": to, "subject": "Your order has shipped", "body": "Hello"}
    if order_id is not None:
        params["order_id"] = order_id
    assert await tools.email_needs_approval(None, params, "call_1") is expected


def test_it_wires_the_demo_agents_together() -> None:
    assert [tool.name for tool in support_desk.tools] == [
        "lookup_order",
        "cancel_order",
        "issue_refund",
        "send_email",
        "research",
    ]
    assert support_desk.handoffs == [billing, warehouse]
    assert billing.handoffs == [support_desk]  # and back
    assert warehouse.handoffs == [support_desk]
    assert [server.name for server in warehouse.mcp_servers] == ["warehouse"]
    assert [tool.name for tool in billing.tools] == ["lookup_order", "issue_refund"]
    assert [tool.name for tool in researcher.tools] == ["search_knowledge_base"]
    assert all(agent.model is None for agent in (support_desk, billing, researcher, warehouse))
