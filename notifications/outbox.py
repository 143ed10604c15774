"""The engine's signals (`engine.signals`), received inside the engine's transactions: one
`Notification` row per person to mail, inserted in the same transaction as the request it
announces, so a crash never loses one and a rolled-back pause mails nobody. Quick: one query
for the people, one insert, no network; the sending happens elsewhere (`sending.py`), woken
once the rows are committed.

Who is told:
- a new request (`approval_created`): reviewers who opted in (immediately, or in their
  digest), for its agent and tool if they chose some; the person who asked too when she is a
  reviewer who opted in (her email says it is her own conversation);
- an escalation (`approval_escalated`): every member of the group the policy names who may
  decide and has an address, at once, whatever they chose (the operator's policy chose them);
- a reminder (`approval_reminder`): reviewers who opted in, for its agent and tool, at once
  (a digest could come after the deadline).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from approvals.models import ApprovalRequest
from common.remembered import Remembered
from engine import signals
from engine.permissions import DECIDE_PERMISSION
from notifications import sending
from notifications.models import (
    EmailMode,
    Notification,
    NotificationKind,
    NotificationPreference,
    holding,
)

logger = logging.getLogger(__name__)


def _queue(kind: str, build: Callable[[], list[Notification]]) -> list[Notification]:
    """The rows `build` makes, read and written in a savepoint of the engine's transaction:
    should that fail, they are lost (logged as an error) and the engine's write goes on; an
    email never fails a pause or a sweep."""
    try:
        with transaction.atomic():
            rows = build()
            if rows:
                Notification.objects.bulk_create(rows)
                sending.announce(min(row.due_at for row in rows))
    except Exception:
        logger.exception("[non-fatal] Notifications: could not queue the %s emails", kind)
        return []
    return rows


# Whether anybody wants email at all is read at most this often per process (a change made
# in this process is seen at once): most sites have nobody opted in, and the query of who did
# (with their permissions) cost 1.8 ms of every pause. Someone who opts in on another process
# gets the requests made from then on within this many seconds, as with webhooks.
OPTED_IN_SECONDS = 5.0


def _anyone() -> bool:
    return NotificationPreference.objects.exclude(mode=EmailMode.OFF).exists()


_opted_in = Remembered(_anyone, lambda: OPTED_IN_SECONDS)


def anyone_opted_in() -> bool:
    """Whether any preference wants email, as read at most `OPTED_IN_SECONDS` ago."""
    return _opted_in.get()


def forget_opted_in(**kwargs: Any) -> None:
    """A preference changed here: read again at the next request."""
    _opted_in.forget()


def queue_for_opted_in(request: ApprovalRequest, kind: str) -> list[Notification]:
    """A row for each reviewer who opted in and wants `request`'s agent and tool."""
    if not anyone_opted_in():
        return []

    def build() -> list[Notification]:
        now = timezone.now()
        rows = []
        for preference in NotificationPreference.objects.opted_in(DECIDE_PERMISSION):
            if not preference.wants(request.agent_name, request.tool_name):
                continue
            digest = kind == NotificationKind.CREATED and preference.mode == EmailMode.DIGEST
            rows.append(
                Notification(
                    user_id=preference.user_id,
                    request_id=request.pk,
                    kind=kind,
                    digest=digest,
                    due_at=preference.digest_due(now) if digest else now,
                )
            )
        return rows

    return _queue(kind, build)


def queue_for_group(request: ApprovalRequest, group_name: str) -> list[Notification]:
    """A row, due now, for each member of `group_name` who may decide and has an address."""

    def build() -> list[Notification]:
        members = (
            get_user_model()
            .objects.filter(holding(DECIDE_PERMISSION), groups__name=group_name)
            .exclude(email="")
            .distinct()
            .values_list("pk", flat=True)
        )
        now = timezone.now()
        rows = [
            Notification(
                user_id=pk,
                request_id=request.pk,
                kind=NotificationKind.ESCALATED,
                group_name=group_name,
                due_at=now,
            )
            for pk in members
        ]
        if not rows:
            logger.warning(
                "Request %s was escalated to the group %r, in which nobody who may decide has "
                "an email address.",
                request.pk,
                group_name,
            )
        return rows

    return _queue(NotificationKind.ESCALATED, build)


def on_approval_created(sender: Any, request: ApprovalRequest, **kwargs: Any) -> None:
    queue_for_opted_in(request, NotificationKind.CREATED)


def on_approval_escalated(
    sender: Any, request: ApprovalRequest, group_name: str, **kwargs: Any
) -> None:
    queue_for_group(request, group_name)


def on_approval_reminder(sender: Any, request: ApprovalRequest, **kwargs: Any) -> None:
    queue_for_opted_in(request, NotificationKind.REMINDER)


def connect() -> None:
    post_save.connect(forget_opted_in, sender=NotificationPreference, dispatch_uid="mail.saved")
    post_delete.connect(forget_opted_in, sender=NotificationPreference, dispatch_uid="mail.gone")
    signals.approval_created.connect(on_approval_created, dispatch_uid="notifications.created")
    signals.approval_escalated.connect(
        on_approval_escalated, dispatch_uid="notifications.escalated"
    )
    signals.approval_reminder.connect(on_approval_reminder, dispatch_uid="notifications.reminder")
    signals.server_loop_started.connect(sending.on_server_loop, dispatch_uid="notifications.loop")
