"""The trace viewer: every run's trace, one trace as a tree and a waterfall, one span's details,
and a trace as the SDK exports it (JSON).

For operators: staff, or users with the permission `tracing.view_trace`. Everything shown is
read from the database; spans hold model and user text, so templates escape all of it.
A trace page is live (see `consumers.TraceConsumer`): the exporter announces each batch it
stores and the page re-reads its tree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models import Case, CharField, Count, Prefetch, Q, QuerySet, Value, When
from django.db.models.fields.json import KT
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import NoReverseMatch, reverse
from django.utils.http import content_disposition_header, urlencode
from django.views.decorators.http import require_GET

from common import formatting
from common.http import HtmxHttpRequest
from engine import events, permissions
from engine.models import FINISHED_STATUSES, AgentRun
from tracing import pricing, redaction
from tracing import tree as trees
from tracing.forms import TraceFilterForm, make_cursor, registered_workflow
from tracing.models import (
    SPAN_PLACE_FIELDS,
    Feedback,
    FeedbackScore,
    Span,
    Trace,
    TraceOutcome,
    TraceStatus,
    trace_status,
)
from tracing.pricing import Cost
from tracing.recording import DECISION_SPAN_NAME

PAGE_SIZE = 50
OTHER_RUNS = 10
# Longer values (a long conversation in a generation's input) are cut; the export has all.
PREVIEW_CHARS = 20_000

# What a tree row shows; the span data, which can be large, is left in the database.
TREE_FIELDS = (*SPAN_PLACE_FIELDS, "error", "total_tokens")


# --- access ---------------------------------------------------------------------------------


# 403 for a signed-in user who may not see traces (stack under login_required).
trace_viewer_required = permissions.allowed_only(
    permissions.can_view_traces, "Only operators can see traces."
)


def _get_trace_for_viewer(request: HttpRequest, trace_id: str) -> Trace:
    """The trace `trace_id`, or 404. Every operator sees every trace, so the access check
    is the view's `trace_viewer_required`.

    A run's trace has no row until its first spans are stored (a second or so after it
    starts): until then it is shown empty, unsaved, so that a link to a run that just
    started opens a page that fills in live rather than a 404.
    """
    trace = Trace.objects.filter(trace_id=trace_id).first()
    if trace is not None:
        return trace
    run = AgentRun.objects.filter(trace_id=trace_id).select_related("conversation").first()
    if run is None:
        raise Http404("No such trace.")
    return Trace(
        trace_id=trace_id,
        run=run,
        group_id=run.conversation.session_id,
        status=trace_status(run.status),
        metadata={"run_id": str(run.pk), "agent": run.agent_name},
    )


# --- the list -------------------------------------------------------------------------------


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


# --- one trace ------------------------------------------------------------------------------


def tree_spans(trace: Trace) -> QuerySet[Span]:
    """The spans of a trace for its tree, without their data, but with the few values a row
    shows from it (a guardrail's verdict, a decision)."""
    decision = Q(span_type="custom", name=DECISION_SPAN_NAME)
    return (
        Span.objects.filter(trace_id=trace.trace_id)
        .order_by("started_at", "pk")
        .only(*TREE_FIELDS)
        .annotate(
            tripped=Case(
                When(span_type="guardrail", then=KT("span_data__triggered")),
                default=Value(None),
                output_field=CharField(),
            ),
            decision=Case(
                When(decision, then=KT("span_data__data__decision")),
                default=Value(None),
                output_field=CharField(),
            ),
            reviewer=Case(
                When(decision, then=KT("span_data__data__reviewer")),
                default=Value(None),
                output_field=CharField(),
            ),
        )
    )


def other_runs(trace: Trace) -> list[Trace]:
    """The other traces of the same conversation (group id), newest first."""
    if not trace.group_id:
        return []
    others = Trace.objects.filter(group_id=trace.group_id).exclude(trace_id=trace.trace_id)
    return list(others.order_by("-started_at", "-pk")[:OTHER_RUNS])


def skeleton(trace: Trace) -> trees.Skeleton:
    """The trace's shape: one light query over the (trace, started_at) index, three narrow
    values a span (its id, its parent's, 1 if it has an error), whatever the trace holds."""
    has_error = Case(When(error__isnull=False, then=Value(1)), default=Value(0))
    links = (
        Span.objects.filter(trace_id=trace.trace_id)
        .order_by("started_at", "pk")
        .values_list("span_id", "parent_id", has_error)
    )
    return trees.Skeleton.of(links)


def shown_tree(
    trace: Trace, shape: trees.Skeleton, view: trees.View, tops: list[Any]
) -> trees.Tree:
    """The rows `view` shows from `tops`, read in one query (of those rows only, unless the
    whole trace is shown)."""
    items = view.items(tops)
    spans = tree_spans(trace)
    if not view.whole:
        ids = [item[1] for item in items if isinstance(item, tuple)]
        spans = spans.filter(span_id__in=ids)
    by_id = {span.span_id: span for span in spans}
    if view.whole:  # drawn on its spans' own time scale
        return trees.arrange(shape, items, by_id)
    # Drawn on the whole trace's scale (the exporter keeps the trace's first start and last
    # end), so that a loaded subtree's bars line up with the rows already shown.
    return trees.arrange(shape, items, by_id, started_at=trace.started_at, ended_at=trace.ended_at)


class TreeStateForm(forms.Form):
    """What the reader has loaded of a big trace, sent back by a live refresh so that it
    keeps it: the spans whose subtrees were loaded, and per span how many children."""

    open = forms.Field(required=False, widget=forms.MultipleHiddenInput)
    more = forms.Field(required=False, widget=forms.MultipleHiddenInput)

    LIMIT = 200

    def clean_open(self) -> list[str]:
        values = self.cleaned_data.get("open") or []
        return [str(value) for value in values if 0 < len(str(value)) <= 64][: self.LIMIT]

    def clean_more(self) -> dict[str, int]:
        loaded: dict[str, int] = {}
        for value in (self.cleaned_data.get("more") or [])[: self.LIMIT]:
            span_id, _, count = str(value).rpartition(":")
            if span_id and len(span_id) <= 64 and count.isdigit():
                loaded[span_id] = min(int(count), 1_000_000)
        return loaded


def tree_context(
    trace: Trace,
    *,
    opened: Iterable[str] = (),
    more: dict[str, int] | None = None,
    selected: str = "",
    price_links: bool = False,
) -> dict[str, Any]:
    """What the page's `tree` and `summary` partials need, for the page and its refreshes.
    A big trace shows its top levels (`trees.View.first`), and what the reader loaded.
    `price_links`: link each model without a price to the form that adds it
    (`pricing.may_add_prices`)."""
    shape = skeleton(trace)
    shown = [selected] if selected in shape else []
    view = trees.View.first(shape, opened=[*opened, *shown], shown=shown, more=more)
    tree = shown_tree(trace, shape, view, view.visible(None))
    run = _run_of(trace)
    return {
        "trace": trace,
        "tree": tree,
        "summary": summary_context(trace, run, price_links=price_links),
        "child_page": trees.CHILD_PAGE,
        "live_state": live_state(trace, run, tree),
        "span_count": tree.span_count,
        "span_total": f"{tree.span_count:,}",
        "error_count": tree.error_count,
        "tokens": f"{trace.total_tokens:,}",
        "duration": formatting.duration(tree.duration_seconds),
        "ticks": [
            {
                "x": f"{tick['percent']:.3f}%",
                "label": formatting.duration(tick["seconds"]) if tick["percent"] else "0",
            }
            for tick in tree.ticks()
        ],
        **_tree_urls(trace),
    }


def _run_of(trace: Trace) -> AgentRun | None:
    """The trace's run with its conversation's owner and its asker (one query)."""
    if trace.run_id is None:
        return None
    return (
        AgentRun.objects.filter(pk=trace.run_id)
        .select_related("conversation__owner", "requested_by")
        .first()
    )


def live_state(trace: Trace, run: AgentRun | None, tree: trees.Tree) -> str:
    """Whether the page may still change: "done" once the trace has its outcome (OK or
    error), its run (if any) finished and its root spans stored and ended (the exporter's
    last batch can land a second after the run's end); "waiting" while its run waits for a
    reviewer; else "running"."""
    if trace.status == TraceStatus.WAITING or (run is not None and run.status == "waiting"):
        return "waiting"
    finished = run is None or run.status in FINISHED_STATUSES
    roots = [row for row in tree.rows if row.depth == 0]
    if (
        trace.status in (TraceStatus.OK, TraceStatus.ERROR)
        and finished
        and roots
        and not any(row.open for row in roots)
    ):
        return "done"
    return "running"


# How much of the user's input and of the reply the summary shows (masked).
SUMMARY_CHARS = 600


def summary_context(
    trace: Trace, run: AgentRun | None, *, price_links: bool = False
) -> dict[str, Any]:
    """The summary of a trace for operators: how its run ended and why, its active and
    waiting time, its tokens and cost, who asked what, and what they thought of the reply."""
    usage = pricing.usage_rows(Span.objects.filter(trace_id=trace.trace_id)) if trace.pk else []
    book = pricing.PriceBook.load() if usage else None
    cost = pricing.Cost()
    tokens = {"input": 0, "cached": 0, "output": 0}
    for row in usage:
        assert book is not None
        cost.add(book.row_cost(row))
        tokens["input"] += int(row["input_tokens"] or 0)
        tokens["cached"] += int(row["cached_tokens"] or 0)
        tokens["output"] += int(row["output_tokens"] or 0)
    user = None
    if run is not None:
        user = run.conversation.owner if run.conversation_id else run.requested_by
    feedback = (
        [
            {
                "up": item.score > 0,
                "label": item.get_score_display(),
                "comment": str(redaction.clean(item.comment)) if item.comment else "",
                "user": item.user,
                "updated": item.updated,
            }
            for item in Feedback.objects.filter(run_id=run.pk).select_related("user")
        ]
        if run is not None
        else []
    )
    conversation_url = ""
    if trace.group_id:
        try:
            conversation_url = reverse("trace_conversation", args=[trace.group_id])
        except NoReverseMatch:  # the conversation page lands with helper "sessions"
            conversation_url = ""
    metadata = trace.metadata if isinstance(trace.metadata, dict) else {}
    return {
        "outcome": trace.shown_outcome,
        "outcome_label": trace.get_shown_outcome_display(),
        "outcome_reason": trace.outcome_reason,
        "active": formatting.duration(trace.active_seconds),
        "waiting": formatting.duration(trace.waiting_seconds),
        "waited": bool(trace.waiting_seconds and trace.waiting_seconds >= 0.5),
        "tokens": {key: f"{value:,}" for key, value in tokens.items()},
        "has_usage": bool(usage),
        "cost": pricing.shown(cost, links=price_links),
        "user": user,
        "agent": (run.agent_name if run is not None else "") or str(metadata.get("agent") or ""),
        "input": _shown_text(run.input) if run is not None else "",
        "reply": _shown_text(run.final_output) if run is not None else "",
        "feedback": feedback,
        "conversation_url": conversation_url,
    }


def _shown_text(value: str) -> str:
    """A user's or a model's text for operators: masked, then cut."""
    if not value:
        return ""
    return formatting.preview(str(redaction.clean(value)), SUMMARY_CHARS)


def _tree_urls(trace: Trace) -> dict[str, str]:
    # Each row's links are a prefix and its span id: one reverse() per tree, not per row.
    return {
        "span_url": reverse("trace_span", args=[trace.trace_id, "SPAN"])[: -len("SPAN/")],
        "subtree_url": reverse("trace_subtree", args=[trace.trace_id, "SPAN"])[: -len("SPAN/")],
        "tree_url": reverse("trace_tree", args=[trace.trace_id]),
        "roots_url": reverse("trace_roots", args=[trace.trace_id]),
    }


def _page_context(
    request: HttpRequest, trace: Trace, selected: Span | None = None
) -> dict[str, Any]:
    group = events.trace_group(trace.trace_id)
    links = pricing.may_add_prices(request.user)
    context = tree_context(
        trace, selected=selected.span_id if selected is not None else "", price_links=links
    )
    return {
        **context,
        "others": other_runs(trace),
        "panel": (
            span_panel_context(trace, selected, price_links=links) if selected is not None else None
        ),
        "selected_id": selected.span_id if selected is not None else "",
        # A finished trace changes no more: no socket, and the page does not say "Live".
        "live": group is not None and context["live_state"] != "done",
    }


@require_GET
@login_required
@trace_viewer_required
def trace_detail(request: HttpRequest, trace_id: str) -> HttpResponse:
    """One trace: its spans as a tree and a waterfall; the span details load beside them."""
    trace = _get_trace_for_viewer(request, trace_id)
    return render(request, "tracing/trace_detail.html", _page_context(request, trace))


@require_GET
@login_required
@trace_viewer_required
def trace_tree(request: HttpRequest, trace_id: str) -> HttpResponse:
    """The tree and waterfall alone (with the summary), re-read on every socket (re)connect
    and whenever the exporter stored more of the trace; with what the reader had loaded."""
    trace = _get_trace_for_viewer(request, trace_id)
    form = TreeStateForm(request.GET)
    state = form.cleaned_data if form.is_valid() else {}
    context = tree_context(
        trace,
        opened=state.get("open", []),
        more=state.get("more", {}),
        price_links=pricing.may_add_prices(request.user),
    )
    return render(request, "tracing/trace_detail.html#tree-refresh", context)


class SubtreeForm(forms.Form):
    """Which of a span's children a subtree load brings (a page of them at most)."""

    start = forms.IntegerField(required=False, min_value=0, max_value=10_000_000)
    stop = forms.IntegerField(required=False, min_value=0, max_value=10_000_000)


@require_GET
@login_required
@trace_viewer_required
def trace_subtree(request: HtmxHttpRequest, trace_id: str, span_id: str) -> HttpResponse:
    """A span's children, a page at a time, each with its own subtree to load on demand:
    what a big trace's collapsed rows and "N more" controls load. Without htmx, the trace
    page with that span open."""
    trace = _get_trace_for_viewer(request, trace_id)
    form = SubtreeForm(request.GET)
    if not form.is_valid():
        return HttpResponse(form.errors.as_text(), status=400, content_type="text/plain")
    shape = skeleton(trace)
    if span_id not in shape:
        raise Http404("No such span in this trace.")
    if not request.htmx:
        span = get_object_or_404(Span, trace_id=trace.trace_id, span_id=span_id)
        return render(
            request, "tracing/trace_detail.html", _page_context(request, trace, selected=span)
        )
    return _children_page(request, trace, shape, span_id, form)


@require_GET
@login_required
@trace_viewer_required
def trace_roots(request: HtmxHttpRequest, trace_id: str) -> HttpResponse:
    """A page of a big trace's root-level spans (a running trace's spans wait there for
    their parents), as its "Show N more" row at the root level loads them. Without htmx,
    the trace page."""
    trace = _get_trace_for_viewer(request, trace_id)
    form = SubtreeForm(request.GET)
    if not form.is_valid():
        return HttpResponse(form.errors.as_text(), status=400, content_type="text/plain")
    if not request.htmx:
        return render(request, "tracing/trace_detail.html", _page_context(request, trace))
    return _children_page(request, trace, skeleton(trace), None, form)


def _children_page(
    request: HttpRequest,
    trace: Trace,
    shape: trees.Skeleton,
    parent: str | None,
    form: SubtreeForm,
) -> HttpResponse:
    """The children of `parent` (None: the roots) from `start`, a page of them, each with
    its subtree folded, and a "Show N more" row for the rest up to `stop`."""
    start = form.cleaned_data.get("start") or 0
    asked = form.cleaned_data.get("stop")
    kids = shape.kids(parent)
    end = len(kids) if asked is None else min(asked, len(kids))
    stop = min(end, start + trees.CHILD_PAGE)
    view = trees.View(shape, first_depth=0)
    shown = view.visible(parent, start, stop)
    if stop < end:
        depth = shape.depth[parent] + 1 if parent is not None else 0
        shown.append(trees.Gap(parent, depth, stop, end))
    tree = shown_tree(trace, shape, view, shown)
    context = {"trace": trace, "tree": tree, "selected_id": "", **_tree_urls(trace)}
    return render(request, "tracing/trace_detail.html#subtree", context)


@require_GET
@login_required
@trace_viewer_required
def span_detail(request: HtmxHttpRequest, trace_id: str, span_id: str) -> HttpResponse:
    """One span's details: the panel alone for htmx, else the trace page with it open."""
    trace = _get_trace_for_viewer(request, trace_id)
    span = get_object_or_404(Span, trace_id=trace.trace_id, span_id=span_id)
    if request.htmx and not request.htmx.history_restore_request:
        links = pricing.may_add_prices(request.user)
        context = {"panel": span_panel_context(trace, span, price_links=links)}
        return render(request, "tracing/trace_detail.html#span-panel", context)
    return render(
        request, "tracing/trace_detail.html", _page_context(request, trace, selected=span)
    )


# --- one span -------------------------------------------------------------------------------


def pretty(value: Any) -> str:
    """JSON (or a string holding JSON, like a tool call's arguments) indented for reading.
    Returned raw: the template escapes it."""
    if value is None:
        return ""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped.startswith(("{", "[")):
            return _cut(value)
        try:
            value = json.loads(stripped)
        except ValueError:
            return _cut(value)
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return _cut(text)


def _cut(text: str) -> str:
    if len(text) <= PREVIEW_CHARS:
        return text
    more = len(text) - PREVIEW_CHARS
    return f"{text[:PREVIEW_CHARS]}\n… {more:,} more characters: see the JSON export."


def _label(key: str) -> str:
    return key.replace("_", " ").capitalize()


def _usage_facts(usage: Any) -> list[dict[str, str]]:
    if not isinstance(usage, dict):
        return []
    facts = [
        {"label": _label(key), "value": f"{value:,}", "tone": "num"}
        for key, value in usage.items()
        if isinstance(value, int)
        and not isinstance(value, bool)
        and (value or key in ("input_tokens", "output_tokens"))
    ]
    if "total_tokens" not in usage:
        parts = [usage.get("input_tokens"), usage.get("output_tokens")]
        total = sum(part for part in parts if isinstance(part, int))
        if total:
            facts.append({"label": "Total tokens", "value": f"{total:,}", "tone": "num"})
    return facts


@dataclass
class Message:
    """One entry of a model call's conversation, for people: who said it and what, a tool
    call (name and arguments), or a tool's result. Raw text: the template escapes it."""

    role: str  # system, user, assistant, tool, or what the item says
    kind: str = "text"  # text, tool_call, tool_result, reasoning, other
    text: str = ""
    name: str = ""  # the tool's, for a call
    arguments: str = ""  # pretty JSON, for a call
    call_id: str = ""

    @property
    def role_class(self) -> str:
        """The CSS class suffix of its role (user data never becomes a class name)."""
        known = ("system", "user", "assistant", "tool")
        return self.role if self.role in known else "other"


ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}
PART_NAMES = {
    "input_image": "[image]",
    "image_url": "[image]",
    "input_file": "[file]",
    "file": "[file]",
    "input_audio": "[audio]",
}


def conversation(items: Any) -> list[Message]:
    """A generation's input or output as messages, from either shape the SDK stores: Chat
    Completions messages (`role`, `content`, `tool_calls`, role `tool`) or Responses items
    (`message`, `function_call`, `function_call_output`, `reasoning`, other `*_call`s)."""
    if items is None:
        return []
    if isinstance(items, str):
        return [Message("user", text=_cut(items))] if items else []
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        return [Message("other", kind="other", text=pretty(items))]
    messages: list[Message] = []
    for item in items:
        if isinstance(item, dict):
            messages += _messages_of(item)
        elif item is not None:
            messages.append(Message("other", kind="other", text=_cut(str(item))))
    return messages


def _messages_of(item: dict[str, Any]) -> list[Message]:
    kind = str(item.get("type") or "")
    role = str(item.get("role") or "")
    if kind == "function_call":
        return [_call(item.get("name"), item.get("arguments"), item.get("call_id"))]
    if kind.endswith("_call_output") or kind == "function_call_output":
        return [
            Message(
                "tool",
                kind="tool_result",
                text=_content_text(item.get("output")),
                call_id=str(item.get("call_id") or ""),
            )
        ]
    if kind == "reasoning":
        summary = item.get("summary")
        return [Message("assistant", kind="reasoning", text=_content_text(summary))]
    if role == "tool":  # Chat Completions: a tool's result
        return [
            Message(
                "tool",
                kind="tool_result",
                text=_content_text(item.get("content")),
                call_id=str(item.get("tool_call_id") or ""),
                name=str(item.get("name") or ""),
            )
        ]
    if role or kind == "message":
        found: list[Message] = []
        text = _content_text(item.get("content"))
        refusal = item.get("refusal")
        if isinstance(refusal, str) and refusal:
            text = f"{text}\n[refused] {refusal}".strip()
        calls = item.get("tool_calls")
        if text or not isinstance(calls, list) or not calls:
            found.append(Message(ROLES.get(role, role or "assistant"), text=text))
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                found.append(_call(function.get("name"), function.get("arguments"), call.get("id")))
        return found
    # Any other item (a hosted tool's call, a computer action, ...): its type and its JSON.
    return [Message("assistant", kind="other", name=kind or "item", text=pretty(item))]


def _call(name: Any, arguments: Any, call_id: Any) -> Message:
    return Message(
        "assistant",
        kind="tool_call",
        name=str(name or "?"),
        arguments=pretty(arguments) if arguments not in (None, "") else "",
        call_id=str(call_id or ""),
    )


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or its parts' texts (other parts named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _cut(content)
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                kind = str(part.get("type") or "")
                value = part.get("text", part.get("refusal"))
                if isinstance(value, str):
                    texts.append(value)
                elif kind in PART_NAMES:
                    texts.append(PART_NAMES[kind])
                else:
                    texts.append(pretty(part))
        return _cut("\n".join(texts))
    return pretty(content)


def span_panel_context(trace: Trace, span: Span, *, price_links: bool = False) -> dict[str, Any]:
    """What `trace_detail.html#span-panel` shows for a span: common facts, then what its
    type carries."""
    data = span.span_data if isinstance(span.span_data, dict) else {}
    inner = span.data
    kind = span.span_type
    facts: list[dict[str, str]] = []
    blocks: list[dict[str, Any]] = []
    headline = ""
    is_decision = trees.is_decision(kind, span.name)
    priced: pricing.Shown | None = None
    messages: dict[str, list[Message]] | None = None

    def block(title: str, value: Any, *, open: bool = True) -> None:
        text = pretty(value)
        if text:
            blocks.append({"title": title, "text": text, "open": open})

    if is_decision:
        decision = str(inner.get("decision") or "")
        tone = {"approve": "ok", "reject": "bad"}.get(decision, "quiet")
        headline = "Approval decision"
        facts += [
            {"label": "Reviewer", "value": str(inner.get("reviewer") or "—"), "tone": ""},
            {"label": "Decision", "value": decision or "—", "tone": tone},
            {"label": "Tool", "value": str(inner.get("tool") or "—"), "tone": "mono"},
        ]
        if inner.get("always"):
            facts.append({"label": "Always", "value": "for the rest of this run", "tone": ""})
        if inner.get("call_id"):
            facts.append({"label": "Call id", "value": str(inner["call_id"]), "tone": "mono"})
        blocks.append({"title": "Message", "text": str(inner.get("message") or ""), "open": True})
    elif kind in ("generation", "response"):
        model = data.get("model") or span.model
        if model:
            facts.append({"label": "Model", "value": str(model), "tone": "mono"})
        if data.get("response_id"):
            facts.append({"label": "Response", "value": str(data["response_id"]), "tone": "mono"})
        facts += _usage_facts(data.get("usage"))
        if span.cached_tokens and not any(f["label"].startswith("Cached") for f in facts):
            facts.append(
                {"label": "Cached input tokens", "value": f"{span.cached_tokens:,}", "tone": "num"}
            )
        cost = pricing.PriceBook.load().span_cost(span)
        if cost is not None:
            priced = pricing.shown(cost, links=price_links)
        messages = {
            "input": conversation(data.get("input")),
            "output": conversation(data.get("output")),
        }
        # The messages as they were stored, one click away.
        block("Output", data.get("output"), open=False)
        block("Input", data.get("input"), open=False)
        block("Model settings", data.get("model_config"), open=False)
    elif kind == "function":
        facts.append({"label": "Tool", "value": str(data.get("name") or "—"), "tone": "mono"})
        block("Input", data.get("input"))
        block("Output", data.get("output"))
        block("MCP", data.get("mcp_data"), open=False)
    elif kind == "handoff":
        headline = f"{data.get('from_agent') or '?'} → {data.get('to_agent') or '?'}"
        facts += [
            {"label": "From", "value": str(data.get("from_agent") or "—"), "tone": ""},
            {"label": "To", "value": str(data.get("to_agent") or "—"), "tone": ""},
        ]
    elif kind == "guardrail":
        tripped = trees.truthy(data.get("triggered"))
        facts += [
            {"label": "Guardrail", "value": str(data.get("name") or "—"), "tone": "mono"},
            {
                "label": "Tripped",
                "value": "yes, it tripped" if tripped else "no",
                "tone": "bad" if tripped else "ok",
            },
        ]
    elif kind == "agent":
        tools = data.get("tools") or []
        handoffs = data.get("handoffs") or []
        facts += [
            {"label": "Tools", "value": ", ".join(map(str, tools)) or "none", "tone": "mono"},
            {"label": "Handoffs", "value": ", ".join(map(str, handoffs)) or "none", "tone": ""},
            {"label": "Output type", "value": str(data.get("output_type") or "—"), "tone": "mono"},
        ]
    elif kind in ("task", "turn"):
        if inner.get("turn") is not None:
            facts.append({"label": "Turn", "value": str(inner["turn"]), "tone": "num"})
        if inner.get("agent_name"):
            facts.append({"label": "Agent", "value": str(inner["agent_name"]), "tone": ""})
        facts += _usage_facts(inner.get("usage"))
    elif kind == "custom":
        block("Data", inner or data.get("data"))

    offset = None
    if trace.started_at is not None and span.started_at is not None:
        offset = (span.started_at - trace.started_at).total_seconds()
    return {
        "trace": trace,
        "span": span,
        "kind": kind,
        "kind_class": trees.kind_class(kind, span.name),
        "is_decision": is_decision,
        "headline": headline,
        "facts": facts,
        "blocks": blocks,
        "duration": formatting.duration(span.duration_seconds),
        "offset": formatting.duration(offset) if offset is not None else "—",
        "started": _clock(span.started_at),
        "ended": _clock(span.ended_at),
        "error": pretty(span.error),
        "raw": pretty(span.span_data),
        "priced": priced,
        "messages": messages,
    }


def _clock(value: datetime | None) -> str:
    """A time of day to the millisecond, as spans are read."""
    if value is None:
        return "—"
    return f"{value:%H:%M:%S}.{value.microsecond // 1000:03d}"


# --- export ---------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def export_trace(trace: Trace, spans: Iterable[Span]) -> dict[str, Any]:
    """The trace in the shape the SDK exports it (`Trace.export()` and each `Span.export()`),
    its spans under "spans"; as stored, so masked."""
    return {
        "object": "trace",
        "id": trace.trace_id,
        "workflow_name": trace.workflow_name,
        "group_id": trace.group_id or None,
        "metadata": trace.metadata or None,
        "spans": [
            {
                "object": "trace.span",
                "id": span.span_id,
                "trace_id": trace.trace_id,
                "parent_id": span.parent_id,
                "started_at": _iso(span.started_at),
                "ended_at": _iso(span.ended_at),
                "span_data": span.span_data,
                "error": span.error,
            }
            for span in spans
        ],
    }


@require_GET
@login_required
@trace_viewer_required
def trace_export(request: HttpRequest, trace_id: str) -> HttpResponse:
    trace = _get_trace_for_viewer(request, trace_id)
    spans = Span.objects.filter(trace_id=trace.trace_id).order_by("started_at", "pk")
    response = JsonResponse(
        export_trace(trace, spans.iterator()),
        json_dumps_params={"indent": 2, "ensure_ascii": False},
    )
    disposition = content_disposition_header(as_attachment=False, filename=f"{trace.trace_id}.json")
    if disposition:
        response["Content-Disposition"] = disposition
    return response
