"""The end of a stream that is saved: a completion, or a pause (the signed state, one request per
interruption with the policies' verdicts and expiry policies, decisions by policy, the trace
and the signals, in one transaction)."""

from __future__ import annotations

import copy
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agents import Agent, RunResultStreaming
from agents.items import ToolApprovalItem
from agents.tool import ToolOriginType
from agents.version import __version__ as SDK_VERSION
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from agentsite.db.sql import columns
from approvals.models import (
    ApprovalDecision,
    ApprovalOrigin,
    ApprovalRequest,
    ToolKind,
    arguments_hash,
)
from conversations.items import parse_arguments
from conversations.session import record_turn_usage
from engine import calls as paused_calls
from engine import context as run_context
from engine import events, executor, policies, registry, signals
from engine.models import AgentRun, RunStatus
from engine.runs import decisions, expiry, rows, starting
from tracing import recording

logger = logging.getLogger(__name__)


def _follow_agent(run: AgentRun, result: RunResultStreaming) -> None:
    """The agent that answered this turn answers the next (in a final write's transaction;
    the conversation was loaded with the claim, and takes one message at a time)."""
    try:
        name = registry.public_name(starting.own_agent_name(run.conversation), result.last_agent)
    except Exception:
        return
    run.conversation.hand_to(name)


def _store_turn_usage(run: AgentRun, result: RunResultStreaming) -> None:
    """What the run used so far, as its turn's usage in the session (the SDK's
    `store_run_usage`, on the run's branch): a resumed run's usage holds its pause's."""
    record_turn_usage(run.conversation_id, run.branch, result.context_wrapper.usage, run.pk)


def _final_text(output: Any) -> str:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if hasattr(output, "model_dump_json"):
        return str(output.model_dump_json())
    return json.dumps(output, default=str, ensure_ascii=False)


def save_completion(run: AgentRun, result: RunResultStreaming) -> rows.Outcome:
    now = timezone.now()
    run.trace_id = rows.trace_id_of(result) or run.trace_id
    with transaction.atomic():
        # Only a run that is still ours: one failed meanwhile (recovery, a crash handler)
        # stays so.
        saved = (
            columns(AgentRun).update(
                run.pk,
                {
                    "status": RunStatus.COMPLETED,
                    "final_output": _final_text(result.final_output),
                    "usage": rows.usage_of(result),
                    "trace_id": run.trace_id,
                    "state": None,
                    "state_signature": "",
                    "streamed_text": "",
                    "finished": now,
                    "updated": now,
                },
                where={"status": RunStatus.RUNNING},
            )
            == 1
        )
        if saved:
            recording.follow_run(run, RunStatus.COMPLETED)
            _follow_agent(run, result)
            _store_turn_usage(run, result)
            signals.run_completed.send(sender=AgentRun, run_id=run.pk)
    completed = rows.Outcome(
        events=[rows.run_updated(run.pk, run.conversation_id, RunStatus.COMPLETED)]
    )
    if not saved:
        if AgentRun.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists():
            # An earlier attempt committed before its connection broke (only this write
            # completes a run).
            return completed
        logger.warning("Run %s finished but was no longer running; its result was dropped.", run.pk)
        return rows.Outcome()
    return completed


def _origin(item: ToolApprovalItem, starting_agent: Agent[Any]) -> str:
    origin = getattr(item, "tool_origin", None)
    if origin is not None and origin.type == ToolOriginType.AGENT_AS_TOOL:
        return ApprovalOrigin.AGENT_AS_TOOL
    if item.agent is not None and item.agent.name != starting_agent.name:
        # Approvals inside an agent-as-tool carry that agent; anything else came after a handoff.
        if registry.is_agent_as_tool(starting_agent, item.agent.name):
            return ApprovalOrigin.AGENT_AS_TOOL
        return ApprovalOrigin.HANDOFF
    return ApprovalOrigin.TOOL


@dataclass(frozen=True)
class _Paused:
    """A call the pause records: the SDK's item, what the approval policies said of it and
    its expiry policy, both chosen now (a later change to a rule or the tool changes
    nothing)."""

    item: ToolApprovalItem
    verdict: policies.Verdict
    on_expiry: expiry.Expiry


def save_pause(
    run: AgentRun,
    agent: Agent[Any],
    result: RunResultStreaming,
    mcp_tools: dict[str, Any] | None = None,
    mcp_descriptions: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> rows.Outcome:
    """The stream ended with interruptions: in one transaction the signed state, one request
    per paused call (those the policies decided decided), the run waiting (or resuming, when
    the policies decided every call), the trace and the signals; the events once stored."""
    # The context as ids only (`engine/context.py`); anything else in it refuses to be saved.
    state = result.to_state().to_json(context_serializer=run_context.serialize, strict_context=True)
    run.trace_id = rows.trace_id_of(result) or run.trace_id
    paused = _judged(run, agent, result)
    now = timezone.now()
    try:
        with transaction.atomic():
            # FOR NO KEY UPDATE, as in `decisions.record_decision`: the exporter's batch of
            # this run's trace checks its foreign key to the run on commit, while this waits
            # for its row.
            locked, pause_count = rows.lock_run(run.pk)
            if (
                locked in (RunStatus.WAITING, RunStatus.RESUMING)
                and pause_count == run.pause_count + 1
            ):
                return _saved_before(run, locked, pause_count)
            if locked != RunStatus.RUNNING:
                # Failed meanwhile: asking reviewers to approve a dead run's calls is wrong.
                logger.warning("Run %s paused but was %s; nothing saved.", run.pk, locked)
                return rows.Outcome()
            pause = pause_count + 1
            _bind(state, run.pk, pause, mcp_tools)
            spans = getattr(result.context_wrapper.context, "agent_spans", {})
            requests = _request_rows(run, pause, agent, paused, now, mcp_descriptions or {}, spans)
            decided = [
                decisions.decide_by_policy(request, each.verdict, now)
                for request, each in zip(requests, paused, strict=True)
                if each.verdict.decides
            ]
            # Every call decided by a policy: the run goes on at once, as after a person's
            # last decision (the state is saved first: it resumes through the same path).
            status = RunStatus.RESUMING if len(decided) == len(requests) else RunStatus.WAITING
            _store_state(run, agent, result, state, pause, status, mcp_tools, now)
            _record(run, result, status, requests, decided)
            if status == RunStatus.RESUMING:
                transaction.on_commit(lambda: executor.submit("resume", run.pk))
    except IntegrityError as exc:
        # The model reused a call id of this run: its calls could no longer be told apart.
        rows.fail_sync(run.pk, f"The agent paused with a call id it had used before: {exc}", result)
        return rows.Outcome(
            events=[rows.run_updated(run.pk, run.conversation_id, RunStatus.FAILED)]
        )
    return _announced(run, requests, status)


def _judged(run: AgentRun, agent: Agent[Any], result: RunResultStreaming) -> list[_Paused]:
    """The paused calls with the approval policies' verdicts (the rules read once for the
    pause; a call that paused only because a rule's gate stopped it keeps that rule's
    verdict) and their expiry policies."""
    items = list(result.interruptions)
    calls = [
        policies.call_for(
            item.agent.name if item.agent else agent.name,
            item.tool_name or "",
            parse_arguments(paused_calls.arguments(item)),
            run.agent_name,
            paused_calls.kind(item),
            paused_calls.server(item),
        )
        for item in items
    ]
    verdicts = policies.verdicts(calls, run.requested_by_id)
    context = result.context_wrapper.context
    judged = []
    for item, call, verdict in zip(items, calls, verdicts, strict=True):
        verdict = policies.gated_verdict(context, item.call_id or "") or verdict
        judged.append(_Paused(item, verdict, expiry.expiry_policy(verdict, call.review)))
    return judged


def _saved_before(run: AgentRun, status: str, pause: int) -> rows.Outcome:
    """An earlier attempt of this write committed before its connection broke (only this
    write moves a running run to waiting, or to resuming when policies decided all of its
    calls: a resumption takes the state once, so asking again is safe)."""
    requests = list(ApprovalRequest.objects.of_pause(run, pause))
    if status == RunStatus.RESUMING:
        transaction.on_commit(lambda: executor.submit("resume", run.pk))
    return _announced(run, requests, status)


def _bind(state: dict[str, Any], run_id: int, pause: int, mcp_tools: dict[str, Any] | None) -> None:
    """Bind the state to this run and pause, under its signature (`rows.STATE_BINDING`)."""
    state[rows.STATE_BINDING] = {"run": run_id, "pause": pause, "nonce": secrets.token_hex(16)}
    if mcp_tools:
        # The MCP servers the run opened: the resume opens them first, to hold their tools
        # against this fingerprint.
        state[rows.STATE_BINDING]["mcp"] = sorted(mcp_tools)


def _request_rows(
    run: AgentRun,
    pause: int,
    agent: Agent[Any],
    paused: list[_Paused],
    now: Any,
    described: dict[str, dict[str, dict[str, Any]]],
    agent_spans: dict[str, str],
) -> list[ApprovalRequest]:
    expires_at = now + timedelta(seconds=settings.AGENTSITE_APPROVAL_TTL)
    requests = [
        ApprovalRequest(
            run=run,
            pause=pause,
            call_id=each.item.call_id or "",
            agent_name=each.item.agent.name if each.item.agent else agent.name,
            tool_name=each.item.tool_name or "",
            arguments=parse_arguments(paused_calls.arguments(each.item)),
            arguments_hash=arguments_hash(paused_calls.arguments(each.item)),
            origin=_origin(each.item, agent),
            kind=paused_calls.kind(each.item),
            server=paused_calls.server(each.item)[:200],
            expires_at=expires_at,
            verdict=each.verdict.as_json(),
            on_expiry=each.on_expiry.action,
            escalate_to=each.on_expiry.group,
            expiry_note=each.on_expiry.note,
        )
        for each in paused
    ]
    for request in requests:
        request.tool_sheet = _server_tool_sheet(request, described)
        request.agent_span_id = agent_spans.get(request.agent_name, "")[:64]
        columns(ApprovalRequest).insert(request)
    return requests


def _server_tool_sheet(
    request: ApprovalRequest, described: dict[str, dict[str, dict[str, Any]]]
) -> dict[str, Any]:
    """What a local MCP server said of the called tool when the run listed it (its
    description and input schema), kept on the request for its reviewers; {} for any other
    tool (a function tool's sheet is the agent's, read when shown)."""
    if request.kind != ToolKind.MCP:
        return {}
    sheet = dict(described.get(request.server, {}).get(request.tool_name, {}))
    properties = (sheet.get("schema") or {}).get("properties")
    if isinstance(properties, dict):
        # The arguments' order as the server gave it (PostgreSQL's jsonb keeps its own).
        sheet["order"] = list(properties)
    return sheet


def _store_state(
    run: AgentRun,
    agent: Agent[Any],
    result: RunResultStreaming,
    state: dict[str, Any],
    pause: int,
    status: str,
    mcp_tools: dict[str, Any] | None,
    now: Any,
) -> None:
    columns(AgentRun).update(
        run.pk,
        {
            "status": status,
            "state": state,
            "state_signature": rows.sign_state(state),
            "state_consumed": False,
            "pause_count": pause,
            "sdk_version": SDK_VERSION,
            "state_schema_version": str(state.get("$schemaVersion", "")),
            "agent_fingerprint": registry.fingerprint(agent, mcp_tools),
            "trace_id": run.trace_id,
            "usage": rows.usage_of(result),
            "streamed_text": "",
            "updated": now,
        },
    )


def _record(
    run: AgentRun,
    result: RunResultStreaming,
    status: str,
    requests: list[ApprovalRequest],
    decided: list[tuple[ApprovalRequest, ApprovalDecision]],
) -> None:
    """In the pause's transaction: the policies' decisions in the trace (as a person's: the
    trace shows them when the audit does), the signals (an outbox writes in this
    transaction), the run's trace status, who answers next and the turn's usage."""
    # A copy: `run` stays as it was claimed, which a retry of this write compares.
    paused = copy.copy(run)
    paused.status = status
    for request, decision in decided:
        recording.record_decision(request, decision, request.status, paused)
    for request in requests:
        if request.is_pending:
            signals.approval_created.send(sender=ApprovalRequest, request=request)
    for request, decision in decided:
        signals.approval_decided.send(sender=ApprovalRequest, request=request, decision=decision)
    recording.follow_run(run, status)
    _follow_agent(run, result)
    _store_turn_usage(run, result)


def _announced(run: AgentRun, requests: list[ApprovalRequest], status: str) -> rows.Outcome:
    """What the pages are told once the pause is stored: each request that waits for a
    person (a call a policy decided never reaches an inbox), and the run's new status."""
    outcome = rows.Outcome(
        events=[events.ApprovalCreated.for_request(r) for r in requests if r.is_pending]
    )
    outcome.events.append(rows.run_updated(run.pk, run.conversation_id, status))
    return outcome
