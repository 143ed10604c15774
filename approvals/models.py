"""Runs of agents, the approvals they wait for, and the audit of every decision.

The database is the truth about a run: its status, its one saved state, and who decided what.
Status changes that can race (deciding a request, claiming a run for resumption) are
conditional UPDATEs, so exactly one caller wins however many try at once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from agentsite.db.faithful import FaithfulJSONField
from conversations import items
from engine.models import AgentRun


def arguments_hash(arguments: Any) -> str:
    """A stable hash of a tool call's arguments, whatever their key order or spacing: of the
    arguments as the tool receives them (`items.parse_arguments`: blank text is the empty
    object, as they are stored; text that is not JSON is hashed as the raw text)."""
    canonical = json.dumps(
        items.parse_arguments(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# The verdicts of an approval policy that decide a call without a person.
POLICY_DECIDES = ("approve", "reject")

ARGUMENTS_TAMPERED = "arguments changed outside agentsite: not shown, cannot be approved"


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"
    WITHDRAWN = "withdrawn", "Withdrawn"
    # A reviewer wrote the call's result instead of running it ("respond").
    RESPONDED = "responded", "Answered by a reviewer"


# Decided, by a reviewer, by the expiry or withdrawn by the person who asked: each has its
# decision, which the run resumes with.
DECIDED_STATUSES = (
    ApprovalStatus.APPROVED,
    ApprovalStatus.REJECTED,
    ApprovalStatus.EXPIRED,
    ApprovalStatus.WITHDRAWN,
    ApprovalStatus.RESPONDED,
)


class DecisionKind(models.TextChoices):
    """What a decision did with the call: the audit's own word for it."""

    APPROVED = "approved", "Approved"
    # Approved after the reviewer changed the arguments: the tool ran with hers.
    EDITED = "edited", "Approved with edited arguments"
    REJECTED = "rejected", "Rejected"
    # The tool never ran: the model read the reviewer's text as its output.
    RESPONDED = "responded", "Answered as the tool"
    WITHDRAWN = "withdrawn", "Withdrawn"
    EXPIRED = "expired", "Expired"
    # Nobody decided in time and the expiry policy approved it (the tool's author allows it).
    EXPIRY_APPROVED = "expiry_approved", "Approved on expiry"

    @property
    def approves(self) -> bool:
        """Whether the call runs."""
        return self in APPROVING_KINDS

    @property
    def status(self) -> ApprovalStatus:
        """The status a decision of this kind gives its request."""
        return REQUEST_STATUS[self]


APPROVING_KINDS = (DecisionKind.APPROVED, DecisionKind.EDITED, DecisionKind.EXPIRY_APPROVED)
REQUEST_STATUS = {
    DecisionKind.APPROVED: ApprovalStatus.APPROVED,
    DecisionKind.EDITED: ApprovalStatus.APPROVED,
    DecisionKind.EXPIRY_APPROVED: ApprovalStatus.APPROVED,
    DecisionKind.REJECTED: ApprovalStatus.REJECTED,
    DecisionKind.RESPONDED: ApprovalStatus.RESPONDED,
    DecisionKind.WITHDRAWN: ApprovalStatus.WITHDRAWN,
    DecisionKind.EXPIRED: ApprovalStatus.EXPIRED,
}


class ExpiryAction(models.TextChoices):
    """What happens to a request nobody decided in time (its expiry policy)."""

    REJECT = "reject", "Reject"
    # Extend the deadline once and tell a second group; rejected at the new deadline.
    ESCALATE = "escalate", "Escalate to a group, then reject"
    # Only where the tool's author allows it (`registry.review(..., expiry_approval=True)`).
    APPROVE = "approve", "Approve"


class ApprovalOrigin(models.TextChoices):
    TOOL = "tool", "Tool"
    AGENT_AS_TOOL = "agent_as_tool", "Agent used as a tool"
    HANDOFF = "handoff", "After a handoff"


class ToolKind(models.TextChoices):
    """What kind of tool a paused call is for: each is shown and resumed its own way."""

    FUNCTION = "function", "Function tool"
    MCP = "mcp", "MCP server tool"
    HOSTED_MCP = "hosted_mcp", "Hosted MCP tool"
    SHELL = "shell", "Shell command"
    APPLY_PATCH = "apply_patch", "File patch"
    OTHER = "other", "Other tool"


MCP_KINDS = (ToolKind.MCP, ToolKind.HOSTED_MCP)


# What the inbox, its sockets, the history and the API filter requests by: each filter's
# name, and the request's column it selects on.
FILTER_COLUMNS = {"agent": "agent_name", "tool": "tool_name", "kind": "kind", "server": "server"}


class ApprovalRequestQuerySet(models.QuerySet["ApprovalRequest"]):
    def pending(self) -> ApprovalRequestQuerySet:
        return self.filter(status=ApprovalStatus.PENDING)

    def open(self, now: datetime | None = None) -> ApprovalRequestQuerySet:
        """Requests a reviewer can still decide: pending and not past their expiry."""
        return self.pending().filter(expires_at__gt=now or timezone.now())

    def overdue(self, now: datetime | None = None) -> ApprovalRequestQuerySet:
        """Pending requests past their expiry: the sweep expires them (or escalates them)."""
        return self.pending().filter(expires_at__lte=now or timezone.now())

    def due_for_reminder(self, now: datetime, before: timedelta) -> ApprovalRequestQuerySet:
        """Open requests that expire within `before` and whose reminder was not sent."""
        return self.open(now).filter(reminded_at__isnull=True, expires_at__lte=now + before)

    def of_pause(self, run: AgentRun, pause: int) -> ApprovalRequestQuerySet:
        return self.filter(run=run, pause=pause)


def default_expiry() -> Any:
    return timezone.now() + timedelta(seconds=settings.AGENTSITE_APPROVAL_TTL)


class ApprovalRequest(models.Model):
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="approval_requests")
    pause = models.PositiveIntegerField(help_text="Which pause of the run asked for this.")
    call_id = models.CharField(max_length=200)
    agent_name = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=200, db_index=True)
    arguments = FaithfulJSONField(help_text="The arguments as the model sent them (parsed).")
    arguments_hash = models.CharField(max_length=64)
    origin = models.CharField(
        max_length=20, choices=ApprovalOrigin.choices, default=ApprovalOrigin.TOOL
    )
    kind = models.CharField(
        max_length=20,
        choices=ToolKind.choices,
        default=ToolKind.FUNCTION,
        help_text="The kind of tool the call is for (a function, an MCP server's, a shell…).",
    )
    server = models.CharField(
        max_length=200,
        blank=True,
        help_text="The MCP server the tool belongs to: a local server's name, a hosted "
        "server's label; blank for other tools.",
    )
    # A local MCP server's tool: what the server said of it when the run listed it (its
    # "description" and input "schema"), for the reviewer; {} for other tools, whose sheet is
    # the agent's own (`registry.tool_sheet`).
    tool_sheet = models.JSONField(default=dict, blank=True)
    # The span of the agent that asked, in the run's trace (`engine.runs.spans`): where the
    # decision's span goes, whether or not the exporter has stored it yet; "" when unknown.
    agent_span_id = models.CharField(max_length=64, blank=True, default="")
    status = models.CharField(
        max_length=20,
        choices=ApprovalStatus.choices,
        default=ApprovalStatus.PENDING,
        db_index=True,
    )
    expires_at = models.DateTimeField(default=default_expiry, db_index=True)
    created = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # What the approval policies said when the run paused (`engine.policies.Verdict`): the
    # rule that decided or asked for a person, or why none did. Written once, at the pause:
    # a later change to the rules never changes it.
    verdict = models.JSONField(default=dict, blank=True, editable=False)
    # Its expiry policy, chosen at the pause like the verdict (from the rule that sent it to a
    # person, else the tool's author's `review`), so a later change to either never changes
    # it; `expiry_note` says why, when it is not what was asked for (an approval the tool
    # does not allow falls back to reject).
    on_expiry = models.CharField(
        max_length=20, choices=ExpiryAction.choices, default=ExpiryAction.REJECT, editable=False
    )
    escalate_to = models.CharField(
        max_length=150, blank=True, editable=False, help_text="The group told when it escalates."
    )
    expiry_note = models.CharField(max_length=300, blank=True, editable=False)
    # Set by the conditional UPDATE that escalates it (once: its deadline was extended) and by
    # the one that sends its reminder (once).
    escalated_at = models.DateTimeField(null=True, blank=True, editable=False)
    reminded_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(fields=["run", "call_id"], name="one_request_per_call")
        ]
        indexes = [
            models.Index(fields=["status", "-created"], name="request_status_created"),
            # The history's agent, tool, kind and server choices (the distinct values of
            # decided requests), read from this index alone instead of from every row.
            models.Index(
                fields=["agent_name", "tool_name", "kind", "server", "status"],
                name="request_agent_tool",
            ),
        ]
        permissions = [("decide_approvalrequest", "Can approve or reject tool calls")]

    def __str__(self) -> str:
        return f"{self.tool_name} for run {self.run_id} ({self.status})"

    @property
    def is_pending(self) -> bool:
        return self.status == ApprovalStatus.PENDING

    @property
    def is_decided(self) -> bool:
        return self.status in DECIDED_STATUSES

    def is_overdue(self, now: datetime | None = None) -> bool:
        """Pending and past its expiry: what `overdue()` selects, for this request."""
        return self.is_pending and self.expires_at <= (now or timezone.now())

    @property
    def arguments_intact(self) -> bool:
        """The stored arguments are the ones the hash covers: the ones that will execute (the
        saved state is checked against the same hash). Edited outside agentsite, they are
        neither shown nor approvable."""
        return hmac.compare_digest(arguments_hash(self.arguments), self.arguments_hash)

    @property
    def decided_by_policy(self) -> str:
        """The name of the policy that decided this request at its pause; "" when a person,
        the expiry or nobody did."""
        if self.decided_by_id is not None or self.verdict.get("action") not in POLICY_DECIDES:
            return ""
        return str(self.verdict.get("policy_name") or "")

    @property
    def is_escalated(self) -> bool:
        return self.escalated_at is not None

    @property
    def approved_on_expiry(self) -> bool:
        """Nobody decided in time and its expiry policy approved it."""
        return (
            self.status == ApprovalStatus.APPROVED
            and self.decided_by_id is None
            and self.on_expiry == ExpiryAction.APPROVE
            and not self.decided_by_policy
        )

    def decider_display(self) -> str:
        """Who decided, for people: a reviewer's name, "policy <name>", "the expiry policy",
        or ""."""
        if self.decided_by is not None:
            return self.decided_by.get_username()
        policy = self.decided_by_policy
        if policy:
            return f"policy {policy}"
        return "the expiry policy" if self.approved_on_expiry else ""

    def arguments_display(self) -> str:
        if not self.arguments_intact:
            return ARGUMENTS_TAMPERED
        # In the order stored (the model's; PostgreSQL's jsonb keeps its own), not sorted.
        return json.dumps(self.arguments, indent=2, ensure_ascii=False)

    @property
    def is_mcp(self) -> bool:
        """A tool of an MCP server: a local one's, or a hosted one's the model asked about."""
        return self.kind in MCP_KINDS

    @property
    def can_be_edited(self) -> bool:
        """Whether its kind takes edited arguments: only a function tool's or a local MCP
        server tool's call, whose JSON schema they are checked against, and only when the
        stored arguments are intact. The tool's author may still forbid it (and a server's
        tool needs declaring: `registry.review`, `engine.runs.edits.edit_refusal`)."""
        return (
            self.kind in (ToolKind.FUNCTION, ToolKind.MCP)
            and isinstance(self.arguments, dict)
            and self.arguments_intact
        )

    @property
    def can_be_answered(self) -> bool:
        """Whether a reviewer may answer it as the tool: not a hosted MCP server's call, which
        that server runs itself (the engine refuses it, `runs.InvalidDecision`)."""
        return self.kind != ToolKind.HOSTED_MCP

    def server_display(self) -> str:
        """ "MCP server warehouse", "hosted MCP server deepwiki"; "" for other tools."""
        if not self.is_mcp:
            return ""
        hosted = "hosted MCP server" if self.kind == ToolKind.HOSTED_MCP else "MCP server"
        return f"{hosted} {self.server}" if self.server else hosted

    def tool_display(self) -> str:
        """The tool with its server: "restock · MCP server warehouse"; else its name."""
        server = self.server_display()
        return f"{self.tool_name} · {server}" if server else self.tool_name

    def call_display(self) -> str:
        """How a person reads the call, on one line: `cancel_order(order_id=42)`, with its
        server for an MCP tool's (`restock(sku="mug") · MCP server warehouse`), `shell: ls
        -la; rm -rf build` for a shell call's commands, `apply_patch: update src/app.py` for
        a patch."""
        call = self.call_summary()
        server = self.server_display()
        return f"{call} · {server}" if server else call

    def call_summary(self) -> str:
        """`call_display` without the server: what a page cuts to fit, with the server shown
        beside it in full (`approvals/_kind.html`)."""
        if not self.arguments_intact:
            return f"{self.tool_name}({ARGUMENTS_TAMPERED})"
        if self.kind == ToolKind.SHELL and (
            shown := items.shell_call(self.tool_name, self.arguments)
        ):
            return shown
        if self.kind == ToolKind.APPLY_PATCH and (
            shown := items.patch_call(self.tool_name, self.arguments)
        ):
            return shown
        return items.format_call(self.tool_name, self.arguments)


class ApprovalDecision(models.Model):
    """The audit: one row per decision, never changed or deleted by the site."""

    request = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="decisions")
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="approval_decisions",
        help_text="Empty when the site decided itself (expiry); the person who asked, when "
        "they withdrew the request.",
        db_index=False,  # `decision_reviewer_created` starts with it
    )
    approved = models.BooleanField(help_text="The call was allowed to run.")
    kind = models.CharField(
        max_length=20,
        choices=DecisionKind.choices,
        blank=True,
        help_text="What the decision did: approved, rejected, answered as the tool (the tool "
        "never ran; the model read the message as its output), withdrawn, expired.",
    )
    message = models.TextField(
        "message to the agent",
        blank=True,
        help_text="For the agent: what the model reads when the call is rejected, or, answered "
        "as the tool, exactly what it reads as the tool's output; so it may reach the customer.",
    )
    note = models.TextField(
        "internal note",
        blank=True,
        help_text="Internal note, for reviewers only: kept in the audit and the history, never "
        "sent to the agent, the conversation or the trace.",
    )
    always = models.BooleanField(
        default=False, help_text="For the rest of this run, decide this tool the same way."
    )
    arguments_hash = models.CharField(
        max_length=64, help_text="The hash of the arguments the reviewer saw."
    )
    withdrawn = models.BooleanField(
        default=False,
        help_text="The person who asked withdrew the request (`reviewer` is that person); "
        "the call is rejected.",
    )
    # Edit, then approve: the arguments the tool ran with instead of the model's (which stay
    # on the request, their hash in `arguments_hash`), their hash, and the site's signature
    # over both hashes, the request and the reviewer: an edit changed outside the form path
    # (here, or a forged hash) no longer matches, and the resume refuses it.
    edited_arguments = FaithfulJSONField(
        null=True,
        blank=True,
        help_text="The arguments the reviewer changed the call to (it ran with these); empty "
        "when she did not edit them.",
    )
    edited_arguments_hash = models.CharField(
        max_length=64, blank=True, help_text="The hash of the edited arguments."
    )
    edit_signature = models.CharField(max_length=64, blank=True, editable=False)
    # Decided by an approval policy, not a person (`reviewer` is empty): the rule, and its
    # name and what it matched as they were then (`note` holds why), so that renaming,
    # changing or deleting the rule later changes nothing here.
    policy = models.ForeignKey(
        "ApprovalPolicy",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="decisions",
        help_text="The approval policy that decided, when no person did.",
    )
    policy_name = models.CharField(
        max_length=100, blank=True, help_text="The policy's name when it decided."
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]
        # The history tab pages through every decision newest first, or through one
        # reviewer's (`reviewer IS NULL`: the expired ones) without sorting them.
        indexes = [
            models.Index(fields=["-created", "-id"], name="decision_created"),
            models.Index(fields=["reviewer", "-created", "-id"], name="decision_reviewer_created"),
        ]

    def __str__(self) -> str:
        verb = (
            "withdrew"
            if self.withdrawn
            else "answered as the tool"
            if self.is_response
            else "approved"
            if self.approved
            else "rejected"
        )
        who = (
            self.reviewer
            if self.reviewer
            else f"policy {self.policy_name}"
            if self.policy_name
            else "the site"
        )
        return f"{who} {verb} {self.request}"

    @property
    def by_policy(self) -> bool:
        """An approval policy decided, when the run paused; no person did."""
        return bool(self.policy_name) and self.reviewer_id is None

    @property
    def is_edit(self) -> bool:
        """The reviewer changed the arguments and approved: the tool ran with hers."""
        return self.kind == DecisionKind.EDITED

    def edited_display(self) -> str:
        """`cancel_order(order_id=43)`: the call as it ran, for people."""
        return items.format_call(self.request.tool_name, self.edited_arguments)

    @property
    def is_response(self) -> bool:
        """The reviewer wrote the call's result (`message`); the tool never ran."""
        return self.kind == DecisionKind.RESPONDED


# --- approval policies ------------------------------------------------------------------------


class PolicyAction(models.TextChoices):
    APPROVE = "approve", "Approve automatically"
    REJECT = "reject", "Reject automatically"
    # A person decides, whatever the rules after it say.
    ASK = "ask", "Always ask a reviewer"


class ApprovalPolicy(models.Model):
    """A rule that outlasts a run: calls of `tool_name` (any tool when empty) by `agent_name`
    (any agent when empty) whose arguments meet every condition are approved, rejected or
    sent to a person, without asking anyone. The first enabled rule that matches, in order of
    `priority` (then age), decides; `engine.policies` evaluates them when a run pauses."""

    name = models.CharField(max_length=100, unique=True)
    enabled = models.BooleanField(default=True, help_text="Off: the rule is never evaluated.")
    priority = models.PositiveIntegerField(
        default=100,
        help_text="Lower goes first: the first enabled rule that matches a call decides it.",
    )
    agent_name = models.CharField(
        "agent",
        max_length=100,
        blank=True,
        help_text="The agent whose calls it matches; empty: any.",
    )
    tool_name = models.CharField(
        "tool", max_length=200, blank=True, help_text="The tool whose calls it matches; empty: any."
    )
    action = models.CharField(max_length=20, choices=PolicyAction.choices)
    message = models.TextField(
        "message to the agent",
        blank=True,
        max_length=2000,
        help_text="For a rejecting rule: what the model reads as the call's output (it may reach "
        "the customer). Empty: a standard sentence naming the policy.",
    )
    description = models.TextField(
        blank=True, max_length=2000, help_text="Why the rule exists, for reviewers."
    )
    # Read only for an approving rule. Rules written before it existed keep False (approvals
    # 0020): they approved whatever the facts said, and still do until someone ticks it.
    requires_no_warnings = models.BooleanField(
        "approve only when the facts show no warnings",
        default=True,
        help_text="For an approving rule. The facts are what reviewers read of what a call "
        "would touch (an order already cancelled, more than is left to refund): a call they "
        "warn about, or whose facts cannot be read, goes to a person instead.",
    )
    # For the calls it sends to a person (an "ask" rule, or an approve the tool's author
    # refuses): what happens when nobody decides in time. Empty: the tool's own (`review`).
    on_expiry = models.CharField(
        "on expiry",
        max_length=20,
        choices=ExpiryAction.choices,
        blank=True,
        help_text="When nobody decides in time: reject, escalate to a group (extend the "
        "deadline once, then reject), or approve (only tools whose author allows it). "
        "Empty: the tool's default.",
    )
    escalate_to = models.CharField(
        "escalate to",
        max_length=150,
        blank=True,
        help_text="The group (by name) told when a call escalates.",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )

    class Meta:
        ordering = ["priority", "id"]
        verbose_name = "approval policy"
        verbose_name_plural = "approval policies"
        permissions = [("manage_approvalpolicy", "Can manage approval policies")]

    def __str__(self) -> str:
        return self.name


class ConditionOperator(models.TextChoices):
    EQUALS = "==", "equals"
    NOT_EQUALS = "!=", "does not equal"
    LESS = "<", "is less than"
    AT_MOST = "<=", "is at most"
    MORE = ">", "is more than"
    AT_LEAST = ">=", "is at least"
    ONE_OF = "in", "is one of (comma-separated)"
    NOT_ONE_OF = "not in", "is none of (comma-separated)"
    CONTAINS = "contains", "contains"
    STARTS_WITH = "starts with", "starts with"
    ENDS_WITH = "ends with", "ends with"


class ConditionSource(models.TextChoices):
    VALUE = "value", "the value"
    USER_EMAIL = "user.email", "the user's email address"
    USER_NAME = "user.username", "the user's username"


class PolicyCondition(models.Model):
    """One condition of a rule on one argument of the call: `amount <= 20`, `to != the
    user's email address`. A rule matches when all of its conditions hold."""

    policy = models.ForeignKey(ApprovalPolicy, on_delete=models.CASCADE, related_name="conditions")
    argument = models.CharField(
        max_length=200,
        help_text="The argument's name as the tool's JSON schema has it; a.b for a field of an "
        "object argument.",
    )
    operator = models.CharField(max_length=20, choices=ConditionOperator.choices)
    compare_to = models.CharField(
        max_length=20, choices=ConditionSource.choices, default=ConditionSource.VALUE
    )
    value = models.CharField(
        max_length=500,
        blank=True,
        help_text="A number, text, true/false, or a comma-separated list for one of / none of. "
        "Ignored when comparing with the user's email address or username.",
    )

    class Meta:
        ordering = ["policy", "id"]

    def __str__(self) -> str:
        compared = (
            self.value
            if self.compare_to == ConditionSource.VALUE
            else self.get_compare_to_display()
        )
        return f"{self.argument} {self.operator} {compared}"
