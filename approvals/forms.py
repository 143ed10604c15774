"""Forms for the reviewers' inbox: query strings are validated here too, fragments included.

A malformed filter (too long, an unknown decision, a page that is not a number) is a 400
with the form's errors; a well-formed filter that matches nothing is an empty list.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import signing
from django.core.exceptions import ValidationError
from django.db.models import Q, Subquery

from approvals.models import (
    FILTER_COLUMNS,
    ApprovalPolicy,
    ConditionOperator,
    ConditionSource,
    DecisionKind,
    ExpiryAction,
    PolicyAction,
    PolicyCondition,
    ToolKind,
)
from engine import catalogue, registry, runs

MAX_BULK = 200


class InboxFilterForm(forms.Form):
    COLUMNS = FILTER_COLUMNS

    agent = forms.CharField(required=False, max_length=100)
    tool = forms.CharField(required=False, max_length=200)
    kind = forms.ChoiceField(required=False, choices=[("", "Any kind"), *ToolKind.choices])
    server = forms.CharField(required=False, max_length=200)

    def request_filter(self) -> Q:
        """The filter on `ApprovalRequest` rows."""
        return self._q("")

    def _q(self, prefix: str) -> Q:
        # `prefix` reaches the request from a queryset that joins to it ("request__").
        q = Q()
        for field, column in self.COLUMNS.items():
            if self.cleaned_data.get(field):
                q &= Q(**{f"{prefix}{column}": self.cleaned_data[field]})
        return q

    def matches(self, request: Any) -> bool:
        """Whether the filter selects `request` (an `ApprovalRequest`, or an event that
        carries its columns)."""
        return all(
            not self.cleaned_data.get(field)
            or self.cleaned_data[field] == getattr(request, column, "")
            for field, column in self.COLUMNS.items()
        )


class HistoryFilterForm(InboxFilterForm):
    DECISIONS = [
        ("", "Any decision"),
        ("approved", "Approved"),
        ("rejected", "Rejected"),
        ("responded", "Answered as the tool"),
        ("expired", "Expired"),
        ("withdrawn", "Withdrawn by its user"),
        ("policy", "Decided by a policy"),
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
        # Only the site itself decides without a reviewer or a policy: when a request expires.
        expired = Q(reviewer__isnull=True, policy_name="")
        if decision == "approved":
            q &= Q(approved=True)
        elif decision == "rejected":
            # An answer as the tool is no rejection: the reviewer gave the call its result;
            # nor is the user's taking the request back.
            q &= (
                Q(approved=False)
                & ~expired
                & ~Q(kind__in=[DecisionKind.RESPONDED, DecisionKind.WITHDRAWN])
            )
        elif decision == "responded":
            q &= Q(kind=DecisionKind.RESPONDED)
        elif decision == "expired":
            q &= expired
        elif decision == "withdrawn":
            q &= Q(kind=DecisionKind.WITHDRAWN)
        elif decision == "policy":
            q &= Q(reviewer__isnull=True) & ~Q(policy_name="")
        return q


class InboxSocketForm(InboxFilterForm):
    """What an inbox socket shows: the pending list (with its filter), one request, or only
    the count."""

    SHOW = [("pending", "pending"), ("request", "request"), ("count", "count")]

    show = forms.ChoiceField(required=False, choices=SHOW)
    request = forms.IntegerField(required=False, min_value=1)


def _text_box(rows: int, max_length: int = runs.MAX_MESSAGE_CHARS) -> forms.CharField:
    """An optional text a reviewer writes (a message, a note, an answer), in a box."""
    return forms.CharField(
        required=False,
        max_length=max_length,
        strip=True,
        widget=forms.Textarea(attrs={"rows": rows}),
    )


class DecisionForm(forms.Form):
    ACTIONS = [
        (runs.Action.APPROVE, "Approve"),
        (runs.Action.APPROVE_ALWAYS, "Approve always (this run)"),
        (runs.Action.REJECT, "Reject"),
        (runs.Action.RESPOND, "Respond as the tool"),
        (runs.Action.APPROVE_EDITED, "Approve with these arguments"),
    ]

    action = forms.ChoiceField(choices=ACTIONS)
    message = _text_box(3)
    # For reviewers only (the audit and the history): never sent to the agent.
    note = _text_box(2)
    # Answering as the tool: exactly what the model reads as the call's output.
    response = _text_box(3, max_length=runs.MAX_RESPONSE_CHARS)
    # The arguments hash that was rendered with the buttons: a decision is about what was seen.
    seen_hash = forms.CharField(min_length=64, max_length=64)
    next = forms.CharField(required=False, max_length=2000)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # An edit's arguments come from the `ArgumentsForm` beside it (`decided(arguments)`).
        if cleaned.get("action") not in (None, runs.Action.APPROVE_EDITED):
            try:
                self.decided()
            except runs.InvalidDecision as refused:
                respond = cleaned["action"] == runs.Action.RESPOND
                self.add_error("response" if respond else None, str(refused))
        return cleaned

    @property
    def edits(self) -> bool:
        """Edit, then approve: the arguments come from the `ArgumentsForm` beside it."""
        return self.cleaned_data["action"] == runs.Action.APPROVE_EDITED

    def decided(self, arguments: dict[str, Any] | None = None) -> runs.Decision:
        """The decision posted. The page's one form posts every box: the button pressed
        says which of them go with it (`runs.FIELDS`), the others are left out.

        Raises:
            InvalidDecision: an empty or too long answer as the tool.
        """
        data = self.cleaned_data
        return runs.Decision.of(
            data["action"],
            strict=False,
            message=data.get("message"),
            note=data.get("note"),
            response=data.get("response"),
            arguments=arguments,
        )


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
    message = _text_box(3)
    note = _text_box(2)
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
        return self.cleaned_data["action"] == runs.Action.APPROVE

    def decided(self) -> runs.Decision:
        """The decision each selected request gets: a rejection's message and note, the same
        for each; an approval's note (`runs.FIELDS`)."""
        data = self.cleaned_data
        return runs.Decision.of(
            data["action"], strict=False, message=data.get("message"), note=data.get("note")
        )

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


# --- edit, then approve: a form generated from the tool's JSON schema -----------------------

# A text this long, or with a line break, is edited in a box of several lines.
LONG_TEXT = 80


class TextField(forms.CharField):
    """Text as the reviewer wrote it: a browser's CRLF line breaks back to LF, nothing
    stripped (a body's leading or trailing spaces are the reviewer's to keep)."""

    def to_python(self, value: Any) -> str:
        return str(super().to_python(value)).replace("\r\n", "\n")


class NumberField(forms.FloatField):
    """A JSON number as written: `80` stays the integer 80 (and its hash the model's), `80.5`
    is a float."""

    def to_python(self, value: Any) -> int | float | None:  # type: ignore[override]
        number = super().to_python(value)
        text = str(value).strip()
        if number is not None and text.lstrip("-").isdigit():
            return int(text)
        return number


def _kinds(schema: dict[str, Any]) -> tuple[set[str], bool, list[Any] | None]:
    """A property's JSON types, whether it may be null, and its enum (if any): from `type`
    (a name or a list) and `anyOf` branches, as pydantic writes `X | None`."""
    any_of = schema.get("anyOf")
    branches: list[Any] = any_of if isinstance(any_of, list) else [schema]
    types: set[str] = set()
    enum: list[Any] | None = None
    for branch in branches:
        if not isinstance(branch, dict):
            continue
        declared = branch.get("type")
        types |= set(declared) if isinstance(declared, list) else {str(declared or "")}
        if isinstance(branch.get("enum"), list):
            enum = list(branch["enum"])
    nullable = "null" in types
    types.discard("null")
    types.discard("")
    return types, nullable, enum


def argument_field(schema: dict[str, Any], value: Any, required: bool) -> forms.Field:
    """The form field for one argument of a tool's JSON schema, prefilled with `value`."""
    label = str(schema.get("title") or "")
    hint = str(schema.get("description") or "")
    types, nullable, enum = _kinds(schema)
    must = required and not nullable
    common: dict[str, Any] = {"label": label, "help_text": hint, "initial": value}
    if enum is not None:
        choices = [(json.dumps(option), str(option)) for option in enum]
        return forms.TypedChoiceField(
            choices=([] if must else [("", "—")]) + choices,
            coerce=json.loads,
            empty_value=None,
            required=must,
            **{**common, "initial": json.dumps(value) if value is not None else ""},
        )
    if types == {"integer"}:
        return forms.IntegerField(required=must, **common)
    if types and types <= {"integer", "number"}:
        return NumberField(required=must, **common)
    if types == {"boolean"}:
        return forms.TypedChoiceField(
            choices=([] if must else [("", "—")]) + [("true", "yes"), ("false", "no")],
            coerce=lambda v: v == "true",
            empty_value=None,
            required=must,
            **{**common, "initial": "" if value is None else ("true" if value else "false")},
        )
    if types == {"string"}:
        long = isinstance(value, str) and ("\n" in value or len(value) > LONG_TEXT)
        widget = forms.Textarea(attrs={"rows": 6}) if long else forms.TextInput()
        return TextField(required=False, strip=False, empty_value="", widget=widget, **common)
    # Arrays, objects, several types: their JSON.
    return forms.JSONField(required=must, widget=forms.Textarea(attrs={"rows": 4}), **common)


class ArgumentsForm(forms.Form):
    """A call's arguments, to edit before approving: one field per property of the tool's
    JSON schema (its title, its description as help), in the schema's order, prefilled with
    the model's; what it gives is checked against the whole schema (`registry.argument_errors`,
    with `jsonschema`). Keys the schema does not know stay as the model sent them.

    Its fields are named `arg-<property>`, beside the decision form's."""

    prefix = "arg"

    def __init__(
        self, sheet: registry.ToolSheet, arguments: dict[str, Any], *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.sheet = sheet
        self.original = arguments
        self.required = set(sheet.schema.get("required") or [])
        self.edited: dict[str, Any] = {}
        for name, schema in sheet.properties:
            field = argument_field(schema, arguments.get(name), name in self.required)
            field.label = field.label or name.replace("_", " ").capitalize()
            self.fields[name] = field

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        edited = dict(self.original)
        for name, _ in self.sheet.properties:
            value = cleaned.get(name)
            _, nullable, _ = _kinds(dict(self.sheet.properties)[name])
            if value == "" and nullable:
                value = None
            if value is None and name not in self.original and name not in self.required:
                continue  # left out by the model and by the reviewer
            edited[name] = value
        for error in registry.argument_errors(self.sheet.schema, edited):
            self.add_error(None, error)
        self.edited = edited
        return cleaned


# --- approval policies: the rule forms of the admin and of the reviewers' policy pages --------

ARGUMENT_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
ORDERING = (
    ConditionOperator.LESS,
    ConditionOperator.AT_MOST,
    ConditionOperator.MORE,
    ConditionOperator.AT_LEAST,
)
TEXT_OPERATORS = (
    ConditionOperator.CONTAINS,
    ConditionOperator.STARTS_WITH,
    ConditionOperator.ENDS_WITH,
)


class PolicyForm(forms.ModelForm[ApprovalPolicy]):
    """A rule, checked so that it can match a call: the agent and tool it names must be ones
    a call can carry (`engine.catalogue.unknown_names`), unless its writer says to save it anyway
    (an agent or tool that comes later). Only a name that changed is checked."""

    save_anyway = forms.BooleanField(
        label="Save anyway (the agent or tool may come later)",
        required=False,
        help_text="Only for an agent or tool that no registered agent has yet: the rule "
        "matches no call until one does.",
    )

    class Meta:
        model = ApprovalPolicy
        fields = [
            "name",
            "enabled",
            "priority",
            "agent_name",
            "tool_name",
            "save_anyway",
            "action",
            "requires_no_warnings",
            "message",
            "on_expiry",
            "escalate_to",
            "description",
        ]
        widgets = {
            "message": forms.Textarea(attrs={"rows": 2}),
            "description": forms.Textarea(attrs={"rows": 2}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The names no call carries, as the last validation found them (saved anyway or not).
        self.unknown_names: list[catalogue.UnknownName] = []

    @property
    def changed_data(self) -> list[str]:
        # What changed on the rule (the admin's history says so): not the confirmation.
        return [name for name in super().changed_data if name != "save_anyway"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        for name in ("name", "agent_name", "tool_name"):
            if isinstance(data.get(name), str):
                data[name] = data[name].strip()
        self._check_names(data)
        if data.get("message", "").strip() and data.get("action") != PolicyAction.REJECT:
            self.add_error(
                "message",
                "Only a rejecting rule has a message: the agent reads it instead of "
                "the tool's output.",
            )
        on_expiry, group = data.get("on_expiry"), (data.get("escalate_to") or "").strip()
        data["escalate_to"] = group if on_expiry == ExpiryAction.ESCALATE else ""
        if on_expiry and data.get("action") == PolicyAction.REJECT:
            self.add_error(
                "on_expiry",
                "A rejecting rule decides at the pause: none of its calls waits, so none expires.",
            )
        if on_expiry == ExpiryAction.ESCALATE and not group:
            self.add_error("escalate_to", "Name the group to escalate to.")
        elif on_expiry == ExpiryAction.ESCALATE and not Group.objects.filter(name=group).exists():
            self.add_error("escalate_to", f"There is no group called “{group}”.")
        if data.get("action") != PolicyAction.APPROVE:
            data["requires_no_warnings"] = False  # only an approving rule reads the facts
        return data

    def _check_names(self, data: dict[str, Any]) -> None:
        names = ("agent_name", "tool_name")
        if not any(name in self.changed_data for name in names):
            return  # as saved before: checked then, or saved anyway
        if any(name in self.errors for name in names):
            return
        self.unknown_names = catalogue.unknown_names(
            str(data.get("agent_name") or ""), str(data.get("tool_name") or "")
        )
        if not data.get("save_anyway"):
            for problem in self.unknown_names:
                self.add_error(problem.field, problem.message)


class PolicyConditionForm(forms.ModelForm[PolicyCondition]):
    """One condition, checked so that it can be evaluated: a number where it compares
    numbers, a list where it asks for one, text where it reads text."""

    class Meta:
        model = PolicyCondition
        fields = ["argument", "operator", "compare_to", "value"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        argument = str(data.get("argument") or "").strip()
        data["argument"] = argument
        if argument and not ARGUMENT_PATH.match(argument):
            self.add_error(
                "argument",
                "Name an argument as the tool's schema does (letters, digits, _ or -), or a "
                "field of one as argument.field.",
            )
        operator, source = data.get("operator"), data.get("compare_to")
        value = str(data.get("value") or "").strip()
        data["value"] = value
        if source != ConditionSource.VALUE:
            if operator in ORDERING:
                self.add_error(
                    "compare_to", "The user's email address and username are text, not numbers."
                )
            return data
        if operator in ORDERING:
            try:
                number = Decimal(value)
            except InvalidOperation:
                number = None
            if number is None or not number.is_finite():
                self.add_error(
                    "value",
                    f"“{ConditionOperator(operator).label}” compares numbers: write a number.",
                )
        elif operator in (ConditionOperator.ONE_OF, ConditionOperator.NOT_ONE_OF):
            if not [part for part in value.split(",") if part.strip()]:
                self.add_error("value", "Write the values, separated by commas.")
        elif operator in TEXT_OPERATORS and not value:
            self.add_error("value", "Write the text to look for.")
        return data


PolicyConditionFormSet = forms.inlineformset_factory(
    ApprovalPolicy,
    PolicyCondition,
    form=PolicyConditionForm,
    extra=1,
    max_num=20,
    validate_max=True,
    can_delete=True,
)
