"""What a paused tool call is, read from the SDK's approval item (`ToolApprovalItem`).

The SDK pauses more than function tools: an MCP server's tool (a function call whose origin
is the server), a hosted MCP server's tool (the model's `mcp_approval_request`), a shell
command (`shell_call` / `local_shell_call`), a file patch (`apply_patch_call`). Each is one
approval request like any other; what differs is its kind, the server it belongs to, and
what its "arguments" are: the JSON of the call for tools, the command (`action`) of a shell
call, the patch (`operation`) of an apply_patch call. Those are what a reviewer reads, what
policies match and what the request's hash holds, so a call cannot change between the pause
and its resume.
"""

from __future__ import annotations

import json
from typing import Any

from agents.items import ToolApprovalItem
from agents.tool import ToolOriginType

from approvals.models import ToolKind

SHELL_TYPES = ("shell_call", "local_shell_call")


def raw(item: ToolApprovalItem) -> dict[str, Any]:
    """The call the model made, as a plain dict."""
    call = item.raw_item
    if isinstance(call, dict):
        return call
    dump = getattr(call, "model_dump", None)
    if callable(dump):
        dumped = dump(exclude_unset=True, mode="json")
        return dumped if isinstance(dumped, dict) else {}
    return dict(vars(call)) if hasattr(call, "__dict__") else {}


def kind(item: ToolApprovalItem) -> str:
    call_type = raw(item).get("type")
    if call_type == "function_call":
        origin = item.tool_origin
        if origin is not None and origin.type == ToolOriginType.MCP:
            return ToolKind.MCP
        return ToolKind.FUNCTION
    if call_type == "mcp_approval_request":
        return ToolKind.HOSTED_MCP
    if call_type in SHELL_TYPES:
        return ToolKind.SHELL
    if call_type == "apply_patch_call":
        return ToolKind.APPLY_PATCH
    return ToolKind.OTHER


def server(item: ToolApprovalItem) -> str:
    """The MCP server a call's tool belongs to: a local server's name, a hosted server's
    label; "" for any other tool."""
    call = raw(item)
    if call.get("type") == "mcp_approval_request":
        return str(call.get("server_label") or "")
    origin = item.tool_origin
    if origin is not None and origin.type == ToolOriginType.MCP:
        return origin.mcp_server_name or ""
    return ""


def arguments(item: ToolApprovalItem) -> str | None:
    """The call's arguments as JSON text: what is shown, matched and hashed."""
    call = raw(item)
    call_type = call.get("type")
    if call_type in SHELL_TYPES:
        return _json(call.get("action"))
    if call_type == "apply_patch_call":
        return _json(call.get("operation"))
    return item.arguments


def _json(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
