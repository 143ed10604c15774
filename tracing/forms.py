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
from django.db.models import Q
from django.utils import timezone

from tracing.models import Span, TraceStatus

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

    agent = forms.CharField(required=False, max_length=255)
    conversation = forms.CharField(required=False, max_length=255)
    status = forms.ChoiceField(required=False, choices=STATUSES)
    since = forms.DateField(required=False)
    until = forms.DateField(required=False)
    q = forms.CharField(required=False, max_length=200)
    older = CursorField(required=False)
    newer = CursorField(required=False)

    FILTERS = ("agent", "conversation", "status", "since", "until", "q")

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


def _day_start(day: date) -> datetime:
    """Midnight of `day` in the site's time zone (dates are picked as people see them), in
    UTC, as the database is given it; OverflowError when that is before year 1 or after 9999."""
    return timezone.make_aware(datetime.combine(day, time.min)).astimezone(UTC)
