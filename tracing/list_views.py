"""The trace list (`/traces/`): every run's trace, newest first, filtered and searched, a page
at a time by keyset, each row with its spans, cost and the end users' ratings.

For operators (`access.trace_viewer_required`). Its rows (`TraceListRow`, `with_runs`) are also
what the JSONL export reads (`export_views`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Prefetch, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from common import formatting
from engine.models import AgentRun
from tracing import pricing, redaction
from tracing.access import trace_viewer_required
from tracing.forms import TraceFilterForm, make_cursor, registered_workflow
from tracing.models import Feedback, FeedbackScore, Span, Trace, TraceOutcome
from tracing.pricing import Cost

PAGE_SIZE = 50

# How long the user's input is on a row; the whole of it (masked) is its title.
INPUT_CHARS = 120
TITLE_CHARS = 2_000


@dataclass
class Ratings:
    """End users' thumbs on a trace's run."""

    up: int = 0
    down: int = 0

    def __bool__(self) -> bool:
        return bool(self.up or self.down)


@dataclass
class TraceListRow:
    """A row of the trace list: a trace, how many spans it has, what its calls cost and how
    its run was rated."""

    trace: Trace
    span_count: int
    cost: Cost | None = None
    ratings: Ratings = field(default_factory=Ratings)
    shown_cost: pricing.Shown | None = None

    @property
    def run(self) -> AgentRun | None:
        return self.trace.run

    @property
    def agent(self) -> str:
        if self.run is not None and self.run.agent_name:
            return self.run.agent_name
        metadata = self.trace.metadata if isinstance(self.trace.metadata, dict) else {}
        return str(metadata.get("agent") or "")

    @property
    def user(self) -> str:
        """Who asked: the run's requester, else its conversation's owner."""
        run = self.run
        if run is None:
            return ""
        person = run.requested_by or run.conversation.owner
        return person.get_username() if person is not None else ""

    @cached_property
    def input_text(self) -> str:
        """The user's input, masked (the run stores it as written), for the row's title."""
        if self.run is None or not self.run.input:
            return ""
        return formatting.preview(str(redaction.clean(self.run.input)), TITLE_CHARS)

    @property
    def input_preview(self) -> str:
        return formatting.preview(self.input_text, INPUT_CHARS)

    @property
    def outcome(self) -> str:
        return self.trace.shown_outcome

    @property
    def outcome_label(self) -> str:
        return self.trace.get_shown_outcome_display()

    @property
    def reason(self) -> str:
        """Why it ended so (a failure's first line, which call was decided how); none for a
        run that simply completed or is still going."""
        if self.outcome in (TraceOutcome.COMPLETED, TraceOutcome.RUNNING, TraceOutcome.WAITING):
            return ""
        return self.trace.outcome_reason.splitlines()[0] if self.trace.outcome_reason else ""

    @property
    def duration(self) -> str:
        return formatting.duration(self.trace.duration_seconds)

    @property
    def active(self) -> str:
        return formatting.duration(self.trace.active_seconds)

    @property
    def waiting(self) -> str:
        waiting = self.trace.waiting_seconds
        return formatting.duration(waiting) if waiting else "—"

    @property
    def tokens(self) -> str:
        return f"{self.trace.total_tokens:,}"


@dataclass
class ListPage:
    rows: list[TraceListRow]
    older: str = ""  # the cursor of the next, older page, if there is one
    newer: str = ""  # the cursor of the previous, newer page, if there is one


# A run's columns the list never reads (its saved state can be large).
RUN_UNREAD = ("state", "streamed_text", "final_output", "usage", "error", "error_detail")


def with_runs(traces: QuerySet[Trace], unread: Iterable[str] = RUN_UNREAD) -> QuerySet[Trace]:
    """`traces` with their runs, each run's requester and its conversation's owner, read in
    one more query for the whole page: joined into the page's own query, they would turn the
    planner from the keyset's index walk to a scan and a sort."""
    runs = AgentRun.objects.select_related("requested_by", "conversation__owner").defer(*unread)
    return traces.prefetch_related(Prefetch("run", queryset=runs))


def listed_traces(filters: Q | None = None) -> QuerySet[Trace]:
    """Traces with at least one stored span (a trace has no time before that), filtered,
    with their runs (`with_runs`). A trace without spans yet is still reachable by its id."""
    traces = with_runs(Trace.objects.filter(started_at__isnull=False))
    return traces.filter(filters) if filters is not None else traces


def list_page(
    filters: Q,
    older: tuple[datetime, int] | None = None,
    newer: tuple[datetime, int] | None = None,
) -> ListPage:
    """One page of traces, newest first, by keyset: a page costs the same at row 100,000 as
    at row 1, reads through the `-started_at` (or `status, -started_at`) index, and counts
    nothing."""
    traces = listed_traces(filters)
    if newer is not None:
        at, pk = newer
        # Written as a range on started_at, so the index bounds the scan.
        after = traces.filter(Q(started_at__gte=at) & (Q(started_at__gt=at) | Q(pk__gt=pk)))
        found = list(after.order_by("started_at", "pk")[: PAGE_SIZE + 1])
        if len(found) > PAGE_SIZE:
            page = found[:PAGE_SIZE][::-1]
            return _page(page, has_older=True, has_newer=True)
        # Too close to the top for a full page: show the newest page instead.
    if older is not None and newer is None:
        at, pk = older
        traces = traces.filter(Q(started_at__lte=at) & (Q(started_at__lt=at) | Q(pk__lt=pk)))
    found = list(traces.order_by("-started_at", "-pk")[: PAGE_SIZE + 1])
    return _page(found[:PAGE_SIZE], has_older=len(found) > PAGE_SIZE, has_newer=older is not None)


def _page(traces: list[Trace], *, has_older: bool, has_newer: bool) -> ListPage:
    ids = [trace.trace_id for trace in traces]
    counts = span_counts(ids)
    costs = pricing.trace_costs(ids) if ids else {}
    ratings = run_ratings(trace.run_id for trace in traces if trace.run_id is not None)
    rows = [
        TraceListRow(
            trace,
            counts.get(trace.trace_id, 0),
            costs.get(trace.trace_id),
            ratings.get(trace.run_id, Ratings()) if trace.run_id is not None else Ratings(),
        )
        for trace in traces
    ]
    page = ListPage(rows)
    if traces and has_older:
        last = traces[-1]
        assert last.started_at is not None
        page.older = make_cursor(last.started_at, last.pk)
    if traces and has_newer:
        first = traces[0]
        assert first.started_at is not None
        page.newer = make_cursor(first.started_at, first.pk)
    return page


def span_counts(trace_ids: Iterable[str]) -> dict[str, int]:
    """Spans per trace, in one query over the (trace, started_at) index."""
    ids = list(trace_ids)
    if not ids:
        return {}
    rows = (
        Span.objects.filter(trace_id__in=ids)
        .order_by()
        .values("trace_id")
        .annotate(count=Count("pk"))
        .values_list("trace_id", "count")
    )
    return {str(trace_id): int(count) for trace_id, count in rows}


def run_ratings(run_ids: Iterable[int]) -> dict[int, Ratings]:
    """Thumbs up and down per run, in one query over the feedback's run index."""
    ids = list(run_ids)
    if not ids:
        return {}
    rows = (
        Feedback.objects.filter(run_id__in=ids)
        .order_by()
        .values("run_id")
        .annotate(
            up=Count("pk", filter=Q(score=FeedbackScore.UP)),
            down=Count("pk", filter=Q(score=FeedbackScore.DOWN)),
        )
        .values_list("run_id", "up", "down")
    )
    return {int(run_id): Ratings(int(up), int(down)) for run_id, up, down in rows}


def agent_choices() -> list[str]:
    """Suggestions for the agent filter: each registered agent and its runs' workflow."""
    from engine import registry

    choices: list[str] = []
    for name in registry.agent_names():
        choices.append(name)
        workflow = registered_workflow(name)
        if workflow:
            choices.append(workflow)
    return choices


@require_GET
@login_required
@trace_viewer_required
def trace_list(request: HttpRequest) -> HttpResponse:
    """Every run's trace, newest first, filtered and searched, a page at a time."""
    form = TraceFilterForm(request.GET)
    valid = form.is_valid()
    if valid:
        data = form.cleaned_data
        page = list_page(form.trace_filter(), older=data.get("older"), newer=data.get("newer"))
        filters = form.filter_values()
    else:
        page, filters = ListPage([]), {}
    may_price = pricing.may_add_prices(request.user)
    for row in page.rows:
        row.shown_cost = pricing.shown(row.cost, links=may_price)
    query = urlencode(filters)
    context = {
        "form": form,
        "page": page,
        "filtered": bool(filters),
        "export_all_url": reverse("trace_export_jsonl") + (f"?{query}" if query else ""),
        "outcome_choices": TraceFilterForm.OUTCOMES[1:],
        "feedback_choices": TraceFilterForm.FEEDBACK[1:],
        "older_url": _list_url({**filters, "older": page.older}) if page.older else "",
        "newer_url": _list_url({**filters, "newer": page.newer}) if page.newer else "",
        "newest_url": _list_url(filters) if page.newer else "",
        "query": query,
        "agent_choices": agent_choices(),
        "status_choices": TraceFilterForm.STATUSES[1:],
    }
    return render(request, "tracing/trace_list.html", context, status=200 if valid else 400)


def _list_url(values: dict[str, str]) -> str:
    query = urlencode({name: value for name, value in values.items() if value})
    return reverse("trace_list") + (f"?{query}" if query else "")
