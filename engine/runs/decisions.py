"""Deciding a paused call: a reviewer's decision, a withdrawal by the person who asked, an expiry
or a policy's; exactly one decision per request wins, and the last one of a pause claims the
run for resume."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

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
from tracing import recording

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from engine.permissions import User

from engine.runs import edits, errors, rows

logger = logging.getLogger(__name__)


def decide_by_policy(
    request: ApprovalRequest, verdict: policies.Verdict, now: Any
) -> tuple[ApprovalRequest, ApprovalDecision]:
    """Record the decision of the policy whose `verdict` decides `request` (just created, in
    the pause's transaction): the request decided by nobody in person, the audit's row
    naming the policy as it was (a later change to it changes neither)."""
    approve = verdict.action == policies.PolicyAction.APPROVE
    request.status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
    request.decided_at = now
    request.save(update_fields=["status", "decided_at"])
    decision = ApprovalDecision.objects.create(
        request=request,
        reviewer=None,
        approved=approve,
        kind=DecisionKind.APPROVED if approve else DecisionKind.REJECTED,
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


def decide(
    request: ApprovalRequest | int,
    reviewer: User | AnonymousUser | None,
    approve: bool,
    *,
    message: str | None = None,
    always: bool = False,
    seen_hash: str | None = None,
    note: str | None = None,
    response: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> ApprovalDecision:
    """Record a reviewer's decision; resume the run when its pause is fully decided.

    Exactly one decision per request wins, whoever clicks how often. `message` is for the
    agent (read as the tool's output when rejected, so it may reach the customer); `note` is
    for reviewers only: kept in the audit, never given to the model, the session, the trace
    or the chat.

    With `response` (and `approve` False), the reviewer answers as the tool: the tool never
    runs, and the model reads exactly `response` as the call's output (kept as the
    decision's message, its kind "responded"). Like an approval, nobody answers for a call
    in her own conversation: what the tool "said" steers the agent.

    With `arguments` (and `approve`), the reviewer edits, then approves: the tool runs once
    with these instead of the model's, if its author allows edits (`registry.review`) and
    they fit its JSON schema. The decision keeps both hashes, the new arguments and the
    site's signature over the edit (kind "edited"); arguments equal to the model's are a
    plain approval.

    Raises:
        AlreadyDecided / RequestExpired / RequestClosed: with a message for the reviewer.
        NeedsAnotherReviewer: an approval (or an answer) in the reviewer's own conversation.
        DecisionRefused: the reviewer may not decide, the arguments changed since they
            were shown (`seen_hash`), `response` is empty or too long, or the edited
            `arguments` are not allowed or do not fit the tool.
    """
    if not permissions.is_reviewer(reviewer):
        raise errors.NotAllowed("You are not allowed to approve or reject tool calls.")
    kind = DecisionKind.APPROVED if approve else DecisionKind.REJECTED
    if response is not None:
        if approve:
            raise ValueError("A call answered as the tool is not approved: it never runs.")
        response = response.strip()
        if not response:
            raise errors.InvalidDecision(
                "Write the result the agent should read as the tool's output; it is empty."
            )
        if len(response) > errors.MAX_RESPONSE_CHARS:
            raise errors.InvalidDecision(
                f"The tool's output is too long ({len(response)} characters; at most "
                f"{errors.MAX_RESPONSE_CHARS})."
            )
        kind, message = DecisionKind.RESPONDED, response
    if arguments is not None and (not approve or always or response is not None):
        raise ValueError("Edited arguments go with a plain approval.")
    return record_decision(
        request,
        reviewer,
        approve,
        message=message,
        always=always,
        seen_hash=seen_hash,
        note=note,
        kind=kind,
        edited=arguments,
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
        False,
        message=WITHDRAWN_MESSAGE,
        always=False,
        seen_hash=None,
        withdrawn=True,
    )


awithdraw = sync_to_async(withdraw)


def record_decision(
    request: ApprovalRequest | int,
    reviewer: User | None,
    approve: bool,
    *,
    message: str | None,
    always: bool,
    seen_hash: str | None,
    expired: bool = False,
    withdrawn: bool = False,
    note: str | None = None,
    kind: DecisionKind | None = None,
    edited: dict[str, Any] | None = None,
) -> ApprovalDecision:
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    responded = kind == DecisionKind.RESPONDED
    # An answer as the tool is read whole (`decide` bounds it); a message is cut to size.
    message = (message or "").strip()[
        : errors.MAX_RESPONSE_CHARS if responded else errors.MAX_MESSAGE_CHARS
    ]
    note = (note or "").strip()[: errors.MAX_MESSAGE_CHARS]
    with transaction.atomic():
        current = ApprovalRequest.objects.select_related("run").get(pk=request_id)
        # Deciders of one run queue here, so the last decision of a pause always sees the
        # others and exactly one of them claims the run. FOR NO KEY UPDATE, as strong as the
        # decision's own UPDATE of the run: FOR UPDATE would also hold off every check of a
        # foreign key to the run (the exporter's write of the run's trace checks one at its
        # commit, holding the trace's row this transaction writes next: a deadlock on
        # PostgreSQL, a 500 for a loser or a trace write lost).
        run = (
            AgentRun.objects.select_for_update(of=("self",), no_key=True)
            .select_related("conversation")
            .get(pk=current.run_id)
        )
        current.run = run
        if responded and current.kind == ToolKind.HOSTED_MCP:
            raise errors.InvalidDecision(
                "A hosted MCP server runs its tools itself: its call cannot be answered as the "
                "tool. Approve or reject it."
            )
        if (approve or responded) and needs_another_reviewer(current, reviewer):
            raise errors.NeedsAnotherReviewer(
                SELF_RESPONSE_REFUSED if responded else SELF_APPROVAL_REFUSED
            )
        if seen_hash is not None and seen_hash != current.arguments_hash:
            raise errors.StaleArguments(
                "The arguments changed since this request was shown to you; reload it."
            )
        if approve and not current.arguments_intact:
            raise errors.DecisionRefused(
                "The arguments of this request were changed outside agentsite, so what you "
                "would approve is not what would run; it cannot be approved. Reject it."
            )
        edit = edits.edit_fields(current, run, reviewer, edited) if edited is not None else {}
        if edit:
            kind = DecisionKind.EDITED
        now = timezone.now()
        status = (
            (ApprovalStatus.APPROVED if approve else ApprovalStatus.EXPIRED)
            if expired
            else ApprovalStatus.WITHDRAWN
            if withdrawn
            else ApprovalStatus.RESPONDED
            if responded
            else ApprovalStatus.APPROVED
            if approve
            else ApprovalStatus.REJECTED
        )
        # The sweep expires a request once it is overdue; a reviewer decides it while open;
        # the person who asked may withdraw it while it waits.
        requests = ApprovalRequest.objects.filter(pk=request_id)
        decidable = requests.pending() if expired or withdrawn else requests.open(now)
        if decidable.update(status=status, decided_at=now, decided_by=reviewer) != 1:
            _refuse(request_id, now)
        decision = ApprovalDecision.objects.create(
            request_id=request_id,
            reviewer=reviewer,
            approved=approve,
            message=message,
            always=always,
            arguments_hash=seen_hash or current.arguments_hash,
            withdrawn=withdrawn,
            note=note,
            kind=kind or _kind(status),
            **edit,
        )
        claimed = _claim_for_resume(run, current.pause)
        # In this transaction: the trace shows the decision exactly when the audit does.
        recording.record_decision(current, decision, status, run)
        recording.follow_run(run, RunStatus.RESUMING if claimed else run.status)
        signals.approval_decided.send(sender=ApprovalRequest, request=current, decision=decision)
        decided_event = events.ApprovalWithdrawn if withdrawn else events.ApprovalDecided
        decided = decided_event(
            request_id=request_id,
            run_id=run.pk,
            conversation_id=run.conversation_id,
            status=status,
            decided_by=reviewer.get_username() if reviewer is not None else None,
            decided_at=now,
            message=message,
        )
        published: list[events.Event] = [decided]
        if claimed:
            published.append(rows.run_updated(run.pk, run.conversation_id, RunStatus.RESUMING))
        transaction.on_commit(lambda: events.publish_threadsafe(published))
        if claimed:
            run_id = run.pk
            transaction.on_commit(lambda: executor.submit("resume", run_id))
    return decision


def _kind(status: str) -> DecisionKind:
    """The audit's kind of a decision that set a request to `status`."""
    return DecisionKind(status)


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
    if ApprovalRequest.objects.of_pause(run, pause).pending().exists():
        return False
    claimed = AgentRun.objects.filter(
        pk=run.pk, status=RunStatus.WAITING, pause_count=pause
    ).update(status=RunStatus.RESUMING, updated=timezone.now())
    return claimed == 1
