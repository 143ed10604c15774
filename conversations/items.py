"""Session items as people read them: the one place that reads what the SDK stores.

The SDK stores Responses-API input dicts (a message, a tool call, its output, ...); see
`conversations.session`. The chat page, the inbox's request page, the approval requests and
the run engine read them here, so a call or a message reads the same wherever it is shown.
Nothing here imports the project: models, the engine and the views may all use it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any, cast

from agents.extensions.memory.advanced_sqlite_session import AdvancedSQLiteSession


def kind(item: Any) -> str:
    """What a session item is for people: "user" or "assistant" (a message of that role),
    "call" (a tool call of any kind: `call_view`), "output" (what answers one: `output_view`),
    or "" (anything people don't read: reasoning, system messages, ...)."""
    if not isinstance(item, dict):
        return ""
    item_type = item.get("type")
    if item_type in _OUTPUTS or item_type == "mcp_approval_response":
        return "output"
    if item_type in OUTPUT_TYPES or item_type == "mcp_approval_request":
        return "call"
    if item_type == "mcp_call":
        # One whose approval was asked for answers that request; else it is the call.
        return "output" if item.get("approval_request_id") else "call"
    role = item.get("role")
    if role in ("user", "assistant") and item_type in (None, "message"):
        return str(role)
    return ""


def is_user_message(item: Any) -> bool:
    return kind(item) == "user"


# The SDK's own classification, which uses nothing of its session object: our rows then
# answer `get_conversation_by_turns` and `get_tool_usage` exactly as its tables do.
_message_type = AdvancedSQLiteSession._classify_message_type
_tool_name = AdvancedSQLiteSession._extract_tool_name


def structure(item: Any) -> tuple[str, str | None]:
    """An item's place in its branch's structure, as `AdvancedSQLiteSession` records it:
    its `message_type` ("user", "assistant", the item's type, else "other"; only a user
    message starts a turn) and its `tool_name`. Text either database cannot hold in a
    column (U+0000, a lone surrogate) is replaced with U+FFFD there; the item itself keeps
    it."""
    # The SDK's answer depends on these keys alone; a session appends the same few shapes
    # over and over (every append of a turn pays for this), so answers are kept by them.
    key = None
    if isinstance(item, dict):
        get = item.get
        role, kind, name = get("role"), get("type"), get("name")
        namespace, label = get("namespace"), get("server_label")
        # Text only (1 and True would be one key): anything else is asked each time.
        if (
            type(role) in _TEXT
            and type(kind) in _TEXT
            and type(name) in _TEXT
            and type(namespace) in _TEXT
            and type(label) in _TEXT
        ):
            key = (role, kind, name, namespace, label, "server_label" in item)
            found = _structures.get(key)
            if found is not None:
                return found
    nobody = cast(AdvancedSQLiteSession, None)
    found = _storable(_message_type(nobody, item)), _storable_or_none(_tool_name(nobody, item))
    if key is not None:
        if len(_structures) >= _STRUCTURES_KEPT:
            _structures.clear()
        _structures[key] = found
    return found


# What `_classify_message_type` and `_extract_tool_name` read of an item is its role, type,
# name, namespace and server label (and whether it has one at all).
_TEXT = frozenset({str, type(None)})
_STRUCTURES_KEPT = 4096
_structures: dict[tuple[Any, ...], tuple[str, str | None]] = {}


_ODD_TEXT = re.compile("[\x00\ud800-\udfff]")


def _storable(text: str) -> str:
    return _ODD_TEXT.sub("\ufffd", text)


def _storable_or_none(text: str | None) -> str | None:
    return None if text is None else _storable(text)


def content_text(content: Any, sep: str = "") -> str:
    """The text of a message's (or a tool output's) content: a string, or the text (or
    refusal) of each of its parts, joined with `sep`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                value = part.get("text", part.get("refusal", ""))
                if isinstance(value, str) and value:
                    parts.append(value)
            elif isinstance(part, str) and part:
                parts.append(part)
        return sep.join(parts)
    return ""


def message_text(item: Any, sep: str = "") -> str:
    """The text of a message item; "" for anything else."""
    return content_text(item.get("content"), sep) if isinstance(item, dict) else ""


def parse_arguments(raw: Any) -> Any:
    """A tool call's arguments as the tool receives them: the JSON the model sent, parsed
    (blank text is no arguments, as the SDK reads it); text that is not JSON stays text."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw


def format_call(name: str, arguments: Any) -> str:
    """`cancel_order(order_id=42)`: how a person reads a call, from its parsed arguments."""
    if isinstance(arguments, dict):
        args = ", ".join(
            f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in arguments.items()
        )
    else:
        args = json.dumps(arguments, ensure_ascii=False)
    return f"{name}({args})"


def call_display(name: str, arguments: Any) -> str:
    """`format_call` of a call item's arguments, as the model sent them (JSON text)."""
    return format_call(name, parse_arguments(arguments))


# --- tool calls of every kind ---------------------------------------------------------------
#
# Besides function calls, the SDK stores the calls of its other tools with outputs of their
# own (`agents.run_internal.items`): shell commands, file patches, a hosted MCP server's
# approval requests (answered by an approval response) and calls (which carry their output).

# What an apply_patch call does to its file, in words: its operation's `type`.
PATCH_VERBS = {"create_file": "create", "update_file": "update", "delete_file": "delete"}


def shell_lines(arguments: Any) -> list[str] | None:
    """A shell call's commands, one line each: a `shell_call` action's `commands`, or a
    `local_shell_call` action's argv as one shell line (`shlex.join`, quoted as a shell would
    read it); None when `arguments` is neither (`engine/calls.py` stores the action)."""
    if not isinstance(arguments, dict):
        return None
    commands = arguments.get("commands")
    if isinstance(commands, list) and all(isinstance(command, str) for command in commands):
        return list(commands)
    argv = arguments.get("command")
    if isinstance(argv, list) and argv and all(isinstance(part, str) for part in argv):
        return [shlex.join(argv)]
    return None


def patch_target(arguments: Any) -> tuple[str, str] | None:
    """An apply_patch call's operation (`create_file`, `update_file`, `delete_file`) and the
    file's path; None when `arguments` is not such an operation."""
    if not isinstance(arguments, dict):
        return None
    operation, path = arguments.get("type"), arguments.get("path")
    if operation not in PATCH_VERBS or not isinstance(path, str) or not path:
        return None
    return str(operation), path


def shell_call(name: str, arguments: Any) -> str | None:
    """`shell: ls -la; rm -rf build`: a shell call's commands (its action) on one line; None
    when `arguments` are no shell action."""
    lines = shell_lines(arguments)
    if lines is None:
        return None
    return f"{name}: " + "; ".join(line.replace("\n", " ↵ ") for line in lines)


def patch_call(name: str, arguments: Any) -> str | None:
    """`apply_patch: update src/app.py`: a patch call's operation on one line; None when
    `arguments` are no patch operation."""
    target = patch_target(arguments)
    if target is None:
        return None
    move_to = arguments.get("move_to")
    moved = f" → {move_to}" if isinstance(move_to, str) and move_to else ""
    return f"{name}: {PATCH_VERBS[target[0]]} {target[1]}{moved}"


# How a failed call's output begins: the SDK's own text for a tool that raised
# (`agents.tool.default_tool_error_function`), and the site's for an MCP server's `isError`
# result (`engine.mcp`), which the SDK would pass on as an ordinary answer.
TOOL_ERROR_PREFIX = "Tool error: "
_FAILED_OUTPUTS = (TOOL_ERROR_PREFIX, "An error occurred while running the tool")


def failed_output(text: str) -> bool:
    """Whether a call's output says the call failed."""
    return text.startswith(_FAILED_OUTPUTS)


# The output item answering each kind of call item (as `agents.run_internal.items` pairs them).
OUTPUT_TYPES = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "shell_call": "shell_call_output",
    "local_shell_call": "local_shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
}
_OUTPUTS = frozenset(OUTPUT_TYPES.values())


@dataclass(frozen=True)
class CallView:
    """A tool call item as people read it: what answers it, its tool, the call on one line,
    and, for a hosted MCP call that carries it, its output."""

    call_id: str
    name: str
    text: str
    output: str | None = None
    is_function: bool = False
    # A function or MCP call's arguments, parsed (what plain words are made of); else None.
    arguments: Any = None


def call_view(item: Any) -> CallView | None:
    """The call an item is, of any kind; None for anything else."""
    if not isinstance(item, dict):
        return None
    item_type = item.get("type")
    call_id = str(item.get("call_id") or item.get("id") or "")
    if item_type in ("function_call", "custom_tool_call"):
        name = str(item.get("name") or "tool")
        arguments = item.get("arguments") if item_type == "function_call" else item.get("input")
        shown = call_display(name, arguments)
        function = item_type == "function_call"
        parsed = parse_arguments(arguments) if function else None
        return CallView(call_id, name, shown, is_function=function, arguments=parsed)
    if item_type in ("shell_call", "local_shell_call"):
        name = "shell" if item_type == "shell_call" else "local_shell"
        action = item.get("action")
        return CallView(call_id, name, shell_call(name, action) or format_call(name, action))
    if item_type == "apply_patch_call":
        operation = item.get("operation")
        shown = patch_call("apply_patch", operation) or format_call("apply_patch", operation)
        return CallView(call_id, "apply_patch", shown)
    if item_type == "mcp_approval_request" or (
        item_type == "mcp_call" and not item.get("approval_request_id")
    ):
        name = str(item.get("name") or "tool")
        label = str(item.get("server_label") or "")
        shown = call_display(name, item.get("arguments"))
        if label:
            shown += f" · hosted MCP server {label}"
        output = _mcp_output(item) if item_type == "mcp_call" else None
        parsed = parse_arguments(item.get("arguments"))
        return CallView(str(item.get("id") or ""), name, shown, output, arguments=parsed)
    return None


def output_view(item: Any) -> tuple[str, str] | None:
    """(the call it answers, its text) for an item that answers a call; None otherwise."""
    if not isinstance(item, dict):
        return None
    item_type = item.get("type")
    if item_type in _OUTPUTS:
        call_id = str(item.get("call_id") or item.get("id") or "")
        output = item.get("output")
        if item_type == "shell_call_output":
            return call_id, _shell_output(output)
        if item_type == "apply_patch_call_output" and not output:
            return call_id, str(item.get("status") or "")
        if isinstance(output, str):
            return call_id, output
        return call_id, content_text(output, sep="\n") or json.dumps(output)
    if item_type == "mcp_approval_response":
        reason = item.get("reason")
        said = f": {reason}" if isinstance(reason, str) and reason else ""
        shown = "approved" if item.get("approve") else f"not approved{said}"
        return str(item.get("approval_request_id") or ""), shown
    if item_type == "mcp_call" and item.get("approval_request_id"):
        return str(item["approval_request_id"]), _mcp_output(item) or ""
    return None


def _mcp_output(item: dict[str, Any]) -> str | None:
    output, error = item.get("output"), item.get("error")
    if error:
        return f"error: {error}"
    return str(output) if output is not None else None


def _shell_output(output: Any) -> str:
    """What a shell call printed, command by command, with how each that failed ended."""
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        return json.dumps(output)
    parts = []
    for each in output:
        if not isinstance(each, dict):
            continue
        printed = "\n".join(
            str(text).rstrip("\n") for text in (each.get("stdout"), each.get("stderr")) if text
        )
        outcome = each.get("outcome")
        if isinstance(outcome, dict) and outcome.get("type") == "timeout":
            printed = f"{printed}\n(timed out)".lstrip("\n")
        elif isinstance(outcome, dict) and outcome.get("exit_code") not in (None, 0):
            printed = f"{printed}\n(exit {outcome['exit_code']})".lstrip("\n")
        parts.append(printed)
    return "\n".join(part for part in parts if part)


def stopped_output(item: Any, text: str) -> dict[str, Any] | None:
    """The output a call item gets when its run stopped before the tool answered (a model
    refuses a call without one on the next turn), saying `text`; None when `item` is no call
    the session must answer."""
    if not isinstance(item, dict) or item.get("type") not in OUTPUT_TYPES:
        return None
    call_id = str(item.get("call_id") or item.get("id") or "")
    output: dict[str, Any] = {"type": OUTPUT_TYPES[item["type"]], "call_id": call_id}
    if item["type"] == "shell_call":
        output["output"] = [
            {"stdout": "", "stderr": text, "outcome": {"type": "exit", "exit_code": 1}}
        ]
    else:
        output["output"] = text
    if item["type"] == "apply_patch_call":
        output["status"] = "failed"
    return output
