"""Approval requests and the decisions audit, for staff (the runs are the engine's admin's).

Everything here is the engine's, so it is all view-only: a saved form would write back every
column it loaded over what the engine wrote meanwhile; and decisions are an audit, appended to
by the engine alone.
Requests are decided only through `runs.decide`, by the bulk actions, which answer with the
inbox's bulk confirmation: the admin takes the same path as the inbox, confirmation included:
one winning decision, events, and a resume after commit.

Approval policies are the exception: rules people write, so staff with the model's
permissions edit them here (with the same forms as the reviewers' policy pages). A decision
a rule took keeps the rule's name; editing or deleting the rule changes no decision.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.safestring import SafeString

from approvals.forms import PolicyConditionForm, PolicyForm
from approvals.models import (
    ARGUMENTS_TAMPERED,
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalRequest,
    PolicyCondition,
)
from approvals.views import bulk_confirmation_for
from common.admin import ReadOnlyAdminMixin, ValuesListFilter, pretty_json


class ApprovalDecisionInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = ApprovalDecision
    fields = (
        "created",
        "reviewer",
        "kind",
        "approved",
        "always",
        "message",
        "note",
        "arguments_hash",
    )
    readonly_fields = fields
    ordering = ["created", "pk"]
    extra = 0
    can_delete = False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "pk",
        "call",
        "kind",
        "server",
        "agent_name",
        "status",
        "run",
        "created",
        "expires_at",
        "decided_by",
        "decided_at",
    ]
    list_filter = [
        "status",
        "kind",
        ("server", ValuesListFilter),
        "on_expiry",
        "tool_name",
        "agent_name",
    ]
    search_fields = [
        "run__conversation__session_id",
        "run__input",
        "tool_name",
        "server",
        "=call_id",
    ]
    list_select_related = ["run", "decided_by"]
    date_hierarchy = "created"
    fields = readonly_fields = (
        "run",
        "pause",
        "agent_name",
        "tool_name",
        "kind",
        "server",
        "call_id",
        "origin",
        "pretty_arguments",
        "arguments_hash",
        "status",
        "created",
        "expires_at",
        "on_expiry",
        "escalate_to",
        "expiry_note",
        "escalated_at",
        "reminded_at",
        "decided_by",
        "decided_at",
    )
    inlines = [ApprovalDecisionInline]
    actions = ["approve_selected", "reject_selected"]

    def has_decide_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("approvals.decide_approvalrequest")

    @admin.display(description="call")
    def call(self, request_obj: ApprovalRequest) -> str:
        return request_obj.call_display()

    @admin.display(description="arguments")
    def pretty_arguments(self, request_obj: ApprovalRequest) -> SafeString | str:
        if not request_obj.arguments_intact:
            return ARGUMENTS_TAMPERED
        return pretty_json(request_obj.arguments)

    @admin.action(permissions=["decide"], description="Approve selected")
    def approve_selected(
        self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]
    ) -> HttpResponse:
        return self._confirm_selected(request, queryset, approve=True)

    @admin.action(permissions=["decide"], description="Reject selected")
    def reject_selected(
        self, request: HttpRequest, queryset: QuerySet[ApprovalRequest]
    ) -> HttpResponse:
        return self._confirm_selected(request, queryset, approve=False)

    def _confirm_selected(
        self, request: HttpRequest, queryset: QuerySet[ApprovalRequest], *, approve: bool
    ) -> HttpResponse:
        """The inbox's bulk decision, confirmation first: the action answers with the list of
        what would be decided (exactly the selected requests, read now; those that cannot be
        set apart with the reason), and only its confirm button decides them, each through
        `runs.decide`, then comes back to this list with the outcome."""
        back = request.get_full_path()
        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        return bulk_confirmation_for(request, ids, approve=approve, back=back)  # type: ignore[arg-type]


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The audit trail: append-only, and only the engine appends."""

    list_display = [
        "created",
        "request",
        "reviewer",
        "policy_name",
        "kind",
        "approved",
        "always",
        "message",
        "note",
    ]
    list_filter = ["kind", "approved", "always"]
    search_fields = [
        "request__tool_name",
        "=request__call_id",
        "reviewer__username",
        "message",
        "note",
    ]
    list_select_related = ["request", "reviewer"]
    date_hierarchy = "created"
    fields = readonly_fields = (
        "request",
        "reviewer",
        "policy",
        "policy_name",
        "kind",
        "approved",
        "always",
        "message",
        "note",
        "arguments_hash",
        "edited_arguments",
        "edited_arguments_hash",
        "created",
    )


class PolicyConditionInline(admin.TabularInline):
    model = PolicyCondition
    form = PolicyConditionForm
    extra = 1
    max_num = 20


class _EnabledInList(forms.ModelForm):
    """A row's "enabled" box in the list of rules, named after its rule: Django's list gives
    an editable column's boxes no label (a screen reader reads "checkbox", of which rule?)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "enabled" in self.fields:
            self.fields["enabled"].widget.attrs["aria-label"] = f"{self.instance.name}: enabled"


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(admin.ModelAdmin):
    """Rules that decide paused calls without a person (`engine.policies`), in precedence
    order: the first enabled rule that matches a call decides it."""

    form = PolicyForm
    inlines = [PolicyConditionInline]
    list_display = [
        "priority",
        "name",
        "enabled",
        "action",
        "requires_no_warnings",
        "on_expiry",
        "agent_name",
        "tool_name",
        "conditions_display",
        "decision_count",
        "updated",
        "updated_by",
    ]
    list_display_links = ["name"]
    list_editable = ["enabled"]
    list_filter = ["enabled", "action", ("tool_name", ValuesListFilter)]
    search_fields = ["name", "tool_name", "agent_name", "description"]
    readonly_fields = ["updated_by", "created", "updated"]
    ordering = ["priority", "id"]

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        return super().get_changelist_form(request, form=_EnabledInList, **kwargs)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApprovalPolicy]:
        return (
            super()
            .get_queryset(request)
            .prefetch_related("conditions")
            .select_related("updated_by")
        )

    @admin.display(description="conditions")
    def conditions_display(self, policy: ApprovalPolicy) -> str:
        return " and ".join(str(c) for c in policy.conditions.all()) or "every call"

    @admin.display(description="decisions")
    def decision_count(self, policy: ApprovalPolicy) -> int:
        return policy.decisions.count()

    def save_model(
        self, request: HttpRequest, obj: ApprovalPolicy, form: Any, change: bool
    ) -> None:
        obj.updated_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
