"""`manage.py prune_traces`: traces older than the retention go, with their spans; the age is
read in days, hours or seconds, or taken from AGENTSITE_TRACE_RETENTION_DAYS."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.factories import make_span, make_trace
from tracing.models import Span, Trace

pytestmark = pytest.mark.django_db(transaction=True)


def trace_started_ago(age: timedelta, spans: int = 3) -> Trace:
    """A trace (of the shared `make_trace`) that started, and was created, `age` ago."""
    started = timezone.now() - age
    trace = make_trace(trace_id=f"trace_old_{uuid.uuid4().hex}", started_at=started)
    Trace.objects.filter(pk=trace.pk).update(created=started)
    Span.objects.bulk_create(make_span(trace, "custom") for _ in range(spans))
    return trace


def made() -> Any:
    """The traces `trace_started_ago` made (a browser test's server may store traces of its
    own)."""
    return Trace.objects.filter(trace_id__startswith="trace_old_")


def test_prune_traces_deletes_old_traces_with_their_spans_and_keeps_new_ones() -> None:
    old = [trace_started_ago(timedelta(days=40)) for _ in range(3)]
    recent = trace_started_ago(timedelta(days=2))
    stale_placeholder = trace_started_ago(timedelta(days=31), spans=0)
    Trace.objects.filter(pk=stale_placeholder.pk).update(started_at=None)

    out = StringIO()
    call_command("prune_traces", "--older-than", "30d", stdout=out)

    assert "Deleted 4 trace(s) and 9 span(s)" in out.getvalue()
    assert list(made()) == [recent]
    assert Span.objects.filter(trace__in=made()).count() == 3
    assert not Span.objects.filter(trace_id__in=[o.trace_id for o in old]).exists()


def test_prune_traces_takes_hours_seconds_and_the_retention_setting(settings: Any) -> None:
    trace_started_ago(timedelta(hours=13))
    trace_started_ago(timedelta(hours=1))
    call_command("prune_traces", "--older-than", "12h", stdout=StringIO())
    assert made().count() == 1
    call_command("prune_traces", "--older-than", "60", stdout=StringIO())
    assert made().count() == 0

    settings.AGENTSITE_TRACE_RETENTION_DAYS = 7
    trace_started_ago(timedelta(days=8))
    trace_started_ago(timedelta(days=6))
    call_command("prune_traces", stdout=StringIO())
    assert made().count() == 1


def test_prune_traces_refuses_an_age_it_cannot_read() -> None:
    with pytest.raises(CommandError, match="not an age"):
        call_command("prune_traces", "--older-than", "a month")
