"""Sending what the outbox queued (`outbox.py`): never in a run's or a decision's path.

`deliver_due()` claims due deliveries, each with one conditional UPDATE (pending → delivering,
its attempt counted and its lease set), so exactly one process sends an attempt however many
deliver at once; then it gives its database connection back, POSTs each claimed delivery on a
bounded pool of threads with a timeout (a slow or dead endpoint holds one thread for at most
that long, and takes at most half the threads), and writes each result (a connection only for
that write). 2xx is delivered; anything else, or no answer, is retried after a growing,
jittered wait, up to AGENTSITE_WEBHOOK_MAX_ATTEMPTS, then failed.

Who calls it: in the "inprocess" executor mode, a timer on the web server's loop (woken when
a delivery is committed or falls due, and every AGENTSITE_WEBHOOK_POLL_SECONDS); in the
"tasks" mode, a task (`webhooks.tasks.deliver_webhooks`) enqueued in the transaction that
writes a delivery, and again for each retry at its time; anywhere, `manage.py
deliver_webhooks` (cron). A delivery claimed by a process that died is claimed again once
its lease has run out.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import itertools
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Min
from django.utils import timezone

from common import destinations, outbound, signatures
from webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery

# Beside the signature's headers (`common.signatures`): the event's type, and its id (the
# same as webhook-id; kept for the receivers that read it).
EVENT_HEADER = "Agentsite-Event"
DELIVERY_HEADER = "Agentsite-Delivery"

logger = logging.getLogger(__name__)

# What is kept of a refusing endpoint's answer, for the operator.
ERROR_BODY_CHARS = 200
USER_AGENT = "agentsite-webhooks/1"


@dataclass(frozen=True)
class Claim:
    """One attempt this process won: everything it needs to send without the database."""

    delivery_id: int
    endpoint_id: int
    endpoint_name: str
    url: str
    secrets: tuple[str, ...]  # what signs it: the endpoint's secret, and a rotation's previous
    event_type: str
    event_id: str
    body: bytes
    attempt: int
    retries_used: int
    replay: bool

    def __repr__(self) -> str:
        # Never a secret, nor the URL (which may carry a token of its own).
        return f"{self.event_id} (attempt {self.attempt}) to {self.endpoint_name!r}"


@dataclass(frozen=True)
class Outcome:
    code: int | None
    error: str
    ms: int
    # Not worth trying again: the site itself refused the address (`common.destinations`);
    # the delivery fails at once, to be replayed once the URL or the allowed hosts change.
    final: bool = False

    @property
    def delivered(self) -> bool:
        return self.code is not None and 200 <= self.code < 300


def lease() -> timedelta:
    """How long a claimed attempt is this process's: past it, another may claim it again.
    Well beyond the connect and read timeouts of one attempt."""
    return outbound.lease(settings.AGENTSITE_WEBHOOK_TIMEOUT, waits=4, margin=30)


# --- claiming -------------------------------------------------------------------------------


def claim_due(limit: int) -> list[Claim]:
    """Claim at most `limit` due deliveries (at most half of them, rounded up, for one
    endpoint), oldest due first; the claims this process won."""
    if limit <= 0:
        return []
    now = timezone.now()
    per_endpoint = max(1, (limit + 1) // 2)
    due = WebhookDelivery.objects.due(now)
    # Endpoint by endpoint (a dead one with a thousand due must not hide the others'), the
    # endpoint whose oldest is the oldest first, then round-robin over them.
    endpoints = (
        due.values("endpoint_id")
        .annotate(oldest=Min("next_attempt_at"))
        .order_by("oldest")
        .values_list("endpoint_id", flat=True)
    )
    queues = [
        list(
            due.filter(endpoint_id=endpoint_id)
            .order_by("next_attempt_at", "pk")
            .values_list("pk", "attempts")[:per_endpoint]
        )
        for endpoint_id in list(endpoints)[:limit]
    ]
    candidates = [row for turn in itertools.zip_longest(*queues) for row in turn if row]
    won: list[int] = []
    for pk, attempts in candidates:
        if len(won) >= limit:
            break
        claimed = WebhookDelivery.objects.filter(
            pk=pk,
            attempts=attempts,
            status__in=(DeliveryStatus.PENDING, DeliveryStatus.DELIVERING),
            next_attempt_at__lte=now,
        ).update(
            status=DeliveryStatus.DELIVERING,
            attempts=attempts + 1,
            next_attempt_at=now + lease(),
            last_attempt_at=now,
        )
        if claimed:
            won.append(pk)
    rows = WebhookDelivery.objects.select_related("endpoint").filter(pk__in=won)
    return [
        Claim(
            delivery_id=row.pk,
            endpoint_id=row.endpoint_id,
            endpoint_name=row.endpoint.name,
            url=row.endpoint.url,
            secrets=row.endpoint.signing_secrets(now),
            event_type=row.event_type,
            event_id=row.event_id,
            body=row.body(),
            attempt=row.attempts,
            retries_used=row.retries_used,
            replay=row.replays > 0 and row.attempts == row.replay_from + 1,
        )
        for row in sorted(rows, key=lambda row: won.index(row.pk))
    ]


# --- sending --------------------------------------------------------------------------------


def headers(claim: Claim, timestamp: int | None = None) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        **signatures.headers(claim.secrets, claim.event_id, claim.body, timestamp),
        EVENT_HEADER: claim.event_type,
        DELIVERY_HEADER: claim.event_id,
    }


def post(claim: Claim) -> Outcome:
    """One POST of the claimed delivery, signed now; no database. A redirect is not
    followed (`outbound.opener`): it is an answer that is not 2xx."""
    request = urllib.request.Request(
        claim.url, data=claim.body, headers=headers(claim), method="POST"
    )
    timeout = settings.AGENTSITE_WEBHOOK_TIMEOUT
    started = time.monotonic()
    code: int | None = None
    error = ""
    final = False
    try:
        with outbound.opener.open(request, timeout=timeout) as response:
            code = response.status
            response.read(64 * 1024)
    except urllib.error.HTTPError as refused:
        code = refused.code
        error = outbound.refusal(refused, ERROR_BODY_CHARS)
    except TimeoutError:
        error = f"No answer within {timeout:g} s."
    except urllib.error.URLError as failed:
        reason = failed.reason
        final = isinstance(reason, destinations.DestinationRefused)
        if final:
            error = f"Not sent: {reason}"
        elif isinstance(reason, TimeoutError):
            error = f"No answer within {timeout:g} s."
        else:
            error = f"Could not connect: {reason}"
    except (OSError, http.client.HTTPException, ValueError) as failed:
        error = f"{type(failed).__name__}: {failed}"
    return Outcome(
        code=code, error=error, ms=round((time.monotonic() - started) * 1000), final=final
    )


def record(claim: Claim, outcome: Outcome) -> datetime | None:
    """Write the attempt and what follows from it; when it is retried, its time."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "last_response_code": outcome.code,
        "last_response_ms": outcome.ms,
        "last_error": outcome.error[:2000],
    }
    retry_at: datetime | None = None
    if outcome.delivered:
        changes.update(status=DeliveryStatus.DELIVERED, delivered_at=now)
    else:
        retry_at = (
            None
            if outcome.final
            else outbound.retry_at(
                claim.retries_used,
                most=settings.AGENTSITE_WEBHOOK_MAX_ATTEMPTS,
                steps=settings.AGENTSITE_WEBHOOK_BACKOFF_SECONDS,
                now=now,
            )
        )
        if retry_at is None:
            changes.update(status=DeliveryStatus.FAILED)
        else:
            changes.update(status=DeliveryStatus.PENDING, next_attempt_at=retry_at)
    with transaction.atomic():
        if retry_at is not None:
            # Committed with the retry's time, as the outbox announces its rows.
            announce(retry_at)
        WebhookAttempt.objects.create(
            delivery_id=claim.delivery_id,
            number=claim.attempt,
            replay=claim.replay,
            started=now - timedelta(milliseconds=outcome.ms),
            response_code=outcome.code,
            response_ms=outcome.ms,
            error=outcome.error[:2000],
        )
        # Only while the attempt is still ours (a lease that ran out was claimed again).
        kept = WebhookDelivery.objects.filter(
            pk=claim.delivery_id, status=DeliveryStatus.DELIVERING, attempts=claim.attempt
        ).update(**changes)
    if not kept:
        logger.warning(
            "Webhook %s outlived its lease; its result is kept as an attempt only.",
            claim,
        )
        return None
    if outcome.delivered:
        logger.info("Webhook %s delivered (%d).", claim, outcome.code)
    elif retry_at is None:
        logger.warning(
            "Webhook %s failed for good after %d attempt(s): %s",
            claim,
            claim.retries_used,
            outcome.error,
        )
    else:
        logger.info(
            "Webhook %s failed (%s); retried at %s.",
            claim,
            outcome.error,
            retry_at.isoformat(),
        )
    return retry_at


def attempt(claim: Claim) -> Outcome:
    """Send one claimed attempt and record it, holding a connection only to write."""
    try:
        outcome = post(claim)
        record(claim, outcome)
    finally:
        # The pool's threads outlive the attempt: a connection kept would be a slot lost.
        connections.close_all()
    return outcome


# --- rounds ---------------------------------------------------------------------------------


class _Senders:
    """This process's sending threads, AGENTSITE_WEBHOOK_CONCURRENCY of them, and how many
    are busy (a round claims only as many attempts as are free)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.busy = 0

    def free(self) -> int:
        with self._lock:
            return max(0, settings.AGENTSITE_WEBHOOK_CONCURRENCY - self.busy)

    def submit(self, claim: Claim) -> concurrent.futures.Future[Outcome]:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=max(1, settings.AGENTSITE_WEBHOOK_CONCURRENCY),
                    thread_name_prefix="agentsite-webhook",
                )
            self.busy += 1
            future = self._pool.submit(attempt, claim)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: concurrent.futures.Future[Outcome]) -> None:
        with self._lock:
            self.busy -= 1
        if (failed := future.exception()) is not None:
            logger.error("[non-fatal] A webhook attempt failed to run: %r", failed)
        # A thread is free: more may be due.
        _sender.wake_timers()


_senders = _Senders()


def deliver_due(*, wait: bool = True) -> int:
    """Claim the due deliveries this process has free threads for and send them. With
    `wait`, return once they are recorded; else at once (the server's timer). Returns how
    many attempts were started."""
    claims = claim_due(_senders.free())
    outbound.release_connection()  # before waiting on HTTP
    futures = [_senders.submit(claim) for claim in claims]
    if wait:
        concurrent.futures.wait(futures)
    return len(claims)


def deliver_all_due(*, rounds: int = 1000) -> int:
    """Rounds of `deliver_due` until nothing is due now (a retry due later is left for
    later); how many attempts were made."""
    made = 0
    for _ in range(rounds):
        started = deliver_due(wait=True)
        if not started:
            break
        made += started
    return made


# --- who is told to deliver (common/outbound.py) ---------------------------------------------

_sender = outbound.OutboxSender(
    label="Webhooks",
    round=lambda: deliver_due(wait=False),
    poll_setting="AGENTSITE_WEBHOOK_POLL_SECONDS",
    thread_name="agentsite-webhook-claim",
)
# `configure(enqueue=...)` once at startup (`webhooks.apps`); `announce(at)` in a transaction
# that wrote deliveries (due now, or at `at`); `on_server_loop`, the receiver of the engine's
# `server_loop_started`, starts this process's timer; `start_timer`/`stop_timer` for tests.
configure = _sender.configure
announce = _sender.announce
on_server_loop = _sender.on_server_loop
start_timer = _sender.start_timer
stop_timer = _sender.stop_timer
