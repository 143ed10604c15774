"""Sending what the outbox queued (`outbox.py`): never in a run's, a pause's or a sweep's path.

`send_due()` claims due notifications with one conditional UPDATE (pending, or sending with
a lease that ran out → sending, its attempt counted, a lease set, a claim token of this
round), so exactly one process sends each however many send at once; it reads what it won,
renders each email (a digest groups the due rows of one user into one), gives its database
connection back, sends them over one connection of Django's email backend, then writes each
result (a connection only for that write). Refused or unreachable: retried after a growing
wait, up to AGENTSITE_EMAIL_MAX_ATTEMPTS, then failed. A row whose request was decided in the
meantime, or whose recipient may no longer decide, is skipped, not sent.

Who calls it, as for webhooks (`webhooks/delivery.py`; the waits, the lease and the timer
are `common/outbound.py`'s, the claims each app's own): in the "inprocess" executor mode,
a timer on the web server's loop (woken when a notification is committed or falls due, and
every AGENTSITE_EMAIL_POLL_SECONDS); in the "tasks" mode, a task
(`notifications.tasks.send_notifications`) enqueued in the transaction that writes the rows,
at their time; anywhere, `manage.py send_notifications` (cron).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, mailers
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals import explain
from common import outbound
from engine.permissions import is_reviewer
from notifications import mail
from notifications.models import Notification, NotificationStatus

logger = logging.getLogger(__name__)

# Rows claimed in one round.
BATCH = 50
ERROR_CHARS = 500


def lease() -> timedelta:
    """How long a claimed row is this process's: past it, another may claim it again (it died
    while sending). Beyond a round's SMTP time: each of its emails may take the timeout."""
    return outbound.lease(settings.EMAIL_SEND_TIMEOUT, waits=BATCH, margin=60)


@dataclass
class Email:
    """One email of a round: the rows it tells of, and the message (None: nothing left to
    say, every row skipped)."""

    user_id: int
    claim: str
    rows: list[int]
    attempts: int
    message: EmailMultiAlternatives | None
    skipped: list[int]

    def __repr__(self) -> str:
        # Never the address, nor the links (each carries a token).
        return f"email to user {self.user_id} of {len(self.rows)} notification(s)"


# --- claiming and rendering -----------------------------------------------------------------


def claim_due(limit: int = BATCH) -> tuple[str, list[Notification]]:
    """Claim at most `limit` due rows, oldest due first, with one conditional UPDATE; the
    claim's token and the rows this process won (with their request, run and user)."""
    now = timezone.now()
    token = uuid.uuid4().hex
    due = list(
        Notification.objects.due(now).order_by("due_at", "pk").values_list("pk", flat=True)[:limit]
    )
    if not due:
        return token, []
    Notification.objects.filter(
        pk__in=due,
        status__in=(NotificationStatus.PENDING, NotificationStatus.SENDING),
        due_at__lte=now,
    ).update(
        status=NotificationStatus.SENDING,
        claim=token,
        attempts=F("attempts") + 1,
        due_at=now + lease(),
    )
    won = list(
        Notification.objects.filter(claim=token, status=NotificationStatus.SENDING)
        .select_related("user", "request__run__requested_by", "request__run__conversation__owner")
        .order_by("due_at", "pk")
    )
    # A row whose user or request is gone (deleted outside Django: there is no database
    # constraint) is never loaded by the join above: skipped, not claimed again forever.
    Notification.objects.filter(claim=token, status=NotificationStatus.SENDING).exclude(
        pk__in=[row.pk for row in won]
    ).update(status=NotificationStatus.SKIPPED)
    return token, won


def _still_wanted(row: Notification) -> bool:
    """The request still waits and its recipient may still decide it, at an address."""
    user = row.user
    return bool(
        row.request.is_pending
        and not row.request.is_overdue()
        and user.is_active
        and user.email
        and is_reviewer(user)
    )


def emails(token: str, rows: list[Notification]) -> list[Email]:
    """The emails of a round's rows: a digest's rows of one user in one email, every other
    row in one of its own."""
    groups: dict[tuple[int, int], list[Notification]] = {}
    for row in rows:
        groups.setdefault((row.user_id, 0 if row.digest else row.pk), []).append(row)
    wanted = [row for row in rows if _still_wanted(row)]
    # Each call explained at once for the round, its facts read together.
    explain.attach([row.request for row in wanted])
    keep = {row.pk for row in wanted}
    made = []
    for (user_id, _), group in groups.items():
        told = [row for row in group if row.pk in keep]
        user = group[0].user
        message = mail.message(user, [mail.item(row, user) for row in told]) if told else None
        made.append(
            Email(
                user_id=user_id,
                claim=token,
                rows=[row.pk for row in told],
                attempts=max(row.attempts for row in group),
                message=message,
                skipped=[row.pk for row in group if row.pk not in keep],
            )
        )
    return made


# --- sending and recording ------------------------------------------------------------------


def _error(failed: BaseException) -> str:
    return f"{type(failed).__name__}: {failed}"[:ERROR_CHARS]


def deliver(batch: list[Email]) -> list[tuple[Email, str]]:
    """Send `batch` over one connection of the email backend (no database); each email with
    the error that kept it from going ("" when it went)."""
    sendable = [email for email in batch if email.message is not None]
    if not sendable:
        return []
    results: list[tuple[Email, str]] = []
    try:
        backend = mailers.default
        backend.open()
    except Exception as failed:
        return [(email, _error(failed)) for email in sendable]
    try:
        for email in sendable:
            assert email.message is not None
            try:
                sent = backend.send_messages([email.message])
                results.append((email, "" if sent else "The email backend sent nothing."))
            except Exception as failed:
                results.append((email, _error(failed)))
    finally:
        with contextlib.suppress(Exception):
            backend.close()
    return results


def record(email: Email, error: str) -> datetime | None:
    """Write what became of `email`'s rows; when they are retried, the time."""
    now = timezone.now()
    mine = Notification.objects.filter(claim=email.claim, status=NotificationStatus.SENDING)
    retry_at: datetime | None = None
    with transaction.atomic():
        if email.skipped:
            mine.filter(pk__in=email.skipped).update(status=NotificationStatus.SKIPPED)
        if not email.rows:
            return None
        if not error:
            kept = mine.filter(pk__in=email.rows).update(
                status=NotificationStatus.SENT, sent_at=now, last_error=""
            )
        elif (retry_at := _retry_at(email, now)) is None:
            kept = mine.filter(pk__in=email.rows).update(
                status=NotificationStatus.FAILED, last_error=error
            )
        else:
            kept = mine.filter(pk__in=email.rows).update(
                status=NotificationStatus.PENDING, due_at=retry_at, last_error=error
            )
            announce(retry_at)
    if not kept:
        logger.warning("The %r outlived its lease; another process took it over.", email)
    elif not error:
        logger.info("Sent the %r.", email)
    elif retry_at is None:
        logger.warning(
            "The %r failed for good after %d attempt(s): %s", email, email.attempts, error
        )
    else:
        logger.info("The %r failed (%s); retried at %s.", email, error, retry_at.isoformat())
    return retry_at


def _retry_at(email: Email, now: datetime) -> datetime | None:
    return outbound.retry_at(
        email.attempts,
        most=settings.AGENTSITE_EMAIL_MAX_ATTEMPTS,
        steps=settings.AGENTSITE_EMAIL_BACKOFF_SECONDS,
        now=now,
    )


def send_due(limit: int = BATCH) -> int:
    """One round: claim, render, send, record. How many rows it claimed."""
    token, rows = claim_due(limit)
    if not rows:
        return 0
    try:
        batch = emails(token, rows)
    except Exception as failed:
        # A bug in rendering: the rows are retried (and fail for good), never lost silently.
        logger.exception("[non-fatal] Notifications: could not render a round's emails")
        error = _error(failed)
        attempts = max(row.attempts for row in rows)
        batch = [Email(rows[0].user_id, token, [row.pk for row in rows], attempts, None, [])]
        record(batch[0], error)
        return len(rows)
    for email in batch:
        if email.message is None:
            record(email, "")
    outbound.release_connection()  # before talking to the mail server
    for email, error in deliver(batch):
        record(email, error)
    return len(rows)


def send_all_due(*, rounds: int = 1000) -> int:
    """Rounds of `send_due` until nothing is due now (a retry or a digest due later is left
    for later); how many rows were claimed."""
    claimed = 0
    for _ in range(rounds):
        count = send_due()
        if not count:
            break
        claimed += count
    return claimed


# --- who is told to send (common/outbound.py) ------------------------------------------------

_sender = outbound.OutboxSender(
    label="Notifications",
    round=lambda: send_all_due(),
    poll_setting="AGENTSITE_EMAIL_POLL_SECONDS",
    thread_name="agentsite-email",
)
# `configure(enqueue=...)` once at startup (`notifications.apps`); `announce(at)` in a
# transaction that wrote rows (due now, or at `at`); `on_server_loop`, the receiver of the
# engine's `server_loop_started`, starts this process's timer; `start_timer`/`stop_timer`
# for tests.
configure = _sender.configure
announce = _sender.announce
on_server_loop = _sender.on_server_loop
start_timer = _sender.start_timer
stop_timer = _sender.stop_timer
