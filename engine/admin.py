"""The run's rows, for staff: runs (with the approval requests of each pause), the states
taken once, and the processes that run agents. All view-only: the engine alone writes them
(a saved form would write back every column it loaded, the status and the signed state among
them, over what the engine wrote meanwhile)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from approvals.models import ApprovalRequest
from common.admin import ReadOnlyAdminMixin, pretty_json
from engine.models import AgentRun, ConsumedState, ServerProcess


class ApprovalRequestInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ApprovalRequest
    fields = ("request_link", "call", "kind", "agent_name", "status", "decided_by", "decided_at")
    readonly_fields = fields
    ordering = ["pause", "pk"]
    extra = 0
    can_delete = False

    @admin.display(description="request")
    def request_link(self, request_obj: ApprovalRequest) -> SafeString:
        url = reverse("admin:approvals_approvalrequest_change", args=[request_obj.pk])
        return format_html(
            '<a href="{}">#{} (pause {})</a>', url, request_obj.pk, request_obj.pause
        )

    @admin.display(description="call")
    def call(self, request_obj: ApprovalRequest) -> str:
        return request_obj.call_display()


RUN_FIELDS = (
    "conversation",
    "agent_name",
    "requested_by",
    "input",
    "status",
    "error",
    "pretty_error_detail",
    "final_output",
    "created",
    "updated",
    "finished",
    "process",
)
RUN_STATE_FIELDS = (
    "pause_count",
    "state_consumed",
    "sdk_version",
    "state_schema_version",
    "agent_fingerprint",
    "state_signature",
    "pretty_state",
)
RUN_TRACE_FIELDS = ("trace_link", "pretty_usage")


def trace_link(trace_id: str, *, show_id: bool = False) -> SafeString | str:
    """A link to the trace viewer's page of this trace."""
    if not trace_id:
        return "-"
    url = reverse("trace_detail", args=[trace_id])
    if show_id:
        return format_html('<a href="{}">View trace</a> <code>{}</code>', url, trace_id)
    return format_html('<a href="{}">View trace</a>', url)


@admin.register(AgentRun)
class AgentRunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "pk",
        "agent_name",
        "status",
        "conversation",
        "requested_by",
        "pause_count",
        "created",
        "updated",
        "finished",
        "trace",
    ]
    list_filter = ["status", "agent_name", "approval_requests__tool_name"]
    search_fields = [
        "conversation__session_id",
        "input",
        "approval_requests__tool_name",
        "=approval_requests__call_id",
    ]
    list_select_related = ["conversation", "requested_by"]
    date_hierarchy = "created"
    fieldsets = [
        (None, {"fields": RUN_FIELDS}),
        ("Saved state", {"fields": RUN_STATE_FIELDS}),
        ("Tracing", {"fields": RUN_TRACE_FIELDS}),
    ]
    readonly_fields = RUN_FIELDS + RUN_STATE_FIELDS + RUN_TRACE_FIELDS
    inlines = [ApprovalRequestInline]

    @admin.display(description="trace")
    def trace(self, run: AgentRun) -> SafeString | str:
        return trace_link(run.trace_id)

    @admin.display(description="trace")
    def trace_link(self, run: AgentRun) -> SafeString | str:
        return trace_link(run.trace_id, show_id=True)

    @admin.display(description="state")
    def pretty_state(self, run: AgentRun) -> SafeString | str:
        return pretty_json(run.state)

    @admin.display(description="error detail")
    def pretty_error_detail(self, run: AgentRun) -> SafeString | str:
        """What failed, for operators: status code, request id, the provider's error."""
        return pretty_json(run.error_detail) if run.error_detail else "-"

    @admin.display(description="usage")
    def pretty_usage(self, run: AgentRun) -> SafeString | str:
        return pretty_json(run.usage)


@admin.register(ConsumedState)
class ConsumedStateAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Which pause's saved state was taken, and when: written by the engine alone."""

    list_display = ["created", "run", "pause", "nonce"]
    search_fields = ["=run__pk", "nonce"]
    date_hierarchy = "created"
    list_select_related = ["run"]
    fields = readonly_fields = ("run", "pause", "nonce", "created")


@admin.register(ServerProcess)
class ServerProcessAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The processes that run agents and their heartbeats: written by the engine alone (a run's
    `process` is one of these identities)."""

    list_display = ["identity", "kind", "host", "pid", "started", "beat", "stopped"]
    list_filter = ["kind", "host"]
    search_fields = ["identity", "host", "=pid"]
    date_hierarchy = "started"
    fields = readonly_fields = ("identity", "kind", "host", "pid", "started", "beat", "stopped")
