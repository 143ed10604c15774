"""Delete old traces with their spans (`AGENTSITE_TRACE_RETENTION_DAYS`)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models.functions import Coalesce
from django.utils import timezone

from tracing.models import Span, Trace

# Traces deleted per transaction: memory stays bounded and no transaction holds the database
# for long, however many traces are due.
CHUNK = 500

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhms]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1, "": 1}


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `3600s` or `3600` (seconds)."""
    match = _AGE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not an age: give e.g. 30d, 12h or a number of seconds.")
    number, unit = match.groups()
    return timedelta(seconds=float(number) * _UNIT_SECONDS[unit.lower()])


class Command(BaseCommand):
    help = (
        "Delete traces (and their spans) that started longer ago than --older-than "
        "(default: AGENTSITE_TRACE_RETENTION_DAYS days)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            help="30d, 12h, or seconds (default: AGENTSITE_TRACE_RETENTION_DAYS days).",
        )

    def handle(self, *args: Any, older_than: str | None, **options: Any) -> None:
        try:
            age = (
                parse_age(older_than)
                if older_than
                else timedelta(days=settings.AGENTSITE_TRACE_RETENTION_DAYS)
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        cutoff = timezone.now() - age
        traces, spans = prune(cutoff)
        self.stdout.write(
            f"Deleted {traces} trace(s) and {spans} span(s) that started before "
            f"{cutoff:%Y-%m-%d %H:%M:%S} UTC."
        )


def prune(cutoff: Any) -> tuple[int, int]:
    """Delete the traces that started (or, with no span yet, were created) before `cutoff`."""
    old = (
        Trace.objects.alias(began=Coalesce("started_at", "created"))
        .filter(began__lt=cutoff)
        .order_by("pk")
    )
    traces = spans = 0
    while True:
        pks = list(old.values_list("pk", flat=True)[:CHUNK])
        if not pks:
            return traces, spans
        # One chunk per transaction; the spans go in one DELETE by their trace ids.
        _, deleted = Trace.objects.filter(pk__in=pks).delete()
        traces += deleted.get(Trace._meta.label, 0)
        spans += deleted.get(Span._meta.label, 0)
