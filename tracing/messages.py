"""A model call's messages, read from the shapes providers store, as the span panel shows
them: pure functions, no database.

A generation's input and output come in either shape the SDK stores: Chat Completions
messages (`role`, `content`, `tool_calls`, role `tool`) or Responses items (`message`,
`function_call`, `function_call_output`, `reasoning`, other `*_call`s). Everything returned is
raw text: the templates escape it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Longer values (a long conversation in a generation's input) are cut; the export has all.
PREVIEW_CHARS = 20_000


def pretty(value: Any) -> str:
    """JSON (or a string holding JSON, like a tool call's arguments) indented for reading,
    cut at `PREVIEW_CHARS`."""
    if value is None:
        return ""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped.startswith(("{", "[")):
            return cut(value)
        try:
            value = json.loads(stripped)
        except ValueError:
            return cut(value)
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return cut(text)


def cut(text: str) -> str:
    """`text`, or its first `PREVIEW_CHARS` and how many more there are."""
    if len(text) <= PREVIEW_CHARS:
        return text
    more = len(text) - PREVIEW_CHARS
    return f"{text[:PREVIEW_CHARS]}\n… {more:,} more characters: see the JSON export."


@dataclass
class Message:
    """One entry of a model call's conversation, for people: who said it and what, a tool
    call (name and arguments), or a tool's result."""

    role: str  # system, user, assistant, tool, or what the item says
    kind: str = "text"  # text, tool_call, tool_result, reasoning, other
    text: str = ""
    name: str = ""  # the tool's, for a call
    arguments: str = ""  # pretty JSON, for a call
    call_id: str = ""

    @property
    def role_class(self) -> str:
        """The CSS class suffix of its role (user data never becomes a class name)."""
        known = ("system", "user", "assistant", "tool")
        return self.role if self.role in known else "other"


ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}
PART_NAMES = {
    "input_image": "[image]",
    "image_url": "[image]",
    "input_file": "[file]",
    "file": "[file]",
    "input_audio": "[audio]",
}


def conversation(items: Any) -> list[Message]:
    """A generation's input or output as messages, from either shape the SDK stores."""
    if items is None:
        return []
    if isinstance(items, str):
        return [Message("user", text=cut(items))] if items else []
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        return [Message("other", kind="other", text=pretty(items))]
    messages: list[Message] = []
    for item in items:
        if isinstance(item, dict):
            messages += _messages_of(item)
        elif item is not None:
            messages.append(Message("other", kind="other", text=cut(str(item))))
    return messages


def _messages_of(item: dict[str, Any]) -> list[Message]:
    kind = str(item.get("type") or "")
    role = str(item.get("role") or "")
    if kind == "function_call":
        return [_call(item.get("name"), item.get("arguments"), item.get("call_id"))]
    if kind.endswith("_call_output") or kind == "function_call_output":
        return [
            Message(
                "tool",
                kind="tool_result",
                text=_content_text(item.get("output")),
                call_id=str(item.get("call_id") or ""),
            )
        ]
    if kind == "reasoning":
        summary = item.get("summary")
        return [Message("assistant", kind="reasoning", text=_content_text(summary))]
    if role == "tool":  # Chat Completions: a tool's result
        return [
            Message(
                "tool",
                kind="tool_result",
                text=_content_text(item.get("content")),
                call_id=str(item.get("tool_call_id") or ""),
                name=str(item.get("name") or ""),
            )
        ]
    if role or kind == "message":
        return _chat_message(item, role)
    # Any other item (a hosted tool's call, a computer action, ...): its type and its JSON.
    return [Message("assistant", kind="other", name=kind or "item", text=pretty(item))]


def _chat_message(item: dict[str, Any], role: str) -> list[Message]:
    """A message with a role: its text (a refusal added), then each tool call it makes."""
    found: list[Message] = []
    text = _content_text(item.get("content"))
    refusal = item.get("refusal")
    if isinstance(refusal, str) and refusal:
        text = f"{text}\n[refused] {refusal}".strip()
    calls = item.get("tool_calls")
    if text or not isinstance(calls, list) or not calls:
        found.append(Message(ROLES.get(role, role or "assistant"), text=text))
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            found.append(_call(function.get("name"), function.get("arguments"), call.get("id")))
    return found


def _call(name: Any, arguments: Any, call_id: Any) -> Message:
    return Message(
        "assistant",
        kind="tool_call",
        name=str(name or "?"),
        arguments=pretty(arguments) if arguments not in (None, "") else "",
        call_id=str(call_id or ""),
    )


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or its parts' texts (other parts named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return cut(content)
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                kind = str(part.get("type") or "")
                value = part.get("text", part.get("refusal"))
                if isinstance(value, str):
                    texts.append(value)
                elif kind in PART_NAMES:
                    texts.append(PART_NAMES[kind])
                else:
                    texts.append(pretty(part))
        return cut("\n".join(texts))
    return pretty(content)
