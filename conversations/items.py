"""Session items as people read them: the one place that reads what the SDK stores.

The SDK stores Responses-API input dicts (a message, a tool call, its output, ...); see
`conversations.session`. The chat page, the inbox's request page, the approval requests and
the run engine read them here, so a call or a message reads the same wherever it is shown.
Nothing here imports the project: models, the engine and the views may all use it.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

from agents.extensions.memory.advanced_sqlite_session import AdvancedSQLiteSession


def kind(item: Any) -> str:
    """What a session item is for people: "user" or "assistant" (a message of that role),
    "call" (a tool call), "output" (a tool call's output), or "" (anything people don't read:
    reasoning, system messages, ...)."""
    if not isinstance(item, dict):
        return ""
    item_type = item.get("type")
    if item_type == "function_call":
        return "call"
    if item_type == "function_call_output":
        return "output"
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
