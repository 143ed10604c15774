"""Traces and their spans, for staff: read-only, as the exporter and the engine stored them;
and the model price table the costs are computed from.

Nothing of a trace is added or changed here (a saved form would overwrite what the exporter
writes meanwhile); a trace may be deleted, with its spans, by staff allowed to. Prices are
kept here: a new one (the "no price for <model>" links open this form with the model filled
in) applies to past calls too, as costs are computed when they are read.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from common import formatting
from common.admin import NoEditAdminMixin, ReadOnlyAdminMixin, ValuesListFilter, pretty_json
from tracing import pricing
from tracing.models import SPAN_PLACE_FIELDS, ModelPrice, Span, Trace


class SpanInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Span
    fields = ("span_link", "span_type", "name", "parent_id", "started_at", "duration", "failed")
    readonly_fields = fields
    ordering = ["started_at", "pk"]
    extra = 0
    can_delete = False
    show_change_link = False

    @admin.display(description="span")
    def span_link(self, span: Span) -> SafeString:
        url = reverse("admin:tracing_span_change", args=[span.pk])
        return format_html('<a href="{}">{}</a>', url, span.span_id)

    @admin.display(description="duration")
    def duration(self, span: Span) -> str:
        return formatting.exact_seconds(span.duration_seconds)

    @admin.display(description="error", boolean=True)
    def failed(self, span: Span) -> bool:
        return span.error is not None


@admin.register(Trace)
class TraceAdmin(NoEditAdminMixin, admin.ModelAdmin):
    list_display = [
        "trace_id",
        "workflow_name",
        "status",
        "outcome_shown",
        "started_at",
        "duration",
        "total_tokens",
        "cost",
        "run_link",
        "group_id",
        "view_link",
    ]
    list_filter = ["status", "outcome", ("workflow_name", ValuesListFilter)]
    search_fields = ["=trace_id", "workflow_name", "=group_id"]
    list_select_related = ["run"]
    date_hierarchy = "started_at"
    fields = readonly_fields = (
        "trace_id",
        "view_link",
        "workflow_name",
        "group_id",
        "status",
        "outcome_shown",
        "outcome_reason",
        "run_link",
        "started_at",
        "ended_at",
        "duration",
        "active_seconds",
        "total_tokens",
        "cost_detail",
        "pretty_metadata",
        "created",
        "updated",
    )
    inlines = [SpanInline]

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The page's traces, each with its cost: one query for them all, not one a row."""
        changelist = super().get_changelist_instance(request)
        traces = list(changelist.result_list)
        costs = pricing.trace_costs(trace.trace_id for trace in traces)
        for trace in traces:
            trace.listed_cost = costs.get(trace.trace_id)
        return changelist

    @admin.display(description="outcome", ordering="outcome")
    def outcome_shown(self, trace: Trace) -> str:
        return trace.get_shown_outcome_display()

    @admin.display(description="cost")
    def cost(self, trace: Trace) -> str:
        cost = getattr(trace, "listed_cost", None)
        return str(cost) if cost is not None and cost.calls else "-"

    @admin.display(description="cost")
    def cost_detail(self, trace: Trace) -> SafeString | str:
        """The money, and each model without a price linked to the form that adds one."""
        cost = pricing.total_cost(Span.objects.filter(trace_id=trace.trace_id))
        if not cost.calls:
            return "-"
        missing = format_html_join(
            " ",
            '<a href="{}">no price for {}</a>',
            ((pricing.add_price_url(model), model) for model in cost.missing),
        )
        return format_html("{} {}", cost.money(), missing)

    @admin.display(description="viewer")
    def view_link(self, trace: Trace) -> SafeString:
        url = reverse("trace_detail", args=[trace.trace_id])
        return format_html('<a href="{}">View trace</a>', url)

    @admin.display(description="run")
    def run_link(self, trace: Trace) -> SafeString | str:
        if trace.run_id is None:
            return "-"
        url = reverse("admin:engine_agentrun_change", args=[trace.run_id])
        return format_html('<a href="{}">Run {}</a>', url, trace.run_id)

    @admin.display(description="duration")
    def duration(self, trace: Trace) -> str:
        return formatting.exact_seconds(trace.duration_seconds)

    @admin.display(description="metadata")
    def pretty_metadata(self, trace: Trace) -> SafeString | str:
        return pretty_json(trace.metadata)


@admin.register(Span)
class SpanAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):  # a trace is deleted whole
    list_display = ["span_id", "span_type", "name", "trace", "started_at", "duration"]
    list_filter = ["span_type"]
    list_select_related = ["trace"]
    search_fields = ["=span_id", "=trace__trace_id", "name"]
    fields = readonly_fields = (
        *SPAN_PLACE_FIELDS,
        "duration",
        "total_tokens",
        "pretty_span_data",
        "pretty_error",
    )

    @admin.display(description="duration")
    def duration(self, span: Span) -> str:
        return formatting.exact_seconds(span.duration_seconds)

    @admin.display(description="span data")
    def pretty_span_data(self, span: Span) -> SafeString | str:
        return pretty_json(span.span_data)

    @admin.display(description="error")
    def pretty_error(self, span: Span) -> SafeString | str:
        return pretty_json(span.error)


CURRENCY = re.compile(r"^[A-Z]{3}$")


class ModelPriceForm(forms.ModelForm):
    """A price: a model's name (or a pattern with *), prices that are not negative, an ISO
    4217 currency code."""

    class Meta:
        model = ModelPrice
        fields = [
            "model",
            "input_per_million",
            "cached_input_per_million",
            "output_per_million",
            "currency",
            "valid_from",
            "note",
        ]

    def clean_model(self) -> str:
        model = str(self.cleaned_data.get("model") or "").strip()
        if not model:
            raise ValidationError("Name the model (or a pattern with *).")
        return model

    def clean_currency(self) -> str:
        currency = str(self.cleaned_data.get("currency") or "").strip().upper()
        if not CURRENCY.match(currency):
            raise ValidationError("Three letters, an ISO 4217 code such as USD or EUR.")
        return currency

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in ("input_per_million", "cached_input_per_million", "output_per_million"):
            value = data.get(name)
            if isinstance(value, Decimal) and value < 0:
                self.add_error(name, "A price cannot be negative.")
        return data


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    form = ModelPriceForm
    list_display = [
        "model",
        "input_per_million",
        "cached_input_per_million",
        "output_per_million",
        "currency",
        "valid_from",
        "note",
    ]
    list_filter = ["currency"]
    search_fields = ["model", "note"]
    ordering = ["model", "-valid_from"]
    date_hierarchy = "valid_from"
