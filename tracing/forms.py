"""The trace list's query string, validated: filters, text search and the keyset cursor.

A malformed query (a date that is not one, an unknown status, a cursor that was not made
here, a range that ends before it starts) is a 400 with the form's errors; a well-formed
filter that matches nothing is an empty list.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from engine.models import AgentRun
from tracing.models import Feedback, FeedbackScore, Span, TraceOutcome, TraceStatus, outcome_filter

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def make_cursor(started_at: datetime, pk: int) -> str:
    """A position in the list, newest first: the row's start (in whole microseconds since
    the epoch, exact) and its primary key, which breaks ties."""
    return f"{(started_at - _EPOCH) // _MICROSECOND}-{pk}"


class CursorField(forms.CharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=40, **kwargs)

    def to_python(self, value: Any) -> tuple[datetime, int] | None:  # type: ignore[override]
        text = super().to_python(value)
        if not text:
            return None
        micros, _, pk = text.partition("-")
        if not (micros.isdigit() and pk.isdigit()):
            raise ValidationError("This page link is not valid; start again from the newest.")
        try:
            return _EPOCH + int(micros) * _MICROSECOND, int(pk)
        except OverflowError:
            raise ValidationError("This page link is not valid.") from None


class TraceFilterForm(forms.Form):
    STATUSES = [("", "Any status"), *TraceStatus.choices]
    OUTCOMES = [("", "Any outcome"), *TraceOutcome.choices]
    FEEDBACK = [("", "Any or none"), ("up", "Thumbs up"), ("down", "Thumbs down"), ("any", "Rated")]

    agent = forms.CharField(required=False, max_length=255)
    conversation = forms.CharField(required=False, max_length=255)
    status = forms.ChoiceField(required=False, choices=STATUSES)
    outcome = forms.ChoiceField(required=False, choices=OUTCOMES)
    user = forms.CharField(required=False, max_length=150)
    tool = forms.CharField(required=False, max_length=255)
    span = forms.CharField(required=False, max_length=200)
    feedback = forms.ChoiceField(required=False, choices=FEEDBACK)
    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    q = forms.CharField(required=False, max_length=200)
    older = CursorField(required=False)
    newer = CursorField(required=False)

    FILTERS = (
        "agent",
        "conversation",
        "status",
        "outcome",
        "user",
        "tool",
        "span",
        "feedback",
        "since",
        "until",
        "q",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        self._bounds: dict[str, datetime] = {}
        since, until = data.get("since"), data.get("until")
        if since and until and until < since:
            raise ValidationError("The date range ends before it starts.")
        # The bounds the filter compares with, computed here so that a day whose midnight
        # (or the next day's) is not a datetime in UTC is an error of its field, not a 500.
        for name, day in (("since", since), ("until", until)):
            if day is None:
                continue
            try:
                self._bounds[name] = _day_start(day if name == "since" else day + timedelta(days=1))
            except OverflowError:
                self.add_error(name, "This date is out of range.")
        if data.get("older") and data.get("newer"):
            raise ValidationError("Page older or newer, not both.")
        return data

    def filter_values(self) -> dict[str, str]:
        """The non-empty filters, as query-string values (for links that keep them)."""
        data = getattr(self, "cleaned_data", {})
        values: dict[str, str] = {}
        for name in self.FILTERS:
            value = data.get(name)
            if isinstance(value, date):
                values[name] = value.isoformat()
            elif value:
                values[name] = str(value)
        return values

    def trace_filter(self) -> Q:
        """The filter on `Trace` rows; each one can use an index of its own."""
        data = self.cleaned_data
        q = Q()
        if data.get("agent"):
            q &= agent_filter(data["agent"])
        if data.get("conversation"):
            q &= Q(group_id=data["conversation"])
        if data.get("status"):
            q &= Q(status=data["status"])
        if "since" in self._bounds:
            q &= Q(started_at__gte=self._bounds["since"])
        if "until" in self._bounds:
            q &= Q(started_at__lt=self._bounds["until"])
        if data.get("q"):
            q &= text_filter(data["q"])
        if data.get("outcome"):
            q &= outcome_filter(data["outcome"])
        if data.get("user"):
            q &= user_filter(data["user"])
        if data.get("tool"):
            q &= tool_filter(data["tool"])
        if data.get("span"):
            q &= span_text_filter(data["span"])
        if data.get("feedback"):
            q &= feedback_filter(data["feedback"])
        return q


def agent_filter(value: str) -> Q:
    """An agent is a trace's workflow name ("agentsite: Support desk") or the name its run
    was started under ("support"): the engine names each run's workflow after its agent, so
    a registered name is looked up as that workflow, through the workflow index."""
    names = {value}
    workflow = registered_workflow(value)
    if workflow:
        names.add(workflow)
    return Q(workflow_name__in=sorted(names))


def registered_workflow(agent_name: str) -> str | None:
    from engine import registry

    if agent_name not in registry.agent_names():
        return None
    try:
        return f"agentsite: {registry.get_agent(agent_name).name}"
    except Exception:  # an agent that no longer imports still has its old traces
        return None


def text_filter(text: str) -> Q:
    """Text search: an exact trace id or span id, an exact group id, part of the workflow
    name, or part of a span's name. Span names have no full-text index: that last part
    reads every span name once per search (not once per trace)."""
    text = text.strip()
    if text.startswith("trace_"):
        return Q(trace_id=text)
    if text.startswith("span_"):
        return Q(trace_id__in=Span.objects.filter(span_id=text).values("trace_id"))
    named = Span.objects.filter(name__icontains=text).values("trace_id")
    return Q(group_id=text) | Q(workflow_name__icontains=text) | Q(trace_id__in=named)


def user_filter(username: str) -> Q:
    """The runs a user asked for or whose conversation is theirs, by exact username: through
    the runs' indexes (requester, conversation) and the traces' run index."""
    username = username.strip()
    runs = AgentRun.objects.filter(
        Q(requested_by__username=username) | Q(conversation__owner__username=username)
    )
    return Q(run__in=runs.values("pk"))


def tool_filter(name: str) -> Q:
    """Traces with a call of the tool `name` (a function span of that exact name): a
    subquery through the `span_tool` index, so a rare tool is found without probing every
    trace's spans."""
    calls = Span.objects.filter(span_type="function", name=name.strip())
    return Q(trace_id__in=calls.values("trace_id"))


def span_text_filter(text: str) -> Q:
    """Traces with a span whose name or error message contains `text` (any case).

    An EXISTS per trace over its spans (the `(trace, started_at)` index): the list walks the
    traces newest first and stops at a page, so a common text costs a page's worth of probes;
    a text found nowhere reads every span once, as the search on span names does (there is no
    full-text index on spans)."""
    text = text.strip()
    spans = Span.objects.filter(trace_id=OuterRef("trace_id")).filter(
        Q(name__icontains=text) | Q(error__message__icontains=text)
    )
    return Q(Exists(spans))


def feedback_filter(value: str) -> Q:
    """Traces whose run was rated: thumbs up, thumbs down, or either ("any")."""
    ratings = Feedback.objects.filter(run_id=OuterRef("run_id"))
    if value == "up":
        ratings = ratings.filter(score=FeedbackScore.UP)
    elif value == "down":
        ratings = ratings.filter(score=FeedbackScore.DOWN)
    return Q(Exists(ratings))


def _day_start(day: date) -> datetime:
    """Midnight of `day` in the site's time zone (dates are picked as people see them), in
    UTC, as the database is given it; OverflowError when that is before year 1 or after 9999."""
    return timezone.make_aware(datetime.combine(day, time.min)).astimezone(UTC)


class TraceIdsField(forms.Field):
    """Trace ids given as a repeated query parameter (`?trace=a&trace=b`)."""

    widget = forms.MultipleHiddenInput

    def __init__(self, *, limit: int, **kwargs: Any) -> None:
        self.limit = limit
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> list[str]:
        ids = [str(item).strip() for item in (value or []) if str(item).strip()]
        if len(ids) > self.limit:
            raise ValidationError(f"Select at most {self.limit:,} traces.")
        if any(len(item) > 64 for item in ids):
            raise ValidationError("This is not a trace id.")
        return list(dict.fromkeys(ids))


class TraceExportForm(TraceFilterForm):
    """The JSONL export: the traces ticked on the list (`trace`), or, without any, every trace
    the list's filters match. "Export selected" with nothing ticked is an error, not all."""

    SELECTED_LIMIT = 1_000

    trace = TraceIdsField(required=False, limit=SELECTED_LIMIT)
    selected = forms.BooleanField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("selected") and not data.get("trace"):
            raise ValidationError("Select the traces to export first.")
        return data

    def export_filter(self) -> Q:
        ids = self.cleaned_data.get("trace")
        return Q(trace_id__in=ids) if ids else self.trace_filter()


class CostRangeForm(forms.Form):
    """The cost page's days (as people see them, in the site's time zone): the last
    `DEFAULT_DAYS` by default, at most `MAX_DAYS`."""

    DEFAULT_DAYS = 30
    MAX_DAYS = 366

    since = forms.DateField(required=False)
    until = forms.DateField(required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        today = timezone.localdate()
        until = data.get("until") or today
        since = data.get("since") or until - timedelta(days=self.DEFAULT_DAYS - 1)
        if until < since:
            raise ValidationError("The date range ends before it starts.")
        if (until - since).days >= self.MAX_DAYS:
            raise ValidationError(f"Pick at most {self.MAX_DAYS} days.")
        try:
            self.bounds = (_day_start(since), _day_start(until + timedelta(days=1)))
        except OverflowError:
            raise ValidationError("This date is out of range.") from None
        data["since"], data["until"] = since, until
        return data
