"""The demo shop's data: orders, what the agents did to them, and the emails they "sent"."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models


def format_money(amount: Decimal) -> str:
    return f"${amount:,.2f}"


class OrderQuerySet(models.QuerySet["Order"]):
    def of_customer(self, user: Any) -> OrderQuerySet:
        """The orders of `user`'s account; none for no user (or one not signed in). A tool
        acting for someone looks orders up here only, so another customer's order answers
        exactly as a missing one."""
        if user is None or not getattr(user, "is_authenticated", False) or user.pk is None:
            return self.none()
        return self.filter(customer=user)


class Order(models.Model):
    class Status(models.TextChoices):
        PLACED = "placed", "Placed"
        SHIPPED = "shipped", "Shipped"
        DELIVERED = "delivered", "Delivered"
        CANCELLED = "cancelled", "Cancelled"

    number = models.PositiveIntegerField(unique=True, help_text="The order number customers see.")
    customer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="orders",
        help_text="The account the order belongs to; empty for an order of no account.",
    )
    customer_name = models.CharField(max_length=200)
    customer_email = models.EmailField()
    item = models.CharField(max_length=200, help_text="What was ordered.")
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PLACED)
    refunded_amount = models.DecimalField(max_digits=10, decimal_places=2, default=Decimal("0"))
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = OrderQuerySet.as_manager()

    class Meta:
        ordering = ["number"]

    def __str__(self) -> str:
        return f"Order {self.number}"

    @property
    def refundable_amount(self) -> Decimal:
        return self.amount - self.refunded_amount

    def describe(self) -> str:
        text = (
            f"Order {self.number} for {self.customer_name}: {self.item}, "
            f"{format_money(self.amount)}, status {self.status}"
        )
        if self.refunded_amount:
            text += f", {format_money(self.refunded_amount)} refunded"
        return text + "."

    def cancel_refusal(self) -> str | None:
        """Why this order cannot be cancelled, or None when it can."""
        if self.status == self.Status.CANCELLED:
            return f"Order {self.number} is already cancelled."
        if self.status == self.Status.DELIVERED:
            return (
                f"Order {self.number} has already been delivered, so it cannot be cancelled; "
                "a refund is still possible."
            )
        return None

    def refund_refusal(self, amount: Decimal) -> str | None:
        """Why `amount` cannot be refunded on this order, or None when it can."""
        if amount <= 0:
            return f"A refund must be a positive amount, not {format_money(amount)}."
        if amount > self.refundable_amount:
            return (
                f"Cannot refund {format_money(amount)} on order {self.number}: only "
                f"{format_money(self.refundable_amount)} of {format_money(self.amount)} "
                "is left to refund."
            )
        return None


class OrderEvent(models.Model):
    """Something an agent did to an order, keyed on the tool call that did it.

    The unique tool call id makes the effect idempotent: replaying a call returns the stored
    result instead of cancelling or refunding again.
    """

    class Kind(models.TextChoices):
        CANCELLED = "cancelled", "Cancelled"
        REFUNDED = "refunded", "Refunded"

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    amount = models.DecimalField(max_digits=10, decimal_places=2, null=True, blank=True)
    tool_call_id = models.CharField(max_length=200, unique=True)
    result = models.TextField(help_text="What the tool told the agent.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} order {self.order.number}"


class SentEmail(models.Model):
    """An email the demo agent "sent". Nothing leaves the machine; it is recorded here."""

    SUBJECT_MAX_LENGTH = 300

    to = models.EmailField()
    subject = models.CharField(max_length=SUBJECT_MAX_LENGTH)
    body = models.TextField()
    tool_call_id = models.CharField(max_length=200, unique=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"To {self.to}: {self.subject}"

    def describe(self) -> str:
        return f"Email to {self.to} with subject “{self.subject}” recorded as sent."
