"""The demo shop's tools.

They are sync functions: the SDK runs sync tools in a worker thread, so the ORM works in them.
Refusals (no such order, too large a refund, ...) are returned as the tool's output for the
agent to relay, not raised: they are answers, not failures.

Tools with an effect key it on the SDK's tool call id, so a tool call that is replayed (a run
resumed twice, a retried request) returns its first result and changes nothing.

Every tool acts for the person who asked (`engine.context`): it sees only the orders of their
account (`Order.objects.of_customer`) and emails only their own address. Another customer's
order answers exactly like a missing one ("Order N was not found in your account."), in the
tools and in their approval policies, so nothing leaks about who else has which order.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from agents import RunContextWrapper, function_tool
from agents.tool_context import ToolContext
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from agentsite.db.hops import db_hop
from engine.context import RequesterUnavailable, requesting_user_or_none, requesting_user_sync
from engine.registry import review

from .models import Order, OrderEvent, SentEmail, format_money

# A refund that brings an order's refunds above this total waits for a reviewer: per call, three
# refunds of 45 would refund 135 unreviewed.
REFUND_APPROVAL_THRESHOLD = Decimal("50")
CENT = Decimal("0.01")


def no_order(number: int) -> str:
    """The answer for an order that is missing or not the asker's: the same words for both."""
    return f"Order {number} was not found in your account."


def _once_per_call(
    number: int, tool_call_id: str, act: Callable[[Order], str], customer: Any
) -> str:
    """`act` on `customer`'s order `number`, under the order's row lock, once per tool call id:
    a replay of the same call gets the first call's answer. `act` records its `OrderEvent`
    (with `tool_call_id`) when it changes the order, and returns what to tell the agent."""
    try:
        with transaction.atomic():
            try:
                order = Order.objects.of_customer(customer).select_for_update().get(number=number)
            except Order.DoesNotExist:
                return no_order(number)
            # Looked up under the order's lock, so a concurrent replay of the same call waits
            # for the first one and then finds its event.
            earlier = OrderEvent.objects.filter(tool_call_id=tool_call_id).first()
            if earlier is not None:
                return earlier.result
            return act(order)
    except IntegrityError:
        # Lost a race with a replay of the same call on a database that did not serialize us.
        return OrderEvent.objects.get(tool_call_id=tool_call_id).result


def cancel(number: int, tool_call_id: str, *, customer: Any) -> str:
    """Cancel `customer`'s order `number` once per tool call id; returns what to tell the
    agent."""

    def act(order: Order) -> str:
        refusal = order.cancel_refusal()
        if refusal is not None:
            return refusal
        order.status = Order.Status.CANCELLED
        order.save(update_fields=["status", "updated"])
        result = f"Order {order.number} ({order.item}) is now cancelled."
        OrderEvent.objects.create(
            order=order,
            kind=OrderEvent.Kind.CANCELLED,
            tool_call_id=tool_call_id,
            result=result,
        )
        return result

    return _once_per_call(number, tool_call_id, act, customer)


def refund(
    number: int, amount: Decimal, tool_call_id: str, *, customer: Any, reviewed: bool = False
) -> str:
    """Refund `amount` on `customer`'s order `number` once per tool call id; returns what to
    tell the agent.

    Unless a reviewer approved the call, the threshold is checked again under the order's lock:
    two calls that each passed the approval policy before either refunded (in parallel, or from
    two conversations) cannot both go through unreviewed."""
    amount = amount.quantize(CENT, rounding=ROUND_HALF_UP)

    def act(order: Order) -> str:
        refusal = order.refund_refusal(amount)
        if refusal is not None:
            return refusal
        if not reviewed and passes_threshold(order.refunded_amount, amount):
            return (
                f"Not refunded: {format_money(amount)} would bring the refunds on order "
                f"{order.number} to {format_money(order.refunded_amount + amount)}, above "
                f"{format_money(REFUND_APPROVAL_THRESHOLD)}, so it needs a reviewer's "
                "approval. Ask for it again to have it reviewed."
            )
        order.refunded_amount += amount
        order.save(update_fields=["refunded_amount", "updated"])
        result = (
            f"Refunded {format_money(amount)} on order {order.number}; "
            f"{format_money(order.refunded_amount)} of {format_money(order.amount)} "
            "has been refunded in total."
        )
        OrderEvent.objects.create(
            order=order,
            kind=OrderEvent.Kind.REFUNDED,
            amount=amount,
            tool_call_id=tool_call_id,
            result=result,
        )
        return result

    return _once_per_call(number, tool_call_id, act, customer)


def own_addresses(customer: Any, number: int | None = None) -> set[str]:
    """The addresses `customer` may be emailed at: their account's, and the one on their order
    `number` (lowercased)."""
    addresses = {customer.email} if customer is not None and customer.email else set()
    if number is not None:
        orders = Order.objects.of_customer(customer).filter(number=number)
        addresses.update(orders.values_list("customer_email", flat=True))
    return {address.strip().lower() for address in addresses}


def record_email(
    to: str,
    subject: str,
    body: str,
    tool_call_id: str,
    *,
    customer: Any,
    order_id: int | None = None,
) -> str:
    """Record an email to `customer` as sent, once per tool call id; returns what to tell the
    agent. It goes to the asker's own address only, about their own order only."""
    earlier = SentEmail.objects.filter(tool_call_id=tool_call_id).first()
    if earlier is not None:
        return earlier.describe()
    to = to.strip()
    try:
        validate_email(to)
    except ValidationError:
        return f"Not sent: “{to}” is not a valid email address."
    if order_id is not None and not (
        Order.objects.of_customer(customer).filter(number=order_id).exists()
    ):
        return no_order(order_id)
    if to.lower() not in own_addresses(customer, order_id):
        return (
            f"Not sent: I can only email you at your own address, not at {to}."
            if customer is not None
            else "Not sent: nobody signed in asked for this email."
        )
    subject = subject.strip()[: SentEmail.SUBJECT_MAX_LENGTH]
    email, _ = SentEmail.objects.get_or_create(
        tool_call_id=tool_call_id, defaults={"to": to, "subject": subject, "body": body}
    )
    return email.describe()


def to_amount(value: Any) -> Decimal | None:
    """A money amount from a tool argument, or None when it is not a finite positive number."""
    # bool is an int to Python, and a string is not what the schema asked for.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    amount = Decimal(str(value))
    return amount if amount > 0 else None


def to_order_number(value: Any) -> int | None:
    """An order number from a tool argument, or None when it is not a whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def passes_threshold(refunded: Decimal, amount: Decimal) -> bool:
    return refunded + amount > REFUND_APPROVAL_THRESHOLD


def refund_passes_threshold(number: int, amount: Decimal, customer: Any) -> bool:
    """Whether refunding `amount` brings `customer`'s order `number`'s refunds above the
    threshold (for an order that is missing or someone else's, whether `amount` alone does:
    the tool then refunds nothing anyway, and the two cannot be told apart)."""
    orders = Order.objects.of_customer(customer).filter(number=number)
    refunded = orders.values_list("refunded_amount", flat=True).first()
    return passes_threshold(refunded or Decimal("0"), amount)


def _refund_policy(ctx: RunContextWrapper[Any], number: int, amount: Decimal) -> bool:
    # One database hop for the user (first use) and the order.
    return refund_passes_threshold(number, amount, requesting_user_or_none(ctx))


async def refund_needs_approval(
    ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
) -> bool:
    """A refund that brings its order's refunds above the threshold waits for a reviewer;
    anything that cannot be read waits too."""
    # The SDK only consults this policy when validation leaves the arguments unchanged: an
    # integer amount (30, not 30.0) becomes a float, so such a call waits for a reviewer anyway.
    amount = to_amount(params.get("amount"))
    number = to_order_number(params.get("order_id"))
    if amount is None or number is None:
        return True
    return await db_hop(_refund_policy)(ctx, number, amount)


async def email_needs_approval(
    ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str
) -> bool:
    """A reviewer reads an email first when it is about a refund (a promise to a customer);
    anything unreadable waits too. Nothing here depends on whose order or address it names:
    the tool itself emails only the asker, about their own orders."""
    subject, to, order_id = params.get("subject"), params.get("to"), params.get("order_id")
    if not isinstance(subject, str) or re.search(r"refund", subject, re.IGNORECASE):
        return True
    if not isinstance(to, str):
        return True
    return order_id is not None and to_order_number(order_id) is None


def order_facts(
    calls: Sequence[tuple[dict[str, Any], Any]], *, action: str = ""
) -> list[list[tuple[str, str] | tuple[str, str, bool]]]:
    """What a reviewer should know about the order each call would touch, as the tool would
    see it for the call's user (the run's requester), with a warning where the call would
    change nothing or should not happen: no such order in the user's account, an order
    delivered or already cancelled (`action` "cancel"), a refund of a cancelled order or of
    more than is left (`action` "refund"), an address that is not the user's. One query for
    all the calls; declared as the order tools' facts hook (`registry.review`)."""
    read = (to_order_number(arguments.get("order_id")) for arguments, _ in calls)
    numbers = {number for number in read if number is not None}
    orders = {order.number: order for order in Order.objects.filter(number__in=numbers)}
    return [_facts_of(arguments, user, orders, action) for arguments, user in calls]


def _facts_of(
    arguments: dict[str, Any], user: Any, orders: dict[int, Order], action: str
) -> list[tuple[str, str] | tuple[str, str, bool]]:
    facts: list[tuple[str, str] | tuple[str, str, bool]] = []
    number = to_order_number(arguments.get("order_id"))
    order = orders.get(number) if number is not None else None
    # As `Order.objects.of_customer(user)` has it: another customer's order is not there.
    if order is not None and (user is None or order.customer_id != user.pk):
        order = None
    if number is not None and order is None:
        facts.append(("Order", f"{number}: not in this user's account; nothing will change", True))
    if order is not None:
        amount = format_money(order.amount)
        if order.refunded_amount:
            amount += f" ({format_money(order.refunded_amount)} refunded)"
        facts += [
            ("Order", f"{order.number}: {order.item}"),
            ("Status", order.get_status_display()),
            ("Amount", amount),
            ("Customer", f"{order.customer_name} <{order.customer_email}>"),
        ]
        facts += _order_warnings(order, arguments, action)
    to = arguments.get("to")
    if isinstance(to, str):
        own = {user.email} if user is not None and user.email else set()
        if order is not None:
            own.add(order.customer_email)
        mine = to.strip().lower() in {address.strip().lower() for address in own}
        facts.append(
            ("Sends to", to)
            if mine
            else ("Sends to", f"{to}: not this user's address; not sent", True)
        )
    return facts


def _order_warnings(order: Order, arguments: dict[str, Any], action: str) -> list[Any]:
    if action == "cancel":
        refusal = order.cancel_refusal()
        return [("Cancel", refusal, True)] if refusal else []
    if action == "refund":
        if order.status == Order.Status.CANCELLED:
            return [("Status", f"Order {order.number} is already cancelled.", True)]
        amount = to_amount(arguments.get("amount"))
        refusal = order.refund_refusal(amount) if amount is not None else None
        return [("Refund", refusal, True)] if refusal else []
    return []


def for_the_asker(ctx: ToolContext[Any], act: Callable[[Any], str]) -> str:
    """`act(user)` for the active user who asked, or why nobody can be acted for."""
    try:
        customer = requesting_user_sync(ctx)
    except RequesterUnavailable as refusal:
        return str(refusal)
    return act(customer)


@review(risk="low", facts=order_facts)
@function_tool
def lookup_order(ctx: ToolContext[Any], order_id: int) -> str:
    """Look up one of the customer's orders: item, amount, status and what was refunded.

    Args:
        order_id: The order number the customer gave.
    """

    def act(customer: Any) -> str:
        order = Order.objects.of_customer(customer).filter(number=order_id).first()
        return order.describe() if order is not None else no_order(order_id)

    return for_the_asker(ctx, act)


# No tool puts a cancelled order back, so a person decides each one: no approval policy may
# approve a cancellation (one may still reject it).
@review(
    risk="irreversible",
    facts=functools.partial(order_facts, action="cancel"),
    auto_approve=False,
)
@function_tool(needs_approval=True)
def cancel_order(ctx: ToolContext[Any], order_id: int) -> str:
    """Cancel an order that has not been delivered yet. Only the asker's own orders; a
    reviewer approves every cancellation.

    Args:
        order_id: The order number to cancel.
    """
    return for_the_asker(
        ctx, lambda customer: cancel(order_id, ctx.tool_call_id, customer=customer)
    )


@review(
    risk="irreversible",
    money=["amount"],
    facts=functools.partial(order_facts, action="refund"),
)
@function_tool(needs_approval=refund_needs_approval)
def issue_refund(ctx: ToolContext[Any], order_id: int, amount: float) -> str:
    """Refund part or all of an order (only the asker's own).

    A refund that brings the order's refunds above $50 in total waits for a reviewer's
    approval. The total refunded can never exceed what the customer paid.

    Args:
        order_id: The order number to refund.
        amount: The amount to refund, in dollars, for example 30.0.
    """
    value = to_amount(amount)
    if value is None:
        return f"A refund must be a positive amount, not {amount!r}."
    reviewed = ctx.is_tool_approved(ctx.tool_name, ctx.tool_call_id) is True
    return for_the_asker(
        ctx,
        lambda customer: refund(
            order_id, value, ctx.tool_call_id, customer=customer, reviewed=reviewed
        ),
    )


# An email, once sent, cannot be taken back.
@review(risk="irreversible", facts=order_facts)
@function_tool(needs_approval=email_needs_approval)
def send_email(
    ctx: ToolContext[Any], to: str, subject: str, body: str, order_id: int | None = None
) -> str:
    """Send an email to the customer, at their own address only. An email about a refund
    waits for a reviewer's approval.

    Args:
        to: The customer's email address.
        subject: The subject line.
        body: The plain-text body.
        order_id: The customer's order the email is about, if any.
    """
    return for_the_asker(
        ctx,
        lambda customer: record_email(
            to, subject, body, ctx.tool_call_id, customer=customer, order_id=order_id
        ),
    )


KNOWLEDGE_BASE: dict[str, str] = {
    "Refund policy": (
        "Refunds go back to the original payment method within 5 business days. Any part of an "
        "order can be refunded, up to the amount paid. A refund that brings an order's refunds "
        "above $50 in total is reviewed by a person before it is issued."
    ),
    "Cancellations": (
        "An order can be cancelled until it is delivered. Once delivered, the customer can "
        "return it within 30 days instead, and we refund it when it arrives."
    ),
    "Shipping times": (
        "Orders ship within 2 business days. Delivery takes 3 to 5 business days in the country "
        "and up to 10 abroad. The tracking link is emailed when the order ships."
    ),
    "Returns": (
        "Unused items can be returned within 30 days of delivery. The customer prints a free "
        "return label from their account; the refund follows once the parcel is checked."
    ),
    "Warranty": (
        "Electronics carry a two-year warranty against defects. Send the order number and a "
        "short description of the fault; we repair, replace or refund the item."
    ),
}

_STOPWORDS = {"a", "an", "and", "for", "how", "is", "my", "of", "on", "or", "the", "to", "what"}


def _words(text: str) -> set[str]:
    # A crude stem (refunds -> refund) is enough for five articles.
    return {w.rstrip("s") for w in re.findall(r"[a-z]+", text.lower())} - _STOPWORDS


def find_article(query: str) -> tuple[str, str] | None:
    """The article that best matches `query`, or None when no article shares a word with it."""
    wanted = _words(query)
    best_title, best_score = None, 0
    for title, text in KNOWLEDGE_BASE.items():
        score = 3 * len(wanted & _words(title)) + len(wanted & _words(text))
        if score > best_score:
            best_title, best_score = title, score
    if best_title is None:
        return None
    return best_title, KNOWLEDGE_BASE[best_title]


# Gated although it only reads: the demo shows an approval raised inside an agent that another
# agent uses as a tool, and a reviewer may not want internal articles quoted to customers.
@review(risk="low")
@function_tool(needs_approval=True)
def search_knowledge_base(query: str) -> str:
    """Search the internal knowledge base of support articles.

    Args:
        query: What to look for, in a few words.
    """
    found = find_article(query)
    if found is None:
        titles = ", ".join(KNOWLEDGE_BASE)
        return f"No article matches “{query}”. The articles are: {titles}."
    title, text = found
    return f"{title}: {text}"
