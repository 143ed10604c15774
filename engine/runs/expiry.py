"""When nobody decides in time: the expiry policy chosen at the pause (`expiry_policy`), the
reminders, and the sweep that rejects, escalates or approves each overdue request."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentsite.db.hops import db_hop
from approvals.models import ApprovalRequest, DecisionKind, ExpiryAction
from common import formatting
from engine import events, policies, registry, signals
from engine.runs import decisions, errors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expiry:
    """A request's expiry policy: what happens when nobody decides it in time."""

    action: str = ExpiryAction.REJECT
    group: str = ""
    # Why it is not what the rule or the tool asked for, for reviewers ("" when it is).
    note: str = ""


def expiry_policy(verdict: policies.Verdict, review: registry.Review) -> Expiry:
    """The expiry policy of a call that paused with `verdict`: the one of the rule that sent
    it to a person, when it names one, else its tool's (`registry.review`); approve only
    where the tool's author allows it (else reject, and the note says so)."""
    by_rule = bool(verdict.on_expiry and verdict.policy_name and not verdict.failed)
    if by_rule:
        action, group = verdict.on_expiry, verdict.escalate_to.strip()
        whose = f"The policy “{verdict.policy_name}”"
    else:
        action, group, whose = review.on_expiry, review.escalate_to.strip(), "The tool"
    if action == ExpiryAction.APPROVE and not review.expiry_approval:
        return Expiry(
            note=f"{whose} would approve it on expiry, but the tool's author does not allow "
            "that: it is rejected on expiry."
        )
    if action == ExpiryAction.ESCALATE and not group:
        return Expiry(note=f"{whose} escalates it to no group: it is rejected on expiry.")
    if action not in ExpiryAction.values:
        return Expiry(note=f"{whose} says {action!r} on expiry, which is not known: rejected.")
    return Expiry(action, group if action == ExpiryAction.ESCALATE else "")


def expire_overdue() -> int:
    """Deal with every request nobody decided in time, by its expiry policy (chosen at its
    pause): reject it (the agent is told it expired), escalate it once (its deadline is
    extended by AGENTSITE_ESCALATION_SECONDS and its group told; rejected at the new one), or
    approve it (the tool runs). A rejected or approved request's run resumes once its pause is
    decided. Reminders of requests that expire soon go out first (`send_reminders`). Each is
    one conditional UPDATE in its own transaction: however many processes sweep at once, one
    of them acts on a request, and a reviewer who decides meanwhile either wins or finds it
    closed (or, escalated, open again). Returns how many requests it expired, escalated or
    approved."""
    send_reminders()
    count = 0
    overdue = ApprovalRequest.objects.overdue().values_list(
        "pk", "created", "expires_at", "on_expiry", "escalate_to", "escalated_at", "expiry_note"
    )
    for request_id, created, expires_at, on_expiry, group, escalated_at, note in list(overdue):
        if on_expiry == ExpiryAction.ESCALATE and escalated_at is None:
            count += _escalate(request_id, group)
            continue
        waited = formatting.span_in_words(expires_at - created)
        if on_expiry == ExpiryAction.APPROVE and _approve_on_expiry(request_id, waited):
            count += 1
            continue
        if escalated_at is not None:
            note = f"Escalated to {group}; nobody decided by the extended deadline. {note}"
        try:
            decisions.record_decision(
                request_id,
                None,
                DecisionKind.EXPIRED,
                message=(
                    f"This tool call was not approved: nobody decided within {waited}, "
                    "so the request expired. Tell the user."
                ),
                note=note,
            )
        except errors.DecisionRefused:
            continue  # decided a moment ago by a reviewer
        count += 1
    if count:
        logger.info("Expired, escalated or approved %d overdue approval request(s).", count)
    return count


APPROVED_ON_EXPIRY = "Approved: nobody decided within {waited} and the tool allows it."


def _approve_on_expiry(request_id: int, waited: str) -> bool:
    """Approve an overdue request whose expiry policy approves it, audited as the expiry
    (no reviewer, kind "approved on expiry"); False when it was decided meanwhile or cannot
    be approved (its arguments changed outside agentsite: then it is rejected)."""
    try:
        decisions.record_decision(
            request_id,
            None,
            DecisionKind.EXPIRY_APPROVED,
            note=APPROVED_ON_EXPIRY.format(waited=waited),
        )
    except errors.DecisionRefused:
        return False
    return True


def _escalate(request_id: int, group: str) -> int:
    """Extend an overdue request's deadline once and tell `group`: 1 when this process did
    it, 0 when another one did or a reviewer decided it first."""
    now = timezone.now()
    until = now + timedelta(seconds=settings.AGENTSITE_ESCALATION_SECONDS)
    with transaction.atomic():
        won = (
            ApprovalRequest.objects.overdue(now)
            .filter(pk=request_id, on_expiry=ExpiryAction.ESCALATE, escalated_at__isnull=True)
            .update(escalated_at=now, expires_at=until)
        )
        if won != 1:
            return 0
        request = ApprovalRequest.objects.select_related("run").get(pk=request_id)
        signals.approval_escalated.send(sender=ApprovalRequest, request=request, group_name=group)
        # Every page that shows it re-renders it in place, with its new deadline: the inbox's
        # row and request panel, the chat's run (`approval.decided` with its status still
        # pending; "created" would add a second row, and a new type needs a handler in every
        # consumer).
        published: list[events.Event] = [
            events.ApprovalDecided(
                request_id=request.pk,
                run_id=request.run_id,
                conversation_id=request.run.conversation_id,
                status=request.status,
                decided_by=None,
                decided_at=None,
            )
        ]
        transaction.on_commit(lambda: events.publish_threadsafe(published))
    logger.info("Approval request %s escalated to %s until %s.", request_id, group, until)
    return 1


def send_reminders() -> int:
    """Send `approval_reminder` once for each open request that expires within
    AGENTSITE_APPROVAL_REMINDER_SECONDS (0: never), marked by a conditional UPDATE in the
    signal's transaction; how many were sent."""
    seconds = settings.AGENTSITE_APPROVAL_REMINDER_SECONDS
    if seconds <= 0:
        return 0
    now = timezone.now()
    due = ApprovalRequest.objects.due_for_reminder(now, timedelta(seconds=seconds))
    sent = 0
    for request_id in list(due.values_list("pk", flat=True)):
        with transaction.atomic():
            marked = (
                ApprovalRequest.objects.open(now)
                .filter(pk=request_id, reminded_at__isnull=True)
                .update(reminded_at=now)
            )
            if marked != 1:
                continue
            request = ApprovalRequest.objects.select_related("run").get(pk=request_id)
            signals.approval_reminder.send(sender=ApprovalRequest, request=request)
        sent += 1
    return sent


expire_overdue_async = db_hop(expire_overdue)
