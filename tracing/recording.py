"""What the run engine writes into a run's trace itself: each approval decision as a span,
and the trace's status, which follows the run.

Both run inside the engine's transactions, in a savepoint of their own: a problem with a trace
is logged and never undoes (or fails) a run's pause, completion or decision.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agents.tracing import gen_span_id
from django.conf import settings
from django.db import transaction
from django.db.models import Case, IntegerField, Value, When

from approvals.models import AgentRun, ApprovalDecision, ApprovalRequest, ApprovalStatus
from tracing import redaction
from tracing.models import Span, Trace

logger = logging.getLogger(__name__)

DECISION_SPAN_NAME = "approval decision"


def follow_run(run_id: int) -> None:
    """Set the status of the run's trace from the run's current status, creating the trace's
    row if the exporter has not stored it yet."""
    if not settings.AGENTSITE_TRACING:
        return
    try:
        with transaction.atomic():
            run = (
                AgentRun.objects.filter(pk=run_id)
                .values("pk", "trace_id", "status", "agent_name", "conversation__session_id")
                .first()
            )
            if run is None or not run["trace_id"]:
                return
            _ensure_trace(run)
            Trace.objects.filter(trace_id=run["trace_id"]).follow_run_status(run["status"])
    except Exception:
        logger.exception("Tracing: the trace of run %s could not follow its status", run_id)


def record_decision(
    request: ApprovalRequest, decision: ApprovalDecision, status: str, run: AgentRun
) -> None:
    """Store a reviewer's decision (or an expiry) as a span of the run's trace, under the
    agent span of the agent that asked when it is known."""
    if not settings.AGENTSITE_TRACING or not run.trace_id:
        return
    try:
        with transaction.atomic():
            _ensure_trace(
                {
                    "pk": run.pk,
                    "trace_id": run.trace_id,
                    "agent_name": run.agent_name,
                    "conversation__session_id": run.conversation.session_id,
                }
            )
            Span.objects.create(
                span_id=gen_span_id(),
                trace_id=run.trace_id,
                parent_id=_agent_span_id(run.trace_id, request.agent_name),
                span_type="custom",
                name=DECISION_SPAN_NAME,
                started_at=decision.created,
                ended_at=decision.created,
                span_data={
                    "type": "custom",
                    "name": DECISION_SPAN_NAME,
                    "data": {
                        "reviewer": (
                            decision.reviewer.get_username() if decision.reviewer else "expired"
                        ),
                        "decision": _decision(decision, status),
                        "message": redaction.clean(decision.message),
                        "always": decision.always,
                        "tool": request.tool_name,
                        "call_id": request.call_id,
                        "arguments_hash": decision.arguments_hash,
                    },
                },
            )
    except Exception:
        logger.exception(
            "Tracing: the decision on request %s was not added to its trace", request.pk
        )


def _decision(decision: ApprovalDecision, status: str) -> str:
    if status == ApprovalStatus.EXPIRED:
        return "expired"
    return "approve" if decision.approved else "reject"


def _ensure_trace(run: Mapping[str, Any]) -> None:
    # Ignoring a conflict, so this never races the exporter's insert of the same trace.
    Trace.objects.bulk_create(
        [
            Trace(
                trace_id=run["trace_id"],
                run_id=run["pk"],
                group_id=run["conversation__session_id"] or "",
                metadata={"run_id": str(run["pk"]), "agent": run["agent_name"]},
            )
        ],
        ignore_conflicts=True,
    )


def _agent_span_id(trace_id: str, agent_name: str) -> str | None:
    """The first agent span of the trace, preferring one of the agent that asked."""
    return (
        Span.objects.filter(trace_id=trace_id, span_type="agent")
        .order_by(
            Case(
                When(name=agent_name, then=Value(0)), default=Value(1), output_field=IntegerField()
            ),
            "started_at",
            "pk",
        )
        .values_list("span_id", flat=True)
        .first()
    )
