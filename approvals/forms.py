"""Forms for the reviewers' inbox: query strings are validated here too, fragments included.

A malformed filter (too long, an unknown decision, a page that is not a number) is a 400
with the form's errors; a well-formed filter that matches nothing is an empty list.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.exceptions import ValidationError
from django.db.models import Q, Subquery

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
            q &= Q(approved=False, reviewer__isnull=False)
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
    # The arguments hash that was rendered with the buttons: a decision is about what was seen.
    seen_hash = forms.CharField(min_length=64, max_length=64)
    next = forms.CharField(required=False, max_length=2000)

    @property
    def approve(self) -> bool:
        return self.cleaned_data["action"] != "reject"

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
    """A bulk decision, in two steps. Without `confirm` it asks for a confirmation (the view
    lists the requests from the database); with it, the ids and hashes posted must be
    exactly the ones that confirmation listed (`confirmation_token`), and they are decided."""

    ACTIONS = [("approve", "Approve selected"), ("reject", "Reject selected")]

    action = forms.ChoiceField(choices=ACTIONS)
    ids = RequestIdsField()
    next = forms.CharField(required=False, max_length=2000)
    # A rejection's two messages, as on one request (`DecisionForm`).
    message = forms.CharField(
        required=False,
        max_length=runs.MAX_MESSAGE_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    note = forms.CharField(
        required=False,
        max_length=runs.MAX_MESSAGE_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
    )
    confirm = forms.CharField(required=False, max_length=500)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        # Why a posted confirmation was not taken ("" when there was none or it holds).
        self.confirm_problem = ""

    def seen_hash(self, pk: int) -> str | None:
        """The hash rendered beside request `pk`'s checkbox, if the page sent one."""
        value = self.data.get(f"hash-{pk}")
        return value if isinstance(value, str) and len(value) == 64 else None

    @property
    def approve(self) -> bool:
        return self.cleaned_data["action"] == "approve"

    def is_confirmed(self) -> bool:
        """Whether this POST carries a confirmation that holds: the second step. A token
        signed for other ids, hashes, action or reviewer, or one too old, does not
        (`confirm_problem` says why)."""
        token = self.cleaned_data.get("confirm")
        if not token:
            return False
        try:
            signed = signing.loads(token, salt=CONFIRM_SALT, max_age=CONFIRM_MAX_AGE)
        except signing.SignatureExpired:
            self.confirm_problem = (
                "This confirmation is too old; check the requests again before deciding them."
            )
            return False
        except signing.BadSignature:
            signed = None
        posted = {pk: self.seen_hash(pk) for pk in self.cleaned_data["ids"]}
        digest = confirmation_digest(self.user.pk, self.cleaned_data["action"], posted)
        if not isinstance(signed, str) or not hmac.compare_digest(signed, digest):
            self.confirm_problem = MISMATCH
            return False
        return True


CONFIRM_SALT = "approvals.bulk-confirm"
# How long a confirmation may be taken (seconds): past it, the requests are listed again.
CONFIRM_MAX_AGE = 30 * 60
MISMATCH = (
    "This confirmation does not match the requests it listed; check them again before "
    "deciding them."
)


def confirmation_digest(user_id: int | None, action: str, hashes: dict[int, str | None]) -> str:
    """What a confirmation is about: who, which action, which requests with which arguments."""
    listed = ",".join(f"{pk}:{hashes[pk] or ''}" for pk in sorted(hashes))
    return hashlib.sha256(f"{user_id}|{action}|{listed}".encode()).hexdigest()


def confirmation_token(user_id: int | None, action: str, hashes: dict[int, str]) -> str:
    """The token a confirmation posts back: `hashes` are the requests it lists, each with
    the arguments hash it shows."""
    return signing.dumps(confirmation_digest(user_id, action, dict(hashes)), salt=CONFIRM_SALT)
