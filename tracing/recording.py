"""What the run engine writes into a run's trace itself: each approval decision as a span,
and the trace's status, which follows the run.

Both run inside the engine's transactions, in a savepoint of their own: a problem with a trace
is logged and never undoes (or fails) a run's pause, completion or decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from agents.tracing import gen_span_id
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentsite.db.sql import columns
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from engine.models import AgentRun, RunStatus
from tracing import forwarding, otlp, redaction
from tracing.models import Span, TraceOutcome, TraceStatus, trace_status
from tracing.rows import DECISION_SPAN_NAME, FAILURE_SPAN_NAME, STOP_SPAN_NAME
from tracing.sql import new_trace, statements

logger = logging.getLogger(__name__)


def follow_run(run: AgentRun | int, status: str | None = None) -> None:
    """Set the status of the run's trace from the run's status (`trace_status`; a span with
    an error, which the exporter may store at any moment, wins), creating the trace's row if
    the exporter has not stored it yet: one statement.

    Give the run (with its conversation loaded) and the status it was just given to skip
    reading it back; with only an id, the run is read first.
    """
    if not settings.AGENTSITE_TRACING:
        return
    try:
        with transaction.atomic():
            row = _run_row(run, status)
            if row is None or not row["trace_id"]:
                return
            _upsert_trace(row, trace_status(row["status"]), follow=True, outcome=run_outcome(row))
    except Exception:
        run_id = run.pk if isinstance(run, AgentRun) else run
        logger.exception("Tracing: the trace of run %s could not follow its status", run_id)


def _run_row(run: AgentRun | int, status: str | None) -> Mapping[str, Any] | None:
    if isinstance(run, AgentRun) and status is not None:
        return _fields(run, status)
    run_id = run.pk if isinstance(run, AgentRun) else run
    return (
        AgentRun.objects.filter(pk=run_id)
        .values(
            "pk",
            "trace_id",
            "status",
            "agent_name",
            "conversation__session_id",
            "pause_count",
            "error",
        )
        .first()
    )


# A finished run's outcome by the decisions on its calls, the first that applies: a request
# its user took back (the run then went on, the call rejected), one that expired, a call
# rejected (or answered by a reviewer instead of run), a call approved.
_DECIDED_OUTCOMES = (
    (TraceOutcome.WITHDRAWN, (DecisionKind.WITHDRAWN,)),
    (TraceOutcome.EXPIRED, (DecisionKind.EXPIRED, DecisionKind.EXPIRY_APPROVED)),
    (TraceOutcome.REJECTED, (DecisionKind.REJECTED, DecisionKind.RESPONDED)),
    (TraceOutcome.APPROVED, (DecisionKind.APPROVED, DecisionKind.EDITED)),
)
_ENDED_OUTCOMES = {
    RunStatus.FAILED: TraceOutcome.FAILED,
    RunStatus.GUARDRAIL: TraceOutcome.GUARDRAIL,
    RunStatus.CANCELLED: TraceOutcome.STOPPED,
    RunStatus.WAITING: TraceOutcome.WAITING,
}
REASON_CHARS = 300


def run_outcome(run: Mapping[str, Any]) -> tuple[str, str]:
    """How the run ended (`TraceOutcome`) and why, in a masked line: a failure's first line,
    or which call was decided how, by whom. A run that never paused needs no query (the
    turn-overhead benchmark's turn); one that did, one query of its decisions."""
    status = run["status"]
    if status not in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        outcome = _ENDED_OUTCOMES.get(status, TraceOutcome.RUNNING)
        reason = _first_line(run.get("error") or "") if status in _ENDED_OUTCOMES else ""
        return outcome.value, reason if outcome != TraceOutcome.WAITING else ""
    stopped = status == RunStatus.CANCELLED
    ended = (
        (TraceOutcome.STOPPED.value, _first_line(run.get("error") or ""))
        if stopped
        else (TraceOutcome.COMPLETED.value, "")
    )
    if not run.get("pause_count"):
        return ended
    with connection.cursor() as cursor:
        cursor.execute(statements().run_decisions, [run["pk"]])
        decisions = cursor.fetchall()
    kinds = {decision[0] for decision in decisions}
    if stopped:
        if DecisionKind.WITHDRAWN in kinds:
            return TraceOutcome.WITHDRAWN.value, ended[1]
        return ended
    for outcome, of_kinds in _DECIDED_OUTCOMES:
        for kind, tool, reviewer, policy, message in decisions:
            if kind in of_kinds:
                who = reviewer or (f"policy {policy}" if policy else "")
                label = DecisionKind(kind).label.lower()
                said = _first_line(message or "")
                line = f"{tool}: {label}" + (f" by {who}" if who else "")
                line += f": {said}" if said else ""
                return outcome.value, _first_line(line)
    return ended


def _first_line(text: str) -> str:
    """A text's first non-empty line, masked and cut to fit the trace's column."""
    for line in str(text).splitlines():
        if line.strip():
            cleaned = str(redaction.clean(line.strip()))
            if len(cleaned) > REASON_CHARS:
                cleaned = cleaned[: REASON_CHARS - 1] + "…"
            return cleaned
    return ""


def record_decision(
    request: ApprovalRequest, decision: ApprovalDecision, status: str, run: AgentRun
) -> None:
    """Store a reviewer's decision (or an expiry) as a span of the run's trace, under the
    agent span of the agent that asked when it is known."""
    if not settings.AGENTSITE_TRACING or not run.trace_id:
        return
    try:
        with transaction.atomic():
            _upsert_trace(_fields(run, run.status), TraceStatus.RUNNING, follow=False)
            span = Span(
                span_id=gen_span_id(),
                trace_id=run.trace_id,
                parent_id=(
                    request.agent_span_id or _agent_span_id(run.trace_id, request.agent_name)
                ),
                span_type="custom",
                name=DECISION_SPAN_NAME,
                started_at=decision.created,
                ended_at=decision.created,
                span_data={
                    "type": "custom",
                    "name": DECISION_SPAN_NAME,
                    "data": {
                        "reviewer": (
                            decision.reviewer.get_username()
                            if decision.reviewer
                            else f"policy {decision.policy_name}"
                            if decision.by_policy
                            else "expired"
                        ),
                        **({"policy": decision.policy_name} if decision.by_policy else {}),
                        "decision": _decision(decision, status),
                        "message": redaction.clean(decision.message),
                        "always": decision.always,
                        "tool": request.tool_name,
                        "call_id": request.call_id,
                        "arguments_hash": decision.arguments_hash,
                        "waited_seconds": _waited(request, decision),
                        **_edit(decision, request),
                    },
                },
            )
            columns(Span).insert(span)
            if settings.AGENTSITE_OTLP_ENDPOINT:
                transaction.on_commit(lambda: _forward(span))
    except Exception:
        logger.exception(
            "Tracing: the decision on request %s was not added to its trace", request.pk
        )


def _forward(span: Span) -> None:
    """The decision, once stored, to the OTLP forwarding (when on): live, as the SDK's spans
    are. Never raises (logged)."""
    try:
        sending = forwarding.from_settings()
        if sending is not None:
            sending.hand(otlp.readable_spans([span], project=settings.AGENTSITE_OTLP_SERVICE_NAME))
    except Exception:
        logger.exception("OpenTelemetry: a decision's span was not forwarded")


def _waited(request: ApprovalRequest, decision: ApprovalDecision) -> float | None:
    """Seconds from the request to its decision."""
    if request.created is None or decision.created is None:
        return None
    return round(max(0.0, (decision.created - request.created).total_seconds()), 3)


def record_stop(run_id: int, who: str, at: Any) -> None:
    """Store the user's Stop as a span of the run's trace (who, when), under its first agent
    span: the trace says why it ended, though its status is OK (a stop is no failure)."""
    data = lambda: {"stopped_by": who, "run_status": "cancelled"}  # noqa: E731
    _record_ending(run_id, STOP_SPAN_NAME, data, TraceStatus.RUNNING, at, "stop")


def record_failure(run_id: int, message: str, detail: Mapping[str, Any], at: Any) -> None:
    """Store why the run failed as a span of its trace, under its first agent span: what the
    user read and the detail operators need (status code, request id, the provider's error).
    No span error: the SDK's own span of the failed call carries it, and the run's status
    already makes the trace's an error."""
    data = lambda: redaction.clean({**detail, "user_message": message})  # noqa: E731
    _record_ending(run_id, FAILURE_SPAN_NAME, data, TraceStatus.ERROR, at, "failure")


def _record_ending(
    run_id: int, name: str, data: Callable[[], Any], status: str, at: Any, what: str
) -> None:
    """One custom span `name` holding what `data()` gives, at `at`, under the run's first
    agent span, its trace row upserted with `status`. Never raises: the run's end matters
    more (logged)."""
    if not settings.AGENTSITE_TRACING:
        return
    try:
        with transaction.atomic():
            row = _run_row(run_id, None)
            if row is None or not row["trace_id"]:
                return
            _upsert_trace(row, status, follow=False)
            span = Span(
                span_id=gen_span_id(),
                trace_id=row["trace_id"],
                parent_id=_agent_span_id(row["trace_id"], row["agent_name"]),
                span_type="custom",
                name=name,
                started_at=at,
                ended_at=at,
                span_data={"type": "custom", "name": name, "data": data()},
            )
            columns(Span).insert(span)
    except Exception:
        logger.exception("Tracing: the %s of run %s was not added to its trace", what, run_id)


def _fields(run: AgentRun, status: str) -> Mapping[str, Any]:
    """What the trace's row takes from a run already in hand (its conversation loaded)."""
    return {
        "pk": run.pk,
        "trace_id": run.trace_id,
        "status": status,
        "agent_name": run.agent_name,
        "conversation__session_id": run.conversation.session_id,
        "pause_count": run.pause_count,
        "error": run.error,
    }


def _edit(decision: ApprovalDecision, request: ApprovalRequest) -> dict[str, Any]:
    """An edited call's mark: which arguments changed (their names), the arguments it runs
    with (masked; only with the sensitive data setting on, as the SDK's own spans) and their
    hash beside the model's."""
    if not decision.is_edit:
        return {}
    edit: dict[str, Any] = {
        "edited": True,
        "edited_arguments_hash": decision.edited_arguments_hash,
        "changed": _changed(request.arguments, decision.edited_arguments),
    }
    if settings.AGENTSITE_TRACE_SENSITIVE_DATA:
        edit["edited_arguments"] = redaction.clean(decision.edited_arguments)
    return edit


def _changed(before: Any, after: Any) -> list[str]:
    """The names of the arguments an edit added, removed or changed (top level)."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return [] if before == after else ["(arguments)"]
    return sorted(
        key for key in before.keys() | after.keys() if before.get(key, ...) != after.get(key, ...)
    )


def _decision(decision: ApprovalDecision, status: str) -> str:
    if status == ApprovalStatus.EXPIRED:
        return "expired"
    if status == ApprovalStatus.WITHDRAWN:
        return "withdrawn"
    if status == ApprovalStatus.RESPONDED:
        # The tool never ran; `message` is what the model read as its output. (The SDK's own
        # function span shows it as a rejection: its one way to skip a call.)
        return "respond"
    if decision.is_edit:
        return "edit and approve"
    return "approve" if decision.approved else "reject"


def _upsert_trace(
    run: Mapping[str, Any], status: str, *, follow: bool, outcome: tuple[str, str] = ("", "")
) -> None:
    """Insert the run's trace row with `status` unless it exists (never racing the exporter's
    insert of the same trace); with `follow`, an existing row takes it too, by the rule: an
    error span, which the exporter may store at any moment, wins. Plain SQL (tracing/sql.py
    says why)."""
    sql = statements()
    row = new_trace(
        run["trace_id"],
        run["pk"],
        connection.ops.adapt_datetimefield_value(timezone.now()),
        group_id=run["conversation__session_id"] or "",
        metadata={"run_id": str(run["pk"]), "agent": run["agent_name"]},
        status=status,
        outcome=outcome,
    )
    with connection.cursor() as cursor:
        if follow:
            cursor.execute(sql.follow_run, [*row, *sql.follow_run_params])
        else:
            cursor.execute(sql.insert_placeholders, row)


def _agent_span_id(trace_id: str, agent_name: str) -> str | None:
    """The first agent span of the trace, preferring one of the agent that asked."""
    with connection.cursor() as cursor:
        cursor.execute(statements().first_agent_span, [trace_id, agent_name])
        row = cursor.fetchone()
    return str(row[0]) if row else None
