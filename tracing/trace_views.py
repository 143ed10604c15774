"""One trace: its spans as a tree and a waterfall (a big trace's top levels first, subtrees
loaded on demand: `tracing.tree`), the summary of its run, one span's panel beside them
(`span_panel`), and the trace as the SDK exports it (JSON).

For operators (`access.trace_viewer_required`). Everything shown is read from the database;
spans hold model and user text, so templates escape all of it. A trace page is live (see
`consumers.TraceConsumer`): the exporter announces each batch it stores and the page re-reads
its tree.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models import Case, CharField, Q, QuerySet, Value, When
from django.db.models.fields.json import KT
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import NoReverseMatch, reverse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from common import formatting
from common.http import HtmxHttpRequest
from engine import events
from engine.models import FINISHED_STATUSES, AgentRun
from tracing import pricing, redaction
from tracing import tree as trees
from tracing.access import get_trace_for_viewer, trace_viewer_required
from tracing.models import SPAN_PLACE_FIELDS, Feedback, Span, Trace, TraceStatus
from tracing.recording import DECISION_SPAN_NAME
from tracing.span_panel import span_panel_context

OTHER_RUNS = 10

# What a tree row shows; the span data, which can be large, is left in the database.
TREE_FIELDS = (*SPAN_PLACE_FIELDS, "error", "total_tokens")


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
    trace = get_trace_for_viewer(request, trace_id)
    return render(request, "tracing/trace_detail.html", _page_context(request, trace))


@require_GET
@login_required
@trace_viewer_required
def trace_tree(request: HttpRequest, trace_id: str) -> HttpResponse:
    """The tree and waterfall alone (with the summary), re-read on every socket (re)connect
    and whenever the exporter stored more of the trace; with what the reader had loaded."""
    trace = get_trace_for_viewer(request, trace_id)
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
    trace = get_trace_for_viewer(request, trace_id)
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
    trace = get_trace_for_viewer(request, trace_id)
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
    trace = get_trace_for_viewer(request, trace_id)
    span = get_object_or_404(Span, trace_id=trace.trace_id, span_id=span_id)
    if request.htmx and not request.htmx.history_restore_request:
        links = pricing.may_add_prices(request.user)
        context = {"panel": span_panel_context(trace, span, price_links=links)}
        return render(request, "tracing/trace_detail.html#span-panel", context)
    return render(
        request, "tracing/trace_detail.html", _page_context(request, trace, selected=span)
    )


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
    trace = get_trace_for_viewer(request, trace_id)
    spans = Span.objects.filter(trace_id=trace.trace_id).order_by("started_at", "pk")
    response = JsonResponse(
        export_trace(trace, spans.iterator()),
        json_dumps_params={"indent": 2, "ensure_ascii": False},
    )
    disposition = content_disposition_header(as_attachment=False, filename=f"{trace.trace_id}.json")
    if disposition:
        response["Content-Disposition"] = disposition
    return response
