"""Traces and their spans, for staff: read-only, as the exporter and the engine stored them.

Nothing is added or changed here (a saved form would overwrite what the exporter writes
meanwhile); a trace may be deleted, with its spans, by staff allowed to.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from common import formatting
from common.admin import NoEditAdminMixin, ReadOnlyAdminMixin, pretty_json
from tracing.models import SPAN_PLACE_FIELDS, Span, Trace


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
        "started_at",
        "duration",
        "total_tokens",
        "run_link",
        "group_id",
        "view_link",
    ]
    list_filter = ["status", "workflow_name"]
    search_fields = ["=trace_id", "workflow_name", "=group_id"]
    list_select_related = ["run"]
    date_hierarchy = "started_at"
    fields = readonly_fields = (
        "trace_id",
        "view_link",
        "workflow_name",
        "group_id",
        "status",
        "run_link",
        "started_at",
        "ended_at",
        "duration",
        "total_tokens",
        "pretty_metadata",
        "created",
        "updated",
    )
    inlines = [SpanInline]

    @admin.display(description="viewer")
    def view_link(self, trace: Trace) -> SafeString:
        url = reverse("trace_detail", args=[trace.trace_id])
        return format_html('<a href="{}">View trace</a>', url)

    @admin.display(description="run")
    def run_link(self, trace: Trace) -> SafeString | str:
        if trace.run_id is None:
            return "-"
        url = reverse("admin:approvals_agentrun_change", args=[trace.run_id])
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
