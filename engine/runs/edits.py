"""Edit, then approve: a reviewer's arguments checked against the tool and signed by the site,
and written into the restored copy of the state and into the session.

The SDK (0.24) has no argument override on approve: `RunState.approve(item)` runs the call as
the model made it. A saved state holds that call in several places (the model's response, the
generated and session items, the pending interruption, the last processed response's function
runs, which is what the SDK executes on resume), each a
`{"type": "function_call", "call_id": ..., "arguments": "<json>"}`. An edited call is rewritten
in all of them alike, in the copy of the verified state that is restored, never in the stored
one (whose signature stays the one it was saved with), and only from a decision row whose edit
is signed by the site. The conversation's session, which stored the model's call at the pause,
is given the call that ran (`edit_session_calls`)."""

from __future__ import annotations

import copy
import hmac
import json
import logging
from typing import TYPE_CHECKING, Any

from agents._tool_invocation import tool_invocation_identity_and_scope
from django.utils.crypto import salted_hmac

from approvals.models import ApprovalDecision, ApprovalRequest, ToolKind, arguments_hash
from conversations.items import is_user_message
from conversations.session import rewrite_items
from engine import registry
from engine.models import AgentRun
from engine.runs import errors, rows

if TYPE_CHECKING:
    from engine.permissions import User


logger = logging.getLogger(__name__)


EDIT_SALT = "agentsite.runs.edit"


def sign_edit(request: ApprovalRequest, reviewer_id: int | None, old: str, new: str) -> str:
    """The site's signature over an edit: which call (request, run, pause, call id), who
    edited it, and the hashes of the model's and the reviewer's arguments."""
    canonical = json.dumps(
        [request.pk, request.run_id, request.pause, request.call_id, reviewer_id, old, new],
        separators=(",", ":"),
    )
    return salted_hmac(EDIT_SALT, canonical, algorithm="sha256").hexdigest()


def edit_refusal(request: ApprovalRequest, sheet: registry.ToolSheet | None = None) -> str:
    """Why the call's arguments may not be edited before it is approved ("" when they may):
    the one rule the inbox's form, the API, a decision and the resume all read.

    Only a call of a function tool, or of a local MCP server's tool the deployment declared
    (`registry.review(server, tool_name=...)`), whose JSON schema an edit is checked against (the
    server's as it listed it at the pause; a shell command, a patch have none, and a function
    tool of the same name must not lend its own), with its stored arguments intact, of a tool
    whose author allows edits (`registry.review(editable=...)`). `sheet`: the tool's, when
    the caller has it."""
    if request.kind == ToolKind.MCP:
        if sheet is None:
            sheet = registry.request_sheet(request.run.agent_name, request)
        if not sheet.review.declared:
            return (
                f"The arguments of {request.tool_name}, a tool of the MCP server "
                f"“{request.server}”, can be edited only once the deployment declares the "
                "tool (review(server, tool_name=...)): approve or reject the call as it is."
            )
    elif request.kind != ToolKind.FUNCTION:
        return (
            "Only a function tool's arguments can be edited, and this call is for a tool of "
            f"another kind ({request.get_kind_display()}): approve or reject it as it is."
        )
    if not request.can_be_edited:
        return (
            "The arguments of this request were changed outside agentsite, so they cannot be "
            "edited; reject it."
        )
    if sheet is None:
        sheet = registry.request_sheet(request.run.agent_name, request)
    if not sheet.editable:
        return (
            f"The arguments of {request.tool_name} cannot be edited (its author does not "
            "allow it); approve or reject the call as it is."
        )
    return ""


def edit_fields(
    request: ApprovalRequest, run: AgentRun, reviewer: User | None, edited: Any
) -> dict[str, Any]:
    """What an edit adds to its decision; {} when the arguments are the model's.

    Raises:
        InvalidDecision: the call may not be edited (`edit_refusal`), or the arguments do
            not fit the tool's schema.
    """
    request.run = run
    sheet = registry.request_sheet(run.agent_name, request)
    refusal = edit_refusal(request, sheet)
    if refusal:
        raise errors.InvalidDecision(refusal)
    problems = registry.argument_errors(sheet.schema, edited)
    if problems:
        raise errors.InvalidDecision(
            "The edited arguments do not fit the tool: " + "; ".join(problems)
        )
    new = arguments_hash(edited)
    if new == request.arguments_hash:
        return {}
    reviewer_id = reviewer.pk if reviewer is not None else None
    return {
        "edited_arguments": edited,
        "edited_arguments_hash": new,
        "edit_signature": sign_edit(request, reviewer_id, request.arguments_hash, new),
    }


def checked_edits(
    run: AgentRun, requests: dict[str, tuple[ApprovalRequest, ApprovalDecision]]
) -> dict[str, str]:
    """The edited calls of the pause (call id -> their arguments as JSON text), each edit
    checked: its hash, the site's signature over it, and that the tool still allows edits."""
    edits: dict[str, str] = {}
    for call_id, (request, decision) in requests.items():
        if not decision.is_edit:
            continue
        request.run = run
        refusal = edit_refusal(request)
        if refusal:
            raise errors.RunFailure(
                f"The call of {request.tool_name} was edited, but may not be: {refusal} "
                "Nothing was executed."
            )
        signature = sign_edit(
            request, decision.reviewer_id, decision.arguments_hash, decision.edited_arguments_hash
        )
        if arguments_hash(decision.edited_arguments) != decision.edited_arguments_hash or not (
            hmac.compare_digest(signature, decision.edit_signature)
        ):
            raise errors.RunFailure(
                f"The edited arguments of {request.tool_name} were changed outside agentsite "
                "(they do not match the reviewer's signed edit); nothing was executed."
            )
        edits[call_id] = json.dumps(
            decision.edited_arguments, ensure_ascii=False, separators=(",", ":")
        )
    return edits


def with_edits(
    saved: dict[str, Any],
    requests: dict[str, tuple[ApprovalRequest, ApprovalDecision]],
    edits: dict[str, str],
) -> dict[str, Any]:
    """A copy of the saved state whose edited calls carry the reviewer's arguments, wherever
    the state holds them. Each must hold the model's arguments first, or nothing runs."""
    if not edits:
        return saved
    edited = copy.deepcopy(saved)
    calls: dict[str, dict[str, Any]] = {}

    def rewrite(node: Any) -> None:
        if isinstance(node, dict):
            call_id = node.get("call_id")
            if node.get("type") == "function_call" and call_id in edits:
                request = requests[call_id][0]
                if arguments_hash(node.get("arguments")) != request.arguments_hash:
                    raise errors.RunFailure(
                        f"The arguments of {request.tool_name} are not the ones the reviewer "
                        "saw; nothing was executed."
                    )
                calls.setdefault(call_id, dict(node))
                node["arguments"] = edits[call_id]
            for value in node.values():
                rewrite(value)
        elif isinstance(node, list):
            for value in node:
                rewrite(value)

    rewrite(edited)
    if set(calls) != set(edits):
        raise errors.RunFailure(
            "The saved state does not hold a call the reviewer edited; nothing was executed."
        )
    _refingerprint(edited, calls, edits)
    return edited


def _refingerprint(
    state: dict[str, Any], calls: dict[str, dict[str, Any]], edits: dict[str, str]
) -> None:
    """The SDK's ledger of the run's tool invocations (`context.tool_invocations`) keeps a
    fingerprint of each call's arguments and refuses a call whose arguments differ from it
    ("reused a tool call ID"): an edited call's entry takes the fingerprint of the edited
    call, computed by the SDK's own function, once that function is seen to give the stored
    fingerprint for the model's call (else the SDK changed how it fingerprints: fail closed)."""
    ledger = (state.get("context") or {}).get("tool_invocations")
    for call_id, original in calls.items():
        entry = ledger.get(call_id) if isinstance(ledger, dict) else None
        if entry is None:
            continue  # a state without a ledger (schema < 1.15): nothing to keep in step
        before = tool_invocation_identity_and_scope(original)
        after = tool_invocation_identity_and_scope({**original, "arguments": edits[call_id]})
        if before is None or after is None or entry.get("fingerprint") != before[3]:
            raise errors.RunFailure(
                "The saved state's record of this call cannot be brought in line with the "
                "edited arguments (the SDK's format changed?); nothing was executed."
            )
        entry["fingerprint"] = after[3]


async def edit_session_calls(run: AgentRun, edits: dict[str, str]) -> None:
    """Give the conversation's session the calls as they run: the SDK stored the model's at
    the pause. Each edited call's item is rewritten in place, all in one transaction
    (`session.rewrite_items`; through the cipher when the session is encrypted), so the
    history never lacks an item however the process ends. Before the run goes on, by the
    one resume that claimed the state; should it fail, the run still runs the edited call
    (logged)."""
    session = rows.session_of(run)

    turn_started = False  # items come newest first: older turns' calls stay as they ran

    def edited(item: Any) -> Any:
        nonlocal turn_started
        turn_started = turn_started or is_user_message(item)
        if (
            not turn_started
            and isinstance(item, dict)
            and item.get("type") == "function_call"
            and item.get("call_id") in edits
            and item.get("arguments") != edits[str(item["call_id"])]
        ):
            return {**item, "arguments": edits[str(item["call_id"])]}
        return None

    try:
        if not await rewrite_items(session, edited, rows.LOOKBACK_ITEMS):
            logger.warning("Run %s: its session does not hold the edited call(s).", run.pk)
    except Exception:
        logger.exception("Run %s: the session was not given the edited call(s)", run.pk)
