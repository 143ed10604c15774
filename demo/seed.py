"""The demo shop's orders. The example phrases the demo model understands refer to these."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from .models import Order

DEMO_ORDERS: list[dict[str, Any]] = [
    {
        "number": 3,
        "customer_name": "Bruno Costa",
        "customer_email": "bruno.costa@example.net",
        "item": "Trail running shoes, size 43",
        "amount": Decimal("74.50"),
        "status": Order.Status.DELIVERED,
    },
    {
        "number": 7,
        "customer_name": "Chen Wei",
        "customer_email": "chen.wei@example.com",
        "item": "Noise-cancelling headphones",
        "amount": Decimal("89.00"),
        "status": Order.Status.SHIPPED,
    },
    {
        "number": 12,
        "customer_name": "Dana Okafor",
        "customer_email": "dana.okafor@example.org",
        "item": "Cast-iron skillet, 28 cm",
        "amount": Decimal("45.00"),
        "status": Order.Status.CANCELLED,
    },
    {
        "number": 15,
        "customer_name": "Eva Lindqvist",
        "customer_email": "eva.lindqvist@example.com",
        "item": "Wool blanket, grey",
        "amount": Decimal("65.00"),
        "status": Order.Status.DELIVERED,
        "refunded_amount": Decimal("20.00"),
    },
    {
        "number": 23,
        "customer_name": "Farid Haddad",
        "customer_email": "farid.haddad@example.net",
        "item": "Paperback set: The Expanse, books 1-3",
        "amount": Decimal("35.00"),
        "status": Order.Status.PLACED,
    },
    {
        "number": 31,
        "customer_name": "Grace Kim",
        "customer_email": "grace.kim@example.org",
        "item": "Mechanical keyboard, brown switches",
        "amount": Decimal("129.00"),
        "status": Order.Status.SHIPPED,
    },
    {
        "number": 42,
        "customer_name": "Alice Martin",
        "customer_email": "alice@example.com",
        "item": "Burr coffee grinder",
        "amount": Decimal("120.00"),
        "status": Order.Status.PLACED,
    },
    {
        "number": 58,
        "customer_name": "Hugo Moreau",
        "customer_email": "hugo.moreau@example.com",
        "item": "Standing desk frame",
        "amount": Decimal("249.99"),
        "status": Order.Status.PLACED,
    },
]


def seed_orders(*, reset: bool = False) -> int:
    """Create the demo orders that are missing; with `reset`, also restore the others.

    Safe to run any number of times. Returns how many orders were created.
    """
    created_count = 0
    for spec in DEMO_ORDERS:
        defaults = {key: value for key, value in spec.items() if key != "number"}
        defaults.setdefault("refunded_amount", Decimal("0"))
        # The events stay on reset: they are the audit trail, and they keep an old tool call
        # from taking effect a second time.
        lookup = Order.objects.update_or_create if reset else Order.objects.get_or_create
        _, created = lookup(number=spec["number"], defaults=defaults)
        created_count += created
    return created_count
