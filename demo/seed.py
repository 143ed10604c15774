"""The demo shop's orders, each of a customer account. The example phrases the demo model
understands refer to these: alice (the demo's end user) owns orders 42, 44 and 46; the other
demo customers (accounts with no usable password: they own orders, nobody logs in as them)
own the rest."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model

from approvals.models import ApprovalPolicy, ConditionOperator, PolicyAction, PolicyCondition

from .models import Order

DEMO_ORDERS: list[dict[str, Any]] = [
    {
        "number": 3,
        "customer": "bruno",
        "customer_name": "Bruno Costa",
        "customer_email": "bruno.costa@example.net",
        "item": "Trail running shoes, size 43",
        "amount": Decimal("74.50"),
        "status": Order.Status.DELIVERED,
    },
    {
        "number": 7,
        "customer": "chen",
        "customer_name": "Chen Wei",
        "customer_email": "chen.wei@example.com",
        "item": "Noise-cancelling headphones",
        "amount": Decimal("89.00"),
        "status": Order.Status.SHIPPED,
    },
    {
        "number": 12,
        "customer": "dana",
        "customer_name": "Dana Okafor",
        "customer_email": "dana.okafor@example.org",
        "item": "Cast-iron skillet, 28 cm",
        "amount": Decimal("45.00"),
        "status": Order.Status.CANCELLED,
    },
    {
        "number": 15,
        "customer": "eva",
        "customer_name": "Eva Lindqvist",
        "customer_email": "eva.lindqvist@example.com",
        "item": "Wool blanket, grey",
        "amount": Decimal("65.00"),
        "status": Order.Status.DELIVERED,
        "refunded_amount": Decimal("20.00"),
    },
    {
        "number": 23,
        "customer": "farid",
        "customer_name": "Farid Haddad",
        "customer_email": "farid.haddad@example.net",
        "item": "Paperback set: The Expanse, books 1-3",
        "amount": Decimal("35.00"),
        "status": Order.Status.PLACED,
    },
    {
        "number": 31,
        "customer": "grace",
        "customer_name": "Grace Kim",
        "customer_email": "grace.kim@example.org",
        "item": "Mechanical keyboard, brown switches",
        "amount": Decimal("129.00"),
        "status": Order.Status.SHIPPED,
    },
    {
        "number": 42,
        "customer": "alice",
        "customer_name": "Alice Martin",
        "customer_email": "alice@example.com",
        "item": "Burr coffee grinder",
        "amount": Decimal("120.00"),
        "status": Order.Status.PLACED,
    },
    {
        "number": 44,
        "customer": "alice",
        "customer_name": "Alice Martin",
        "customer_email": "alice@example.com",
        "item": "Gooseneck kettle, 1 l",
        "amount": Decimal("54.00"),
        "status": Order.Status.SHIPPED,
    },
    {
        "number": 46,
        "customer": "alice",
        "customer_name": "Alice Martin",
        "customer_email": "alice@example.com",
        "item": "Espresso cups, set of 4",
        "amount": Decimal("32.00"),
        "status": Order.Status.DELIVERED,
    },
    {
        "number": 58,
        "customer": "hugo",
        "customer_name": "Hugo Moreau",
        "customer_email": "hugo.moreau@example.com",
        "item": "Standing desk frame",
        "amount": Decimal("249.99"),
        "status": Order.Status.PLACED,
    },
]


def seed_customer(username: str, name: str, email: str) -> Any:
    """The demo customer `username`, created when missing with no usable password (seed_demo
    gives alice hers); an existing account is kept as it is."""
    first_name, _, last_name = name.partition(" ")
    user, created = get_user_model().objects.get_or_create(
        username=username,
        defaults={"email": email, "first_name": first_name, "last_name": last_name},
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def seed_orders(*, reset: bool = False) -> int:
    """Create the demo orders that are missing, each of its customer's account (created when
    missing); with `reset`, also restore the others, owner included.

    Safe to run any number of times. Returns how many orders were created.
    """
    created_count = 0
    for spec in DEMO_ORDERS:
        defaults = {key: value for key, value in spec.items() if key not in ("number", "customer")}
        defaults.setdefault("refunded_amount", Decimal("0"))
        defaults["customer"] = seed_customer(
            spec["customer"], spec["customer_name"], spec["customer_email"]
        )
        # The events stay on reset: they are the audit trail, and they keep an old tool call
        # from taking effect a second time.
        lookup = Order.objects.update_or_create if reset else Order.objects.get_or_create
        _, created = lookup(number=spec["number"], defaults=defaults)
        created_count += created
    return created_count


# The demo's approval policy (engine/policies.py), for rita's policy pages. It is seeded off:
# `seed_demo` seeds every cluster (agentsite/cluster.py), and the soak benchmark (bench/soak.py)
# counts on each of its refunds waiting for a reviewer. The demo's issue_refund asks a reviewer
# only for a refund that brings an order's refunds above $50 (demo/tools.py), so the rule
# approves up to $60: turned on in the inbox's Policies tab, "refund 60 on order 42" goes
# through unasked, while "refund 60 on order 46" (only $32 is left to refund: the facts warn)
# and "refund 80 on order 42" (above $60) wait for a reviewer.
DEMO_POLICY: dict[str, Any] = {
    "name": "Refunds up to $60 go through",
    "enabled": False,
    "priority": 10,
    "tool_name": "issue_refund",
    "action": PolicyAction.APPROVE,
    "requires_no_warnings": True,
    "description": "A refund of $60 or less is approved without a reviewer, unless the order's "
    "facts warn (an order already cancelled, more than is left to refund). Refunds that keep an "
    "order's total at $50 or less need nobody anyway.",
}
DEMO_POLICY_LIMIT = "60"

# The example this seed wrote before (approve refunds up to $20), which the demo's $50 threshold
# never let see a call: replaced when nobody changed it, kept as it is otherwise.
EARLIER_POLICY = {
    "name": "Small refunds go through",
    "enabled": False,
    "priority": 10,
    "agent_name": "",
    "tool_name": "issue_refund",
    "action": PolicyAction.APPROVE,
    "message": "",
    "on_expiry": "",
    "description": "A refund of $20 or less is approved without a reviewer, even when the "
    "order's refunds are above the $50 that otherwise asks for one.",
    "updated_by": None,
}


def seed_policies() -> int:
    """Create the demo's approval policy when no rule of its name exists (one changed or
    turned on since is kept as it is), in place of the earlier example if nobody touched it.
    Returns how many rules were created."""
    _drop_untouched_earlier_policy()
    policy, created = ApprovalPolicy.objects.get_or_create(
        name=DEMO_POLICY["name"], defaults=DEMO_POLICY
    )
    if created:
        PolicyCondition.objects.create(
            policy=policy,
            argument="amount",
            operator=ConditionOperator.AT_MOST,
            value=DEMO_POLICY_LIMIT,
        )
    return int(created)


def _drop_untouched_earlier_policy() -> None:
    earlier = ApprovalPolicy.objects.filter(**EARLIER_POLICY).first()
    if earlier is None or earlier.decisions.exists():
        return
    conditions = list(earlier.conditions.values_list("argument", "operator", "value"))
    if conditions == [("amount", ConditionOperator.AT_MOST, "20")]:
        earlier.delete()


# The offline demo model costs nothing; it is priced here as gpt-4.1-mini is, so that the demo's
# cost columns and dashboards have numbers (a deployment without the demo has no such row, and
# a model without a price shows "no price for <model>").
DEMO_PRICE = {
    "model": "offline-demo",
    "input_per_million": Decimal("0.40"),
    "cached_input_per_million": Decimal("0.10"),
    "output_per_million": Decimal("1.60"),
    "currency": "USD",
    "valid_from": date(2026, 1, 1),
    "note": "Demo only: the offline model is free; priced as gpt-4.1-mini.",
}


def seed_prices() -> int:
    """Price the offline demo model unless it has a price already. Returns rows created."""
    from tracing.models import ModelPrice

    if ModelPrice.objects.filter(model=DEMO_PRICE["model"]).exists():
        return 0
    ModelPrice.objects.create(**DEMO_PRICE)
    return 1
