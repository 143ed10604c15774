"""The demo's orders, for staff. What the agents write (order events, sent emails) is an audit
trail: not added or edited by hand."""

from __future__ import annotations

from django.contrib import admin

from common.admin import NoEditAdminMixin

from .models import Order, OrderEvent, SentEmail


class OrderEventInline(NoEditAdminMixin, admin.TabularInline):
    model = OrderEvent
    extra = 0
    can_delete = False
    fields = readonly_fields = ("created", "kind", "amount", "tool_call_id", "result")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = [
        "number",
        "customer",
        "customer_name",
        "item",
        "amount",
        "status",
        "refunded_amount",
        "updated",
    ]
    list_filter = ["status"]
    search_fields = ["=number", "customer__username", "customer_name", "customer_email", "item"]
    list_select_related = ["customer"]
    raw_id_fields = ["customer"]
    readonly_fields = ["created", "updated"]
    inlines = [OrderEventInline]


@admin.register(OrderEvent)
class OrderEventAdmin(NoEditAdminMixin, admin.ModelAdmin):
    list_display = ["created", "order", "kind", "amount", "tool_call_id"]
    list_filter = ["kind"]
    search_fields = ["=order__number", "=tool_call_id"]
    list_select_related = ["order"]


@admin.register(SentEmail)
class SentEmailAdmin(NoEditAdminMixin, admin.ModelAdmin):
    list_display = ["created", "to", "subject"]
    search_fields = ["to", "subject", "=tool_call_id"]
