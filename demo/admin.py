from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import Order, OrderEvent, SentEmail


class ReadOnlyAdminMixin:
    """For records the agents write: an audit trail is not edited by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OrderEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = OrderEvent
    extra = 0
    can_delete = False
    fields = readonly_fields = ("created", "kind", "amount", "tool_call_id", "result")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = [
        "number",
        "customer_name",
        "item",
        "amount",
        "status",
        "refunded_amount",
        "updated",
    ]
    list_filter = ["status"]
    search_fields = ["=number", "customer_name", "customer_email", "item"]
    readonly_fields = ["created", "updated"]
    inlines = [OrderEventInline]


@admin.register(OrderEvent)
class OrderEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created", "order", "kind", "amount", "tool_call_id"]
    list_filter = ["kind"]
    search_fields = ["=order__number", "=tool_call_id"]
    list_select_related = ["order"]


@admin.register(SentEmail)
class SentEmailAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created", "to", "subject"]
    search_fields = ["to", "subject", "=tool_call_id"]
