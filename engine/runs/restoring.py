"""Restoring a paused run: its saved state checked (signature, binding to this run and pause,
schema version, the agent's fingerprint, the arguments the reviewer saw, no decision smuggled
into the JSON), its context checked, and our decisions applied from our own rows."""

from __future__ import annotations

import hmac
from typing import Any

from agents import Agent
from agents.run_state import SUPPORTED_SCHEMA_VERSIONS, RunState
from agents.version import __version__ as SDK_VERSION
from django.conf import settings
from django.contrib.auth import get_user_model

from agentsite.db.hops import db_hop
from agentsite.db.sql import columns
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, arguments_hash
from engine import calls as paused_calls
from engine import context as run_context
from engine import mcp, registry
from engine.models import AgentRun
from engine.runs import edits, errors, rows


async def restore(run: AgentRun, agent: Agent[Any]) -> tuple[RunState[Any], dict[str, str]]:
    """The run's saved state, checked, with our decisions applied; and the calls a reviewer
    edited (call id -> the arguments they run with, as the JSON text the SDK passes on)."""
    saved = run.state
    if not isinstance(saved, dict):
        raise errors.RunFailure(
            "This run has no saved state (it is missing, or was cleared when the run failed); "
            "nothing was executed."
        )
    if not hmac.compare_digest(rows.sign_state(saved), run.state_signature):
        raise errors.RunFailure(
            "The saved state was changed outside agentsite (its signature does not match); "
            "nothing was executed."
        )
    saved = dict(saved)
    binding = saved.pop(rows.STATE_BINDING, None)
    # A state saved before states were bound has none; the (run, pause) row still guards it.
    if binding is not None and (
        not isinstance(binding, dict)
        or binding.get("run") != run.pk
        or binding.get("pause") != run.pause_count
    ):
        raise errors.RunFailure(
            "The saved state belongs to another run or pause than this one; nothing was executed."
        )
    version = str(saved.get("$schemaVersion", ""))
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise errors.RunFailure(
            f"The saved state has schema version {version or '(none)'}, which this SDK "
            f"({SDK_VERSION}) cannot read; nothing was executed."
        )
    servers = binding.get("mcp", []) if isinstance(binding, dict) else []
    try:
        await mcp.connect(registry.walk(agent), servers if isinstance(servers, list) else [])
    except mcp.ServerUnavailable as unavailable:
        raise errors.RunFailure(f"{unavailable} Nothing was executed.") from unavailable
    if registry.fingerprint(agent, mcp.listing()) != run.agent_fingerprint and (
        # A pause fingerprinted before the servers' input schemas were read (mcp.listing).
        registry.fingerprint(agent, mcp.listing(schemas=False)) != run.agent_fingerprint
    ):
        raise errors.RunFailure(
            "The agent changed since this run paused (its tools, their arguments or approval "
            "settings differ, or those of its MCP servers); nothing was executed."
        )
    requests = await db_hop(_requests_with_decisions)(run)
    _refuse_injected_approvals(saved, requests)
    edited = edits.checked_edits(run, requests)
    saved = edits.with_edits(saved, requests, edited)
    try:
        state = await RunState.from_json(
            agent, saved, context_deserializer=run_context.deserialize, strict_context=True
        )
    except Exception as exc:
        raise errors.RunFailure(
            f"The saved state could not be read ({exc}); nothing was executed."
        ) from exc
    _apply_decisions(state, requests)
    return state, edited


async def check_context(run: AgentRun) -> run_context.RunContext:
    """The context the resumed run acts with, from its (verified) saved state: it must be this
    run's, and the user who asked must still be active, or nothing of the paused call runs."""
    saved = (run.state or {}).get("context") or {}
    data = saved.get("context") if isinstance(saved, dict) else None
    if data is None:
        # Saved before runs carried a context: the run's own row says whom it acts for.
        context = run_context.RunContext.for_run(run)
    else:
        try:
            context = run_context.deserialize(data)
        except (TypeError, ValueError) as exc:
            raise errors.RunFailure(
                f"The saved state's context could not be read ({exc}); nothing was executed."
            ) from exc
    expected = run_context.RunContext.for_run(run)
    # A user deleted while the run waited leaves `requested_by` empty (SET_NULL): the lookup
    # below says so.
    if (context.run_id, context.conversation_id, context.session_id) != (
        expected.run_id,
        expected.conversation_id,
        expected.session_id,
    ) or (run.requested_by_id is not None and context.user_id != run.requested_by_id):
        raise errors.RunFailure(
            "The saved state acts for another run or user than this one; nothing was executed."
        )
    if context.user_id is not None:
        # Loaded here, once, for the tools too (kept on the context).
        reason = await db_hop(_requester_gone)(context)
        if reason:
            raise errors.RunFailure(reason)
    return context


def _requester_gone(context: run_context.RunContext) -> str:
    """Why the user who asked can no longer be acted for, or "" when they still can."""
    try:
        run_context.requesting_user_sync(context)
    except run_context.RequesterUnavailable:
        user = get_user_model().objects.filter(pk=context.user_id or 0).first()
        if user is None:
            return "The user who asked was deleted while the run waited; nothing was executed."
        return (
            f"The user who asked ({user.get_username()}) was deactivated while the run "
            "waited; nothing was executed."
        )
    return ""


def _requests_with_decisions(run: AgentRun) -> dict[str, tuple[ApprovalRequest, ApprovalDecision]]:
    """The pause's requests, each with its latest decision: two plain statements, not one
    query a request (`agentsite.db.sql.Columns`; resume: they cost 1.7 ms through the ORM)."""
    of_pause = columns(ApprovalRequest).filter(
        {"run": run.pk, "pause": run.pause_count}, order_by=("id",)
    )
    latest: dict[int, ApprovalDecision] = {}
    for decision in columns(ApprovalDecision).filter(
        {"request__in": [request.pk for request in of_pause]}, order_by=("created", "id")
    ):
        latest[decision.request_id] = decision  # the last one wins
    pairs: dict[str, tuple[ApprovalRequest, ApprovalDecision]] = {}
    for request in of_pause:
        request.run = run
        decision = latest.get(request.pk)
        if decision is not None:
            decision.request = request
        if decision is None or not request.is_decided:
            raise errors.RunFailure(
                f"The request for {request.tool_name} has no decision; nothing was executed."
            )
        pairs[request.call_id] = (request, decision)
    return pairs


def _refuse_injected_approvals(saved: dict[str, Any], requests: dict[str, Any]) -> None:
    """The SDK keeps decisions inside the state; ours live in our rows. None may be in there
    for a call that is waiting for us."""
    approvals = (saved.get("context") or {}).get("approvals") or {}
    for record in approvals.values() if isinstance(approvals, dict) else []:
        for key in ("approved", "rejected"):
            listed = record.get(key) if isinstance(record, dict) else None
            if isinstance(listed, list) and set(listed) & set(requests):
                raise errors.RunFailure(
                    "The saved state already holds a decision for a call that waits for a "
                    "reviewer; it was tampered with, and nothing was executed."
                )


def _apply_decisions(
    state: RunState[Any], requests: dict[str, tuple[ApprovalRequest, ApprovalDecision]]
) -> None:
    interruptions = {item.call_id or "": item for item in state.get_interruptions()}
    if set(interruptions) != set(requests):
        raise errors.RunFailure(
            "The saved state does not match this run's approval requests; nothing was executed."
        )
    for call_id, item in interruptions.items():
        request, decision = requests[call_id]
        seen = {arguments_hash(request.arguments), request.arguments_hash, decision.arguments_hash}
        # An edited call was rewritten to the reviewer's arguments (`edits.with_edits`, which
        # checked the model's first): those must be what runs.
        runs_with = decision.edited_arguments_hash if decision.is_edit else request.arguments_hash
        if len(seen) != 1 or arguments_hash(paused_calls.arguments(item)) != runs_with:
            raise errors.RunFailure(
                f"The arguments of {request.tool_name} are not the ones the reviewer saw; "
                "nothing was executed."
            )
    for call_id, item in interruptions.items():
        request, decision = requests[call_id]
        if decision.is_response:
            # Answered as the tool: the SDK's rejection is its one way to give the model an
            # output without running the tool, and it sends this exact text back as the
            # call's output (`RunState.reject(rejection_message=...)`). Never "always": the
            # reviewer answered this call, not the next ones.
            state.reject(item, rejection_message=decision.message)
        elif decision.approved:
            state.approve(item, always_approve=decision.always)
        else:
            state.reject(
                item,
                always_reject=decision.always,
                rejection_message=rejection_text(request, decision),
            )


def rejection_text(request: ApprovalRequest, decision: ApprovalDecision) -> str:
    """What the model reads as the tool's output when a call is rejected (or answered as
    the tool: exactly the reviewer's text)."""
    if decision.is_response or request.status in (ApprovalStatus.EXPIRED, ApprovalStatus.WITHDRAWN):
        return decision.message
    if decision.by_policy:
        said = (
            f"This tool call was rejected by the policy “{decision.policy_name}”; it did not run."
        )
        return f"{said} {decision.message}" if decision.message else said
    if decision.message:
        return f"A reviewer rejected this tool call: {decision.message}"
    return str(settings.AGENTSITE_REJECTION_MESSAGE)
