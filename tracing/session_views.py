"""Conversations as sessions, for operators: every conversation with its turns' totals, and
one conversation as its turns in order (each run: input, reply, tools, approvals, tokens,
cost, active and waiting time, outcome, the end user's feedback), totals at the top; for a
conversation its owner edited, each turn's version and turn on it with the tokens its
session stored for that turn, and the versions' totals.

Access is the trace viewer's (`access.trace_viewer_required`). A page reads a fixed number of
queries whatever the number of turns: the runs, their traces, requests, decisions, tool
spans, usage and feedback are each one query for the whole conversation. What people and
models wrote is masked (`redaction.clean`) and escaped by the templates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Exists, OuterRef, Q, Subquery, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from common import formatting
from conversations.models import (
    MAIN_BRANCH,
    Conversation,
    TurnUsage,
    branch_label,
)
from engine.models import AgentRun, RunStatus
from tracing import pricing, redaction
from tracing.access import trace_viewer_required
from tracing.forms import CursorField, make_cursor
from tracing.models import (
    STATUS_OUTCOME,
    Feedback,
    FeedbackScore,
    Span,
    Trace,
    TraceOutcome,
    trace_status,
)

PAGE_SIZE = 50
# An operator reads a turn's text here; the trace holds all of it.
TEXT_CHARS = 4000
PREVIEW_CHARS = 120


def masked(text: str, limit: int = TEXT_CHARS) -> str:
    """What a person or a model wrote, masked as traces are, then cut to `limit`."""
    cleaned = str(redaction.clean(text or ""))
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1].rstrip() + "…"


# --- one conversation -----------------------------------------------------------------------


@dataclass
class ToolCall:
    name: str
    needed_approval: bool
    failed: bool


@dataclass
class Approval:
    """One paused call: what it was, how it was decided, by whom, after how long."""

    tool: str
    call: str
    status: str
    decision: str  # the decision's kind in words, or "waiting"
    who: str  # a reviewer, "policy <name>", "the expiry", the user who withdrew it
    waited_seconds: float | None
    waited: str
    pending: bool
    # What the reviewer told the agent (a rejection's reason), masked; and where it was
    # escalated when nobody decided in time.
    message: str = ""
    escalated_to: str = ""


@dataclass
class TurnTokens:
    """What a turn used, as the conversation's session stored it (`store_run_usage`: the
    latest run of that turn of its version, a paused run's pause included)."""

    requests: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    cached_tokens: int
    reasoning_tokens: int


@dataclass
class Version:
    """One version of a conversation that was edited: its turns' tokens summed."""

    branch_id: str
    label: str
    current: bool
    turns: int = 0
    tokens: int = 0


@dataclass
class Turn:
    number: int
    run: AgentRun
    trace: Trace | None
    input: str
    reply: str
    failure: str
    tools: list[ToolCall]
    approvals: list[Approval]
    tokens: int
    cost: pricing.Shown
    active_seconds: float | None
    waiting_seconds: float | None
    outcome: str
    outcome_label: str
    outcome_reason: str
    feedback: list[Feedback]
    trace_url: str
    # Its version of the conversation (a label, when there are several), the turn it is on
    # that version, and what that turn used (None: not stored, e.g. a failed run).
    branch: str = ""
    branch_turn: int = 0
    usage: TurnTokens | None = None

    @property
    def active(self) -> str:
        return formatting.duration(self.active_seconds)

    @property
    def waiting(self) -> str:
        return formatting.duration(self.waiting_seconds)

    @property
    def failed(self) -> bool:
        return self.outcome == TraceOutcome.FAILED


@dataclass
class Totals:
    turns: int = 0
    tokens: int = 0
    cost: pricing.Shown | None = None
    active_seconds: float = 0.0
    waiting_seconds: float = 0.0
    approvals: int = 0
    pending: int = 0
    errors: int = 0
    thumbs_up: int = 0
    thumbs_down: int = 0
    agents: list[str] = field(default_factory=list)
    first: datetime | None = None
    last: datetime | None = None

    @property
    def active(self) -> str:
        return formatting.duration(self.active_seconds)

    @property
    def waiting(self) -> str:
        return formatting.duration(self.waiting_seconds)

    def add(self, turn: Turn) -> None:
        """Count `turn` in (its cost is summed apart, as `pricing.Cost`)."""
        run = turn.run
        self.turns += 1
        self.tokens += turn.tokens
        self.active_seconds += turn.active_seconds or 0.0
        self.waiting_seconds += turn.waiting_seconds or 0.0
        self.approvals += len(turn.approvals)
        self.pending += sum(1 for approval in turn.approvals if approval.pending)
        self.errors += 1 if turn.failed else 0
        self.thumbs_up += sum(1 for row in turn.feedback if row.score > 0)
        self.thumbs_down += sum(1 for row in turn.feedback if row.score < 0)
        if run.agent_name not in self.agents:
            self.agents.append(run.agent_name)
        ended = run.finished or run.updated
        self.first = run.created if self.first is None else min(self.first, run.created)
        self.last = ended if self.last is None else max(self.last, ended)


def _who(decision: ApprovalDecision | None, request: ApprovalRequest) -> str:
    if decision is None:
        return request.decider_display()
    if decision.reviewer is not None:
        name = decision.reviewer.get_username()
        return f"{name} (withdrew it)" if decision.withdrawn else name
    if decision.policy_name:
        return f"policy {decision.policy_name}"
    if decision.kind in (DecisionKind.EXPIRED, DecisionKind.EXPIRY_APPROVED):
        return "the expiry"
    return request.decider_display() or "the site"


def _approval(
    request: ApprovalRequest, decision: ApprovalDecision | None, now: datetime
) -> Approval:
    pending = request.status == ApprovalStatus.PENDING
    if pending:
        since = (now - request.created).total_seconds()
        waited_seconds: float | None = since
        waited = f"waiting for {formatting.short_span(int(since))}"
        label = "waiting"
    else:
        decided_at = decision.created if decision is not None else request.decided_at
        waited_seconds = (
            (decided_at - request.created).total_seconds() if decided_at is not None else None
        )
        waited = formatting.duration(waited_seconds)
        label = (
            str(DecisionKind(decision.kind).label)
            if decision is not None and decision.kind
            else str(ApprovalStatus(request.status).label)
        )
    return Approval(
        tool=request.tool_name,
        call=masked(request.call_display(), PREVIEW_CHARS * 2),
        status=request.status,
        decision=label,
        who="" if pending else _who(decision, request),
        waited_seconds=waited_seconds,
        waited=waited,
        pending=pending,
        message=masked(decision.message, PREVIEW_CHARS * 2) if decision is not None else "",
        escalated_to=request.escalate_to if request.escalated_at is not None else "",
    )


def _shown_trace(run: AgentRun, trace: Trace | None) -> Trace:
    # A run whose trace has no row yet reads its outcome from its own status.
    return trace if trace is not None else Trace(status=trace_status(run.status), run=run)


@dataclass
class Facts:
    """What a conversation's turns show beside their runs, each read in one query for the
    whole conversation."""

    usage: dict[int | None, TurnUsage]  # by run
    traces: dict[str, Trace]  # by trace id
    requests: dict[int, list[ApprovalRequest]]  # by run, oldest first
    decisions: dict[int, ApprovalDecision]  # by request: its first decision
    tools: dict[str, list[ToolCall]]  # by trace id, in order
    costs: dict[str, pricing.Cost]  # by trace id
    feedback: dict[int, list[Feedback]]  # by run, comments masked

    @classmethod
    def of(cls, conversation: Conversation, runs: list[AgentRun]) -> Facts:
        usage = {
            row.run_id: row
            for row in TurnUsage.objects.filter(conversation=conversation, run__isnull=False)
        }
        trace_ids = [run.trace_id for run in runs if run.trace_id]
        traces = {trace.trace_id: trace for trace in Trace.objects.filter(trace_id__in=trace_ids)}
        requests = _requests_of(conversation)
        decisions = _decisions_of(conversation)
        tools = _tools_of(runs, trace_ids, requests)
        costs = pricing.trace_costs(trace_ids, pricing.PriceBook.load())
        return cls(usage, traces, requests, decisions, tools, costs, _feedback_of(conversation))


def _requests_of(conversation: Conversation) -> dict[int, list[ApprovalRequest]]:
    requests: dict[int, list[ApprovalRequest]] = {}
    for request in (
        ApprovalRequest.objects.filter(run__conversation=conversation)
        .select_related("decided_by")
        .order_by("created", "pk")
    ):
        requests.setdefault(request.run_id, []).append(request)
    return requests


def _decisions_of(conversation: Conversation) -> dict[int, ApprovalDecision]:
    decisions: dict[int, ApprovalDecision] = {}
    for decision in (
        ApprovalDecision.objects.filter(request__run__conversation=conversation)
        .select_related("reviewer")
        .order_by("-created", "-pk")
    ):
        decisions[decision.request_id] = decision  # the first decision wins (oldest last)
    return decisions


def _tools_of(
    runs: list[AgentRun], trace_ids: list[str], requests: dict[int, list[ApprovalRequest]]
) -> dict[str, list[ToolCall]]:
    """Each trace's tool calls, in order: whether each needed approval, whether it failed."""
    tools: dict[str, list[ToolCall]] = {}
    approved_tools = {
        run_id: {request.tool_name for request in rows} for run_id, rows in requests.items()
    }
    run_of_trace = {run.trace_id: run.pk for run in runs if run.trace_id}
    for span_trace, name, error in (
        Span.objects.filter(trace_id__in=trace_ids, span_type="function")
        .order_by("started_at", "pk")
        .values_list("trace_id", "name", "error")
    ):
        trace_id = str(span_trace)
        run_pk = run_of_trace.get(trace_id)
        asked = approved_tools.get(run_pk, set()) if run_pk is not None else set()
        tools.setdefault(trace_id, []).append(ToolCall(name, name in asked, error is not None))
    return tools


def _feedback_of(conversation: Conversation) -> dict[int, list[Feedback]]:
    feedback: dict[int, list[Feedback]] = {}
    for row in Feedback.objects.filter(run__conversation=conversation).select_related("user"):
        row.comment = masked(row.comment)
        feedback.setdefault(row.run_id, []).append(row)
    return feedback


def conversation_turns(
    conversation: Conversation, *, price_links: bool, now: datetime | None = None
) -> tuple[list[Turn], Totals]:
    """The conversation's runs, oldest first, as turns, and their totals: eight queries,
    however many turns."""
    now = now or timezone.now()
    runs = list(
        AgentRun.objects.filter(conversation=conversation)
        .select_related("requested_by")
        .order_by("created", "pk")
    )
    facts = Facts.of(conversation, runs)
    turns: list[Turn] = []
    totals = Totals()
    total_cost = pricing.Cost()
    for number, run in enumerate(runs, start=1):
        cost = facts.costs.get(run.trace_id, pricing.Cost())
        total_cost.add(cost)
        turn = _turn(number, run, facts, cost, now=now, price_links=price_links)
        turns.append(turn)
        totals.add(turn)
    totals.cost = pricing.shown(total_cost, links=price_links)
    return turns, totals


def _turn(
    number: int,
    run: AgentRun,
    facts: Facts,
    cost: pricing.Cost,
    *,
    now: datetime,
    price_links: bool,
) -> Turn:
    trace = facts.traces.get(run.trace_id)
    shown = _shown_trace(run, trace)
    approvals = [
        _approval(request, facts.decisions.get(request.pk), now)
        for request in facts.requests.get(run.pk, [])
    ]
    failure = ""
    if run.status in (RunStatus.FAILED, RunStatus.GUARDRAIL, RunStatus.CANCELLED):
        failure = masked(run.error or "It stopped without saying why.")
    turn = Turn(
        number=number,
        run=run,
        trace=trace,
        input=masked(run.input),
        reply=masked(run.final_output),
        failure=failure,
        tools=facts.tools.get(run.trace_id, []),
        approvals=approvals,
        tokens=trace.total_tokens if trace is not None else 0,
        cost=pricing.shown(cost, links=price_links),
        active_seconds=trace.active_seconds if trace is not None else None,
        waiting_seconds=trace.waiting_seconds if trace is not None else None,
        outcome=shown.shown_outcome,
        outcome_label=shown.get_shown_outcome_display(),
        outcome_reason=shown.outcome_reason,
        feedback=facts.feedback.get(run.pk, []),
        trace_url=reverse("trace_detail", args=[run.trace_id]) if run.trace_id else "",
        branch=run.branch,
    )
    usage = facts.usage.get(run.pk)
    if usage is not None:
        turn.branch_turn = usage.turn
        turn.usage = _tokens(usage)
    return turn


def _tokens(usage: TurnUsage) -> TurnTokens:
    inputs, outputs = usage.input_tokens_details or {}, usage.output_tokens_details or {}
    return TurnTokens(
        requests=usage.requests,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        cached_tokens=int(inputs.get("cached_tokens") or 0),
        reasoning_tokens=int(outputs.get("reasoning_tokens") or 0),
    )


def versions(conversation: Conversation, turns: list[Turn]) -> list[Version]:
    """The conversation's versions, when it was edited (else none): each with how many of
    its turns used tokens and how many (from `turns`, no query)."""
    used = {turn.branch for turn in turns} | {conversation.current_branch}
    if used == {MAIN_BRANCH}:
        return []
    shown: dict[str, Version] = {
        branch: Version(branch, branch_label(branch), branch == conversation.current_branch)
        for branch in sorted(used, key=lambda branch: (branch != MAIN_BRANCH, branch))
    }
    for turn in turns:
        if turn.usage is not None:
            version = shown[turn.branch]
            version.turns += 1
            version.tokens += turn.usage.total_tokens
    for turn in turns:
        turn.branch = shown[turn.branch].label
    return list(shown.values())


@require_GET
@login_required
@trace_viewer_required
def trace_conversation(request: HttpRequest, session_id: str) -> HttpResponse:
    """One conversation for operators: its turns in order, totals at the top."""
    conversation = get_object_or_404(
        Conversation.objects.select_related("owner"), session_id=session_id
    )
    turns, totals = conversation_turns(
        conversation, price_links=pricing.may_add_prices(request.user)
    )
    context = {
        "conversation": conversation,
        "turns": turns,
        "versions": versions(conversation, turns),
        "totals": totals,
        "traces_url": reverse("trace_list") + "?" + urlencode({"conversation": session_id}),
    }
    return render(request, "tracing/conversation.html", context)


# --- every conversation ---------------------------------------------------------------------


class ConversationFilterForm(forms.Form):
    FEEDBACK = [
        ("", "Any"),
        ("down", "With a thumbs down"),
        ("up", "With a thumbs up"),
        ("any", "With any feedback"),
    ]

    user = forms.CharField(required=False, max_length=150)
    agent = forms.CharField(required=False, max_length=100)
    feedback = forms.ChoiceField(required=False, choices=FEEDBACK)
    older = CursorField(required=False)

    FILTERS = ("user", "agent", "feedback")

    def conversation_filter(self) -> Q:
        data = self.cleaned_data
        filters = Q()
        if data.get("user"):
            filters &= Q(owner__username=data["user"].strip())
        if data.get("agent"):
            filters &= Q(agent_name=data["agent"].strip())
        if data.get("feedback"):
            rated = Feedback.objects.filter(run__conversation=OuterRef("pk"))
            score = {"down": FeedbackScore.DOWN, "up": FeedbackScore.UP}.get(data["feedback"])
            filters &= Q(Exists(rated if score is None else rated.filter(score=score)))
        return filters

    def filter_values(self) -> dict[str, str]:
        return {
            name: str(self.cleaned_data[name]).strip()
            for name in self.FILTERS
            if self.cleaned_data.get(name)
        }


@dataclass
class ConversationRow:
    conversation: Conversation
    turns: int
    tokens: int
    cost: pricing.Shown
    outcome: str
    outcome_label: str
    preview: str
    thumbs_up: int = 0
    thumbs_down: int = 0

    @property
    def activity(self) -> str:
        return formatting.ago(self.conversation.updated)


def conversation_rows(
    filters: Q, older: tuple[datetime, int] | None, *, price_links: bool
) -> tuple[list[ConversationRow], str]:
    """A page of conversations with runs, newest activity first (keyset on updated, pk), and
    the cursor of the next, older page ("" if none): six queries a page."""
    found = _listed_conversations(filters, older)
    page = found[:PAGE_SIZE]
    sums = PageSums.of(page)
    rows = [sums.row(conversation, price_links=price_links) for conversation in page]
    cursor = ""
    if len(found) > PAGE_SIZE and page:
        cursor = make_cursor(page[-1].updated, page[-1].pk)
    return rows, cursor


def _listed_conversations(filters: Q, older: tuple[datetime, int] | None) -> list[Conversation]:
    """A page of conversations with runs and one more (is there an older page?), each with
    its newest trace's outcome and status and its first input."""
    newest_trace = Trace.objects.filter(group_id=OuterRef("session_id")).order_by(
        "-started_at", "-pk"
    )
    first_run = AgentRun.objects.filter(conversation=OuterRef("pk")).order_by("created", "pk")
    conversations = (
        Conversation.objects.filter(filters)
        .filter(Exists(AgentRun.objects.filter(conversation=OuterRef("pk"))))
        .select_related("owner")
        .annotate(
            last_outcome=Subquery(newest_trace.values("outcome")[:1]),
            last_status=Subquery(newest_trace.values("status")[:1]),
            first_input=Subquery(first_run.values("input")[:1]),
        )
    )
    if older is not None:
        at, pk = older
        conversations = conversations.filter(
            Q(updated__lte=at) & (Q(updated__lt=at) | Q(pk__lt=pk))
        )
    return list(conversations.order_by("-updated", "-pk")[: PAGE_SIZE + 1])


@dataclass
class PageSums:
    """A page's conversations summed: turns, tokens, ratings and cost, each one query for
    the page."""

    turns: dict[int, int]  # by conversation pk
    tokens: dict[str, int]  # by session id
    scores: dict[tuple[int, int], int]  # (conversation pk, score) -> ratings
    costs: dict[str, pricing.Cost]  # by session id

    @classmethod
    def of(cls, page: list[Conversation]) -> PageSums:
        pks = [conversation.pk for conversation in page]
        sessions = [conversation.session_id for conversation in page]
        turns = dict(
            AgentRun.objects.filter(conversation_id__in=pks)
            .order_by()
            .values("conversation_id")
            .annotate(n=Count("pk"))
            .values_list("conversation_id", "n")
        )
        tokens = dict(
            Trace.objects.filter(group_id__in=sessions)
            .order_by()
            .values("group_id")
            .annotate(n=Sum("total_tokens"))
            .values_list("group_id", "n")
        )
        scores: dict[tuple[int, int], int] = {
            (conversation_id, score): n
            for conversation_id, score, n in Feedback.objects.filter(run__conversation_id__in=pks)
            .order_by()
            .values("run__conversation_id", "score")
            .annotate(n=Count("pk"))
            .values_list("run__conversation_id", "score", "n")
        }
        costs = (
            pricing.costs_by(Span.objects.filter(trace__group_id__in=sessions), "trace__group_id")
            if sessions
            else {}
        )
        return cls(turns, tokens, scores, costs)

    def row(self, conversation: Conversation, *, price_links: bool) -> ConversationRow:
        outcome = getattr(conversation, "last_outcome", None) or STATUS_OUTCOME.get(
            getattr(conversation, "last_status", None) or "", TraceOutcome.RUNNING
        )
        first_input = str(getattr(conversation, "first_input", None) or "")
        return ConversationRow(
            conversation=conversation,
            turns=int(self.turns.get(conversation.pk, 0)),
            tokens=int(self.tokens.get(conversation.session_id) or 0),
            cost=pricing.shown(
                self.costs.get(conversation.session_id, pricing.Cost()), links=price_links
            ),
            outcome=str(outcome),
            outcome_label=str(TraceOutcome(outcome).label),
            preview=formatting.preview(
                conversation.title or masked(first_input, PREVIEW_CHARS * 2), PREVIEW_CHARS
            ),
            thumbs_up=self.scores.get((conversation.pk, FeedbackScore.UP), 0),
            thumbs_down=self.scores.get((conversation.pk, FeedbackScore.DOWN), 0),
        )


@dataclass
class FilterTotals:
    conversations: int
    turns: int
    tokens: int
    cost: pricing.Shown


def filter_totals(filters: Q, *, price_links: bool) -> FilterTotals:
    """Every conversation a filter selects, summed (a user's cost, an agent's): four queries."""
    conversations = Conversation.objects.filter(filters).filter(
        Exists(AgentRun.objects.filter(conversation=OuterRef("pk")))
    )
    sessions = conversations.values("session_id")
    tokens = Trace.objects.filter(group_id__in=sessions).aggregate(n=Sum("total_tokens"))["n"]
    cost = pricing.total_cost(Span.objects.filter(trace__group_id__in=sessions))
    return FilterTotals(
        conversations=conversations.count(),
        turns=AgentRun.objects.filter(conversation__in=conversations).count(),
        tokens=int(tokens or 0),
        cost=pricing.shown(cost, links=price_links),
    )


@require_GET
@login_required
@trace_viewer_required
def trace_conversations(request: HttpRequest) -> HttpResponse:
    """Every conversation that has runs, newest activity first, 50 a page; by user, by agent."""
    form = ConversationFilterForm(request.GET)
    valid = form.is_valid()
    rows: list[ConversationRow] = []
    cursor, filters = "", {}
    totals = None
    if valid:
        links = pricing.may_add_prices(request.user)
        rows, cursor = conversation_rows(
            form.conversation_filter(), form.cleaned_data.get("older"), price_links=links
        )
        filters = form.filter_values()
        if filters:
            totals = filter_totals(form.conversation_filter(), price_links=links)
    base = reverse("trace_conversations")
    context = {
        "form": form,
        "rows": rows,
        "totals": totals,
        "filtered": bool(filters),
        "older_url": f"{base}?{urlencode({**filters, 'older': cursor})}" if cursor else "",
        "newest_url": (f"{base}?{urlencode(filters)}" if filters else base)
        if valid and form.cleaned_data.get("older")
        else "",
    }
    return render(request, "tracing/conversations.html", context, status=200 if valid else 400)
