"""The `data` of each event (docs/webhooks.md), from the engine's rows as they stand in the
transaction that announces them. Never a reviewer's note: it is for reviewers only."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest
from engine.models import AgentRun, RunStatus


def _when(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _username(user: Any) -> str | None:
    return user.get_username() if user is not None else None


def request_url(request_id: int) -> str:
    """The request's page, absolute when AGENTSITE_WEBHOOK_SITE_URL is set."""
    path = reverse("inbox_request", args=[request_id])
    return f"{settings.AGENTSITE_WEBHOOK_SITE_URL.rstrip('/')}{path}"


def request_data(request: ApprovalRequest) -> dict[str, Any]:
    run = request.run
    return {
        "id": request.pk,
        "run_id": request.run_id,
        "agent": request.agent_name,
        "tool": request.tool_name,
        # What kind of tool, and the MCP server of an MCP tool ("" for other kinds); receivers
        # ignore fields they do not know.
        "kind": request.kind,
        "server": request.server,
        "arguments": request.arguments,
        "asked_by": _username(run.requested_by) if run.requested_by_id else None,
        "status": request.status,
        "created": _when(request.created),
        "expires_at": _when(request.expires_at),
        "url": request_url(request.pk),
    }


def decided_by(decision: ApprovalDecision) -> str | None:
    """The reviewer's username (the asker's for a withdrawal), "policy <name>", or None for
    a request that expired."""
    if decision.reviewer_id is not None:
        return _username(decision.reviewer)
    if decision.policy_name:
        return f"policy {decision.policy_name}"
    return None


def decision_data(request: ApprovalRequest, decision: ApprovalDecision) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": decision.kind,
        "approved": decision.approved,
        "decided_by": decided_by(decision),
        "message": decision.message,
        "decided_at": _when(decision.created),
    }
    if decision.edited_arguments is not None:
        data["edited_arguments"] = decision.edited_arguments
    shown = request_data(request)
    # The engine decided it with an UPDATE: the object it holds still reads "pending".
    shown["status"] = (
        ApprovalRequest.objects.filter(pk=request.pk).values_list("status", flat=True).get()
    )
    return {"request": shown, "decision": data}


def run_data(run_id: int) -> dict[str, Any]:
    run = AgentRun.objects.select_related("conversation", "requested_by").get(pk=run_id)
    data: dict[str, Any] = {
        "id": run.pk,
        "agent": run.agent_name,
        "conversation": run.conversation.session_id,
        "asked_by": _username(run.requested_by),
        "status": run.status,
        "error": run.error,
        "created": _when(run.created),
        "finished": _when(run.finished),
    }
    if run.status == RunStatus.COMPLETED:
        data["final_output"] = run.final_output
    return {"run": data}
