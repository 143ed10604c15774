"""Traces as JSON Lines, for evaluation data sets: one object per trace with what the user
asked, what the agent answered, the tools it called, the approvals, the outcome, tokens, cost
and the users' ratings.

The traces ticked on the list, or every trace its filters match (at most `EXPORT_LIMIT`),
newest first, streamed: read `CHUNK` traces at a time by keyset over the list's own query and
filter, each chunk in a few queries (its tools, decisions, ratings and costs), so memory and
queries per line stay flat however many lines there are. The generator is asynchronous, each
chunk read in a database hop: under ASGI a synchronous one would be read whole before the
first byte is sent.

Everything is masked: the run's input and reply and the ratings' comments here (the run
stores them as written), the tools' arguments and output already by the exporter.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from agentsite.db.hops import db_hop
from approvals.models import ApprovalDecision
from tracing import pricing, redaction
from tracing.access import trace_viewer_required
from tracing.forms import TraceExportForm
from tracing.list_views import TraceListRow, with_runs
from tracing.models import Feedback, Span, Trace
from tracing.pricing import Cost, PriceBook

EXPORT_LIMIT = 10_000
CHUNK = 200

# A run's columns the export never reads.
_RUN_UNREAD = ("state", "streamed_text", "usage", "error", "error_detail")


def exported_traces(filters: Q) -> QuerySet[Trace]:
    """The list's traces and filter (`list_views.listed_traces`), with the runs' replies, newest
    first."""
    traces = Trace.objects.filter(started_at__isnull=False).filter(filters)
    return with_runs(traces, _RUN_UNREAD).order_by("-started_at", "-pk")


def _cost_usd(cost: Cost | None) -> float | None:
    """The cost in dollars, as a number; None unless every call was priced in dollars."""
    if cost is None or not cost.calls:
        return 0.0
    if not cost.complete or set(cost.amounts) - {"USD"}:
        return None
    return float(cost.amount("USD"))


def export_chunk(
    filters: Q, after: tuple[datetime, int] | None, size: int, book: PriceBook
) -> tuple[list[str], tuple[datetime, int] | None]:
    """The lines of the next `size` traces older than `after`, and where the next chunk
    starts (None: this was the last)."""
    traces = exported_traces(filters)
    if after is not None:
        at, pk = after
        traces = traces.filter(Q(started_at__lte=at) & (Q(started_at__lt=at) | Q(pk__lt=pk)))
    found = list(traces[:size])
    if not found:
        return [], None
    ids = [trace.trace_id for trace in found]
    run_ids = [trace.run_id for trace in found if trace.run_id is not None]
    chunk = Chunk(
        tools=tools_of(ids),
        approvals=approvals_of(run_ids),
        ratings=ratings_of(run_ids),
        costs=pricing.trace_costs(ids, book),
    )
    lines = [
        json.dumps(chunk.record(trace), ensure_ascii=False, default=str) + "\n" for trace in found
    ]
    last = found[-1]
    assert last.started_at is not None
    more = len(found) == size
    return lines, (last.started_at, last.pk) if more else None


def tools_of(trace_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The tools each trace called, in order, with their arguments and output (one query);
    a call that paused for a reviewer once, where it ran (its span at the pause is left out)."""
    tools: dict[str, list[dict[str, Any]]] = {}
    calls = (
        Span.objects.filter(trace_id__in=trace_ids, span_type="function")
        .order_by("started_at", "pk")
        .values_list("trace_id", "name", "span_data")
    )
    for trace_id, name, data in calls:
        data = data if isinstance(data, dict) else {}
        if data.get("awaiting_approval"):
            continue  # the call paused here; it ran (or not) later: `approvals` says how
        tools.setdefault(str(trace_id), []).append(
            {
                "name": data.get("name") or name,
                "arguments": data.get("input"),
                "output": data.get("output"),
            }
        )
    return tools


def approvals_of(run_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Each run's decisions, oldest first: the tool, the decision, who, its message masked
    (one query)."""
    approvals: dict[int, list[dict[str, Any]]] = {}
    decisions = (
        ApprovalDecision.objects.filter(request__run_id__in=run_ids)
        .order_by("created", "pk")
        .values_list(
            "request__run_id",
            "request__tool_name",
            "kind",
            "reviewer__username",
            "policy_name",
            "message",
        )
    )
    for run_id, tool, kind, reviewer, policy, message in decisions:
        approvals.setdefault(run_id, []).append(
            {
                "tool": tool,
                "decision": kind,
                "reviewer": reviewer or (f"policy {policy}" if policy else None),
                "message": redaction.clean(message) if message else "",
            }
        )
    return approvals


def ratings_of(run_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """Each run's ratings, oldest first, comments masked (one query)."""
    ratings: dict[int, list[dict[str, Any]]] = {}
    rows = Feedback.objects.filter(run_id__in=run_ids).order_by("updated", "pk")
    for run_id, score, comment in rows.values_list("run_id", "score", "comment"):
        ratings.setdefault(run_id, []).append(
            {"score": score, "comment": redaction.clean(comment) if comment else ""}
        )
    return ratings


@dataclass
class Chunk:
    """What a chunk's traces have beside their rows, each read in one query for the chunk."""

    tools: dict[str, list[dict[str, Any]]]
    approvals: dict[int, list[dict[str, Any]]]
    ratings: dict[int, list[dict[str, Any]]]
    costs: dict[str, Cost]

    def record(self, trace: Trace) -> dict[str, Any]:
        """One line of the export: what the user asked and got, how, and what it cost."""
        row = TraceListRow(trace, 0)
        run = trace.run
        cost = self.costs.get(trace.trace_id)
        return {
            "trace_id": trace.trace_id,
            "started_at": trace.started_at.isoformat() if trace.started_at else None,
            "user": row.user or None,
            "agent": row.agent or None,
            "input": redaction.clean(run.input) if run is not None else None,
            "output": redaction.clean(run.final_output) if run is not None else None,
            "tools": self.tools.get(trace.trace_id, []),
            "approvals": self.approvals.get(trace.run_id, []) if trace.run_id else [],
            "outcome": trace.shown_outcome,
            "reason": trace.outcome_reason,
            "tokens": trace.total_tokens,
            "cost": str(cost) if cost is not None and cost.calls else "no model calls",
            "cost_usd": _cost_usd(cost),
            "feedback": self.ratings.get(trace.run_id, []) if trace.run_id else [],
        }


async def stream_lines(filters: Q, limit: int | None = None) -> AsyncIterator[str]:
    """Every line of the export (at most `limit`, by default `EXPORT_LIMIT`), a chunk (one
    database hop) at a time."""
    limit = EXPORT_LIMIT if limit is None else limit
    book = await db_hop(PriceBook.load)()
    sent = 0
    after: tuple[datetime, int] | None = None
    while sent < limit:
        lines, after = await db_hop(export_chunk)(filters, after, min(CHUNK, limit - sent), book)
        for line in lines:
            yield line
        sent += len(lines)
        if after is None:
            return


@require_GET
@login_required
@trace_viewer_required
def trace_export_jsonl(request: HttpRequest) -> HttpResponse:
    """The ticked traces, or every trace the list's filters match, as JSON Lines."""
    form = TraceExportForm(request.GET)
    if not form.is_valid():
        problems = [str(error) for errors in form.errors.values() for error in errors]
        return HttpResponseBadRequest(
            "This export is not valid: " + " ".join(problems), content_type="text/plain"
        )
    response = StreamingHttpResponse(
        stream_lines(form.export_filter()), content_type="application/x-ndjson; charset=utf-8"
    )
    disposition = content_disposition_header(as_attachment=True, filename="traces.jsonl")
    if disposition:
        response["Content-Disposition"] = disposition
    # The access decorators are typed for plain responses; a streaming one passes through them.
    return response  # type: ignore[return-value]
