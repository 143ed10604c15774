"""Forms for the reviewers' inbox: query strings are validated here too, fragments included.

A malformed filter (too long, an unknown decision, a page that is not a number) is a 400
with the form's errors; a well-formed filter that matches nothing is an empty list.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import Q, Subquery

from approvals.models import DecisionKind
from engine import runs

MAX_BULK = 200


class InboxFilterForm(forms.Form):
    agent = forms.CharField(required=False, max_length=100)
    tool = forms.CharField(required=False, max_length=200)

    def request_filter(self) -> Q:
        """The filter on `ApprovalRequest` rows."""
        return self._q("")

    def _q(self, prefix: str) -> Q:
        # `prefix` reaches the request from a queryset that joins to it ("request__").
        q = Q()
        if self.cleaned_data.get("agent"):
            q &= Q(**{f"{prefix}agent_name": self.cleaned_data["agent"]})
        if self.cleaned_data.get("tool"):
            q &= Q(**{f"{prefix}tool_name": self.cleaned_data["tool"]})
        return q

    def matches(self, agent_name: str, tool_name: str) -> bool:
        agent, tool = self.cleaned_data.get("agent"), self.cleaned_data.get("tool")
        return (not agent or agent == agent_name) and (not tool or tool == tool_name)


class HistoryFilterForm(InboxFilterForm):
    DECISIONS = [
        ("", "Any decision"),
        ("approved", "Approved"),
        ("rejected", "Rejected"),
        ("responded", "Answered as the tool"),
        ("expired", "Expired"),
    ]

    reviewer = forms.CharField(required=False, max_length=150)
    decision = forms.ChoiceField(required=False, choices=DECISIONS)
    page = forms.IntegerField(required=False, min_value=1)

    def decision_filter(self) -> Q:
        """The filter on `ApprovalDecision` rows."""
        q = self._q("request__")
        if self.cleaned_data.get("reviewer"):
            # The reviewer's id, looked up first: a join to the users would keep PostgreSQL
            # from reading that reviewer's decisions in index order (newest first).
            users = get_user_model().objects.filter(username=self.cleaned_data["reviewer"])
            q &= Q(reviewer=Subquery(users.values("pk")[:1]))
        decision = self.cleaned_data.get("decision")
        # Only the site itself decides without a reviewer: when a request expires.
        if decision == "approved":
            q &= Q(approved=True)
        elif decision == "rejected":
            # An answer as the tool is no rejection: the reviewer gave the call its result.
            q &= Q(approved=False, reviewer__isnull=False) & ~Q(kind=DecisionKind.RESPONDED)
        elif decision == "responded":
            q &= Q(kind=DecisionKind.RESPONDED)
        elif decision == "expired":
            q &= Q(reviewer__isnull=True)
        return q


class InboxSocketForm(InboxFilterForm):
    """What an inbox socket shows: the pending list (with its filter), one request, or only
    the count."""

    SHOW = [("pending", "pending"), ("request", "request"), ("count", "count")]

    show = forms.ChoiceField(required=False, choices=SHOW)
    request = forms.IntegerField(required=False, min_value=1)


class DecisionForm(forms.Form):
    ACTIONS = [
        ("approve", "Approve"),
        ("approve_always", "Approve always (this run)"),
        ("reject", "Reject"),
        ("respond", "Respond as the tool"),
    ]

    action = forms.ChoiceField(choices=ACTIONS)
    message = forms.CharField(
        required=False,
        max_length=runs.MAX_MESSAGE_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    # For reviewers only (the audit and the history): never sent to the agent.
    note = forms.CharField(
        required=False,
        max_length=runs.MAX_MESSAGE_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    # Answering as the tool: exactly what the model reads as the call's output.
    response = forms.CharField(
        required=False,
        max_length=runs.MAX_RESPONSE_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    # The arguments hash that was rendered with the buttons: a decision is about what was seen.
    seen_hash = forms.CharField(min_length=64, max_length=64)
    next = forms.CharField(required=False, max_length=2000)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("action") == "respond" and not cleaned.get("response"):
            self.add_error(
                "response",
                "Write the result the agent should read as the tool's output; it is empty.",
            )
        return cleaned

    @property
    def approve(self) -> bool:
        return self.cleaned_data["action"] not in ("reject", "respond")

    @property
    def tool_output(self) -> str | None:
        """The tool's output the reviewer wrote, when answering as the tool."""
        if self.cleaned_data["action"] != "respond":
            return None
        return str(self.cleaned_data["response"])

    @property
    def always(self) -> bool:
        return self.cleaned_data["action"] == "approve_always"


class RequestIdsField(forms.Field):
    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[int]:
        if not value:
            return []
        try:
            ids = sorted({int(v) for v in value})
        except (TypeError, ValueError):
            raise ValidationError("Requests are chosen by their number.") from None
        if any(pk < 1 for pk in ids):
            raise ValidationError("Requests are chosen by their number.")
        return ids

    def validate(self, value: list[int]) -> None:
        if not value:
            raise ValidationError("Select at least one request.")
        if len(value) > MAX_BULK:
            raise ValidationError(f"Select at most {MAX_BULK} requests at a time.")


class BulkDecisionForm(forms.Form):
    ACTIONS = [("approve", "Approve selected"), ("reject", "Reject selected")]

    action = forms.ChoiceField(choices=ACTIONS)
    ids = RequestIdsField()
    next = forms.CharField(required=False, max_length=2000)

    def seen_hash(self, pk: int) -> str | None:
        """The hash rendered beside request `pk`'s checkbox, if the page sent one."""
        value = self.data.get(f"hash-{pk}")
        return value if isinstance(value, str) and len(value) == 64 else None

    @property
    def approve(self) -> bool:
        return self.cleaned_data["action"] == "approve"
