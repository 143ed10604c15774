"""Deciding a paused call: a reviewer's decision, a withdrawal by the person who asked, an expiry
or a policy's; exactly one decision per request wins, and the last one of a pause claims the
run for resume."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentsite.db.sql import columns
from approvals.models import (
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    ExpiryAction,
    ToolKind,
)
from engine import events, executor, permissions, policies, signals
from engine.models import AgentRun, RunStatus
from engine.runs import edits, errors, rows
from tracing import recording

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from engine.permissions import User


def decide_by_policy(
    request: ApprovalRequest, verdict: policies.Verdict, now: Any
) -> tuple[ApprovalRequest, ApprovalDecision]:
    """Record the decision of the policy whose `verdict` decides `request` (just created, in
    the pause's transaction): the request decided by nobody in person, the audit's row
    naming the policy as it was (a later change to it changes neither)."""
    approve = verdict.action == policies.PolicyAction.APPROVE
    kind = DecisionKind.APPROVED if approve else DecisionKind.REJECTED
    request.status = kind.status
    request.decided_at = now
    request.save(update_fields=["status", "decided_at"])
    decision = ApprovalDecision.objects.create(
        request=request,
        reviewer=None,
        approved=kind.approves,
        kind=kind,
        message="" if approve else verdict.message.strip()[: errors.MAX_MESSAGE_CHARS],
        note=verdict.sentence()[: errors.MAX_MESSAGE_CHARS],
        arguments_hash=request.arguments_hash,
        # The rule as it was read; deleted since, the name alone stays (its row is locked
        # until this commits, so it cannot go in between).
        policy_id=ApprovalPolicy.objects.select_for_update(no_key=True)
        .filter(pk=verdict.policy_id or 0)
        .values_list("pk", flat=True)
        .first(),
        policy_name=verdict.policy_name,
    )
    return request, decision


class Action(StrEnum):
    """What a reviewer chose, as every face names it: the inbox's buttons, the API's
    `action`, the bulk actions of the inbox and the admin."""

    APPROVE = "approve"
    # Approve, and every later call of the tool in this run.
    APPROVE_ALWAYS = "approve_always"
    # Approve with the reviewer's arguments instead of the model's.
    APPROVE_EDITED = "approve_edited"
    REJECT = "reject"
    # The tool does not run: the model reads the reviewer's text as its output.
    RESPOND = "respond"


# Which texts go with which action: the note (for reviewers only) with every one; the
# message (read by the agent) with a rejection, the one decision the agent reads; the tool's
# output with an answer as the tool; the edited arguments with an edited approval.
FIELDS: dict[Action, frozenset[str]] = {
    Action.APPROVE: frozenset({"note"}),
    Action.APPROVE_ALWAYS: frozenset({"note"}),
    Action.APPROVE_EDITED: frozenset({"arguments", "note"}),
    Action.REJECT: frozenset({"message", "note"}),
    Action.RESPOND: frozenset({"response", "note"}),
}
# The text an action cannot go without, and what is said when it is missing.
REQUIRED: dict[Action, tuple[str, str]] = {
    Action.APPROVE_EDITED: ("arguments", "approve_edited needs the edited `arguments`."),
    Action.RESPOND: ("response", "respond needs the `response` the agent reads."),
}
EMPTY_RESPONSE = "Write the result the agent should read as the tool's output; it is empty."


def unfit_field(name: str) -> str:
    """What is said of a text `name` given with an action it does not go with (`FIELDS`)."""
    actions = " or ".join(a for a in Action if name in FIELDS[a])
    return f"`{name}` goes with {actions} only." if actions else f"`{name}` is no decision's."


class UnfitDecision(errors.InvalidDecision):
    """A decision whose texts do not go with its action, or that lacks the one it needs."""


@dataclass(frozen=True)
class Decision:
    """A reviewer's decision on one paused call, validated once (`Decision.of`), from the
    inbox's form, the API and the bulk actions down to the audit's row."""

    action: Action
    # For the agent: it reads it as the rejected call's output, so it may reach the customer.
    message: str = ""
    # For reviewers only: kept in the audit, never given to the model, the session, the trace
    # or the chat.
    note: str = ""
    # What the model reads as the call's output when the reviewer answers as the tool.
    response: str = ""
    # The arguments the tool runs with instead of the model's.
    arguments: dict[str, Any] | None = None

    @classmethod
    def of(cls, action: str, *, strict: bool = True, **given: Any) -> Decision:
        """The decision `action` with the texts `given` (message, note, response,
        arguments; None or "" is not given).

        A text that does not go with the action (`FIELDS`) is refused when `strict` (the
        API); else it is left out (the inbox's one form posts every box; the button pressed
        says which of them are meant).

        Raises:
            UnfitDecision: an unknown action, a text that does not go with it (strict), or
                the one it needs missing.
            InvalidDecision: an empty or too long answer as the tool.
        """
        try:
            chosen = Action(action)
        except ValueError:
            known = ", ".join(Action)
            raise UnfitDecision(f"{action!r} is not a decision ({known}).") from None
        required, missing = REQUIRED.get(chosen, ("", ""))
        texts = {
            name: value
            for name, value in given.items()
            if value is not None and (value != "" or name == required)
        }
        unknown = set(texts) - FIELDS[chosen]
        if unknown and strict:
            raise UnfitDecision(unfit_field(sorted(unknown)[0]))
        texts = {name: value for name, value in texts.items() if name in FIELDS[chosen]}
        if required and required not in texts:
            raise UnfitDecision(missing)
        response = str(texts.get("response", "")).strip()
        if chosen == Action.RESPOND and not response:
            raise errors.InvalidDecision(EMPTY_RESPONSE)
        if len(response) > errors.MAX_RESPONSE_CHARS:
            raise errors.InvalidDecision(
                f"The tool's output is too long ({len(response)} characters; at most "
                f"{errors.MAX_RESPONSE_CHARS})."
            )
        arguments = texts.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            raise UnfitDecision("The edited `arguments` are an object of the tool's arguments.")
        return cls(
            chosen,
            message=_bounded(texts.get("message")),
            note=_bounded(texts.get("note")),
            response=response,
            arguments=arguments,
        )

    @classmethod
    def approve(cls, *, note: str = "", always: bool = False) -> Decision:
        return cls.of(Action.APPROVE_ALWAYS if always else Action.APPROVE, note=note)

    @classmethod
    def reject(cls, message: str = "", *, note: str = "") -> Decision:
        return cls.of(Action.REJECT, message=message, note=note)

    @classmethod
    def respond(cls, response: str, *, note: str = "") -> Decision:
        return cls.of(Action.RESPOND, response=response, note=note)

    @classmethod
    def edit(cls, arguments: dict[str, Any], *, note: str = "") -> Decision:
        return cls.of(Action.APPROVE_EDITED, arguments=arguments, note=note)

    @property
    def approves(self) -> bool:
        return self.action in (Action.APPROVE, Action.APPROVE_ALWAYS, Action.APPROVE_EDITED)

    @property
    def always(self) -> bool:
        return self.action == Action.APPROVE_ALWAYS

    @property
    def kind(self) -> DecisionKind:
        """The audit's word for it (an edit whose arguments are the model's is a plain
        approval: `record_decision` tells)."""
        if self.action == Action.RESPOND:
            return DecisionKind.RESPONDED
        return DecisionKind.APPROVED if self.approves else DecisionKind.REJECTED


def _bounded(text: Any) -> str:
    return str(text or "").strip()[: errors.MAX_MESSAGE_CHARS]


def decide(
    request: ApprovalRequest | int,
    reviewer: User | AnonymousUser | None,
    decision: Decision,
    *,
    seen_hash: str | None = None,
) -> ApprovalDecision:
    """Record a reviewer's decision; resume the run when its pause is fully decided.

    Exactly one decision per request wins, whoever clicks how often. `seen_hash`: the
    arguments' hash the reviewer was shown (a decision is about what was seen).

    An answer as the tool: the tool never runs, and the model reads exactly the reviewer's
    text as the call's output (kept as the decision's message, its kind "responded"). Like
    an approval, nobody answers for a call in her own conversation: what the tool "said"
    steers the agent.

    An edit, then approval: the tool runs once with the reviewer's arguments instead of the
    model's, if its author allows edits (`registry.review`) and they fit its JSON schema.
    The decision keeps both hashes, the new arguments and the site's signature over the edit
    (kind "edited"); arguments equal to the model's are a plain approval.

    Raises:
        AlreadyDecided / RequestExpired / RequestClosed: with a message for the reviewer.
        NeedsAnotherReviewer: an approval (or an answer) in the reviewer's own conversation.
        DecisionRefused: the reviewer may not decide, the arguments changed since they
            were shown (`seen_hash`), or the edited arguments are not allowed or do not fit
            the tool.
    """
    if not permissions.is_reviewer(reviewer):
        raise errors.NotAllowed("You are not allowed to approve or reject tool calls.")
    return record_decision(
        request,
        cast("User", reviewer),  # a reviewer is a signed-in user
        decision.kind,
        message=decision.response if decision.action == Action.RESPOND else decision.message,
        note=decision.note,
        always=decision.always,
        seen_hash=seen_hash,
        edited=decision.arguments,
    )


SELF_APPROVAL_REFUSED = (
    "You started this conversation, so another reviewer must approve this call "
    "(separation of duties). You may still reject it."
)
SELF_RESPONSE_REFUSED = (
    "You started this conversation, so another reviewer must answer as the tool for this "
    "call (separation of duties). You may still reject it."
)


def needs_another_reviewer(request: ApprovalRequest, reviewer: Any) -> bool:
    """Whether `reviewer` may not approve `request` herself: it is a call in a conversation
    she started (or of a run she asked for) and `AGENTSITE_SELF_APPROVAL` is off."""
    if settings.AGENTSITE_SELF_APPROVAL or reviewer is None or reviewer.pk is None:
        return False
    run = request.run
    return reviewer.pk in (run.conversation.owner_id, run.requested_by_id)


adecide = sync_to_async(decide)

# What the model reads when the person who asked withdrew the call ("not approved" too, the
# words the demo model and most models take for a refusal).
WITHDRAWN_MESSAGE = "The user withdrew this request: it was not approved and did not run."


def withdraw(request: ApprovalRequest | int, user: User | AnonymousUser | None) -> ApprovalDecision:
    """The person who asked takes back a request that waits for a reviewer: it is closed as
    withdrawn (audited as a decision by that person), it leaves every open inbox, and the
    run resumes with the call rejected, so the agent answers and the conversation is free.

    The same conditional UPDATE as `decide`: a withdraw and a reviewer's click race for the
    request, and exactly one of them wins.

    Raises:
        AlreadyDecided / RequestClosed: with a message for the user ("Already approved by
            rita at ...").
        DecisionRefused: the user is not the one the conversation belongs to.
    """
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    owner = (
        ApprovalRequest.objects.filter(pk=request_id)
        .values_list("run__conversation__owner_id", flat=True)
        .first()
    )
    if user is None or not user.is_authenticated or owner is None or owner != user.pk:
        raise errors.DecisionRefused("Only the person who asked can withdraw this request.")
    return record_decision(
        request_id,
        cast("User", user),  # authenticated
        DecisionKind.WITHDRAWN,
        message=WITHDRAWN_MESSAGE,
    )


awithdraw = sync_to_async(withdraw)

# Kinds taken while the request is pending, overdue or not: the sweep's and the asker's. A
# reviewer decides a request only while it is open (pending, not overdue).
TAKEN_WHILE_PENDING = (DecisionKind.EXPIRED, DecisionKind.EXPIRY_APPROVED, DecisionKind.WITHDRAWN)


def record_decision(
    request: ApprovalRequest | int,
    reviewer: User | None,
    kind: DecisionKind,
    *,
    message: str = "",
    note: str = "",
    always: bool = False,
    seen_hash: str | None = None,
    edited: dict[str, Any] | None = None,
) -> ApprovalDecision:
    """Record a decision of `kind` on the request (a reviewer's, the asker's withdrawal, the
    sweep's): one conditional UPDATE lets exactly one decision win; the audit's row, the
    decision's span and the signals in the same transaction; the last decision of a pause
    claims the run for resume, after commit."""
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    # An answer as the tool is read whole (`Decision.of` bounds it); a message is cut to size.
    limit = (
        errors.MAX_RESPONSE_CHARS if kind == DecisionKind.RESPONDED else errors.MAX_MESSAGE_CHARS
    )
    message, note = message.strip()[:limit], note.strip()[: errors.MAX_MESSAGE_CHARS]
    with transaction.atomic():
        current, run = _locked(request_id)
        edit = _checked(current, run, reviewer, kind, seen_hash, edited)
        if edit:
            kind = DecisionKind.EDITED
        now = timezone.now()
        status = kind.status
        # Pending; and open (not past its expiry) unless the sweep or the asker takes it.
        decidable: dict[str, Any] = {"status": ApprovalStatus.PENDING}
        if kind not in TAKEN_WHILE_PENDING:
            decidable["expires_at__gt"] = now
        changes = {"status": status, "decided_at": now, "decided_by": reviewer}
        if columns(ApprovalRequest).update(request_id, changes, where=decidable) != 1:
            _refuse(request_id, now)
        decision = ApprovalDecision(
            request_id=request_id,
            reviewer=reviewer,
            approved=kind.approves,
            message=message,
            always=always,
            arguments_hash=seen_hash or current.arguments_hash,
            withdrawn=kind == DecisionKind.WITHDRAWN,
            note=note,
            kind=kind,
            **edit,
        )
        columns(ApprovalDecision).insert(decision)
        _announce(current, run, decision, reviewer, now)
    return decision


def _locked(request_id: int) -> tuple[ApprovalRequest, AgentRun]:
    """The request, and its run locked: deciders of one run queue here, so the last decision
    of a pause always sees the others and exactly one of them claims the run."""
    current = columns(ApprovalRequest).get(request_id)
    # FOR NO KEY UPDATE, as strong as the decision's own UPDATE of the run: FOR UPDATE would
    # also hold off every check of a foreign key to the run (the exporter's write of the
    # run's trace checks one at its commit, holding the trace's row this transaction writes
    # next: a deadlock on PostgreSQL, a 500 for a loser or a trace write lost). In plain
    # statements (`agentsite.db.sql.Columns`): the ORM's compilation of these wide rows cost
    # more than a millisecond of every decision.
    run = rows.load_run(current.run_id, lock=True)
    current.run = run
    return current, run


def _checked(
    current: ApprovalRequest,
    run: AgentRun,
    reviewer: User | None,
    kind: DecisionKind,
    seen_hash: str | None,
    edited: dict[str, Any] | None,
) -> dict[str, Any]:
    """Refuse what may not be decided so; what an edit adds to the decision ({} for none)."""
    responded = kind == DecisionKind.RESPONDED
    if responded and current.kind == ToolKind.HOSTED_MCP:
        raise errors.InvalidDecision(
            "A hosted MCP server runs its tools itself: its call cannot be answered as the "
            "tool. Approve or reject it."
        )
    if (kind.approves or responded) and needs_another_reviewer(current, reviewer):
        raise errors.NeedsAnotherReviewer(
            SELF_RESPONSE_REFUSED if responded else SELF_APPROVAL_REFUSED
        )
    if seen_hash is not None and seen_hash != current.arguments_hash:
        raise errors.StaleArguments(
            "The arguments changed since this request was shown to you; reload it."
        )
    if kind.approves and not current.arguments_intact:
        raise errors.DecisionRefused(
            "The arguments of this request were changed outside agentsite, so what you "
            "would approve is not what would run; it cannot be approved. Reject it."
        )
    return edits.edit_fields(current, run, reviewer, edited) if edited is not None else {}


def _announce(
    current: ApprovalRequest,
    run: AgentRun,
    decision: ApprovalDecision,
    reviewer: User | None,
    now: Any,
) -> None:
    """In the decision's transaction: the trace shows it exactly when the audit does, and the
    signals' outbox writes; after commit, the pages are told and a claimed run resumes."""
    status = DecisionKind(decision.kind).status
    claimed = _claim_for_resume(run, current.pause)
    recording.record_decision(current, decision, status, run)
    recording.follow_run(run, RunStatus.RESUMING if claimed else run.status)
    signals.approval_decided.send(sender=ApprovalRequest, request=current, decision=decision)
    event = events.ApprovalWithdrawn if decision.withdrawn else events.ApprovalDecided
    published: list[events.Event] = [
        event(
            request_id=current.pk,
            run_id=run.pk,
            conversation_id=run.conversation_id,
            status=status,
            decided_by=reviewer.get_username() if reviewer is not None else None,
            decided_at=now,
            message=decision.message,
        )
    ]
    if claimed:
        published.append(rows.run_updated(run.pk, run.conversation_id, RunStatus.RESUMING))
    transaction.on_commit(lambda: events.publish_threadsafe(published))
    if claimed:
        run_id = run.pk
        transaction.on_commit(lambda: executor.submit("resume", run_id))


def closed_reason(request: ApprovalRequest, now: Any) -> errors.DecisionRefused | None:
    """Why `request` can no longer be decided, as the error `decide` raises for it (its
    message is for the reviewer); None while it waits. Needs `decided_by` loaded."""
    when = request.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if request.decided_at else ""
    who = request.decider_display() or "someone"
    if request.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        return errors.AlreadyDecided(f"Already {request.status} by {who} at {when}.")
    if request.status == ApprovalStatus.WITHDRAWN:
        return errors.RequestWithdrawn(f"Withdrawn by {who} at {when}.")
    if request.status == ApprovalStatus.RESPONDED:
        return errors.AlreadyDecided(f"Already answered as the tool by {who} at {when}.")
    if (
        request.status == ApprovalStatus.PENDING
        and request.expires_at <= now
        and request.on_expiry == ExpiryAction.ESCALATE
        and request.escalated_at is None
    ):
        return errors.RequestExpired(
            f"Nobody decided this request in time; it is being escalated to "
            f"{request.escalate_to}. Reload it in a minute."
        )
    if (
        request.status == ApprovalStatus.PENDING
        and request.escalated_at is not None
        and request.escalated_at >= now
    ):
        # The decision came while the request was overdue and lost to the sweep that
        # escalated it: it is open again, under its new deadline.
        return _escalated_meanwhile(request)
    if request.status == ApprovalStatus.EXPIRED or request.expires_at <= now:
        expired_at = request.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return errors.RequestExpired(
            f"This request expired at {expired_at}; it can no longer be decided."
        )
    if request.status != ApprovalStatus.PENDING:
        return errors.RequestClosed(
            f"This request was {request.status}; it can no longer be decided."
        )
    return None


def _escalated_meanwhile(request: ApprovalRequest) -> errors.RequestExpired:
    until = request.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return errors.RequestExpired(
        f"Nobody decided this request in time, so it was escalated to "
        f"{request.escalate_to} just now; it waits again until {until}. Reload it to decide."
    )


def _refuse(request_id: int, now: Any) -> None:
    request = ApprovalRequest.objects.select_related("decided_by").get(pk=request_id)
    reason = closed_reason(request, now)
    if reason is None and request.escalated_at is not None:
        # Open now, yet the decision's update found it overdue: the sweep escalated it
        # meanwhile. Its `escalated_at` may come before `now` (the sweep read the clock
        # first and committed after the update had read the row).
        reason = _escalated_meanwhile(request)
    raise reason or errors.RequestClosed(
        f"This request was {request.status}; it can no longer be decided."
    )


def _claim_for_resume(run: AgentRun, pause: int) -> bool:
    if columns(ApprovalRequest).exists(
        {"run": run.pk, "pause": pause, "status": ApprovalStatus.PENDING}
    ):
        return False
    claimed = columns(AgentRun).update(
        run.pk,
        {"status": RunStatus.RESUMING, "updated": timezone.now()},
        where={"status": RunStatus.WAITING, "pause_count": pause},
    )
    return claimed == 1
