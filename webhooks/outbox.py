"""The engine's signals (`engine.signals`), received inside the engine's transactions: one
delivery row per endpoint that wants the event, inserted in the same transaction as what it
announces, so a crash never loses one and a rolled-back decision never announces one. The
sending happens elsewhere (`delivery.py`), woken once the rows are committed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from common.remembered import Remembered
from engine import signals
from webhooks import delivery, payloads
from webhooks.models import (
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    new_event_id,
)

logger = logging.getLogger(__name__)

# How long a process trusts what it read of the endpoints' events (a change made in this
# process is seen at once): every engine transaction asks, and a query in each would cost a
# turn about as much as one of its own writes (0.6 ms on SQLite, measured).
SUBSCRIBED_SECONDS = 5.0


def _wanted() -> frozenset[str]:
    wanted = WebhookEndpoint.objects.filter(enabled=True).values_list("events", flat=True)
    return frozenset(event for events in wanted for event in (events or []))


_subscribed = Remembered(_wanted, lambda: SUBSCRIBED_SECONDS)


def subscribed() -> frozenset[str]:
    """The events some enabled endpoint wants, as read at most `SUBSCRIBED_SECONDS` ago."""
    return _subscribed.get()


def forget_subscribed(**kwargs: Any) -> None:
    """An endpoint changed here: read them again at the next event."""
    _subscribed.forget()


def queue(event_type: str, data: Callable[[], dict[str, Any]]) -> list[WebhookDelivery]:
    """A delivery of `event_type` to each enabled endpoint that subscribed to it; `data` is
    only built when one did. The common case, none, costs no query most of the time: which
    events any endpoint wants is read at most every `SUBSCRIBED_SECONDS` per process.

    In a savepoint of the engine's transaction: should building or writing the deliveries
    fail, the event is lost (logged as an error) and the engine's write goes on; a webhook
    never fails a run or a decision."""
    if event_type not in subscribed():
        return []
    enabled = WebhookEndpoint.objects.filter(enabled=True).only("pk", "events", "enabled")
    endpoints = [endpoint for endpoint in enabled if endpoint.wants(event_type)]
    if not endpoints:
        return []
    try:
        with transaction.atomic():
            body = data()
            created = timezone.now().isoformat()
            rows = []
            for endpoint in endpoints:
                event_id = new_event_id()
                payload = {"id": event_id, "type": event_type, "created": created, "data": body}
                rows.append(
                    WebhookDelivery(
                        endpoint=endpoint,
                        event_type=event_type,
                        event_id=event_id,
                        payload=payload,
                    )
                )
            WebhookDelivery.objects.bulk_create(rows)
            delivery.announce()
    except Exception:
        logger.exception(
            "[non-fatal] Webhooks: could not queue %s; it is not announced", event_type
        )
        return []
    return rows


def on_approval_created(sender: Any, request: ApprovalRequest, **kwargs: Any) -> None:
    queue(WebhookEvent.APPROVAL_CREATED, lambda: {"request": payloads.request_data(request)})


def on_approval_decided(
    sender: Any, request: ApprovalRequest, decision: ApprovalDecision, **kwargs: Any
) -> None:
    queue(WebhookEvent.APPROVAL_DECIDED, lambda: payloads.decision_data(request, decision))


def on_approval_escalated(
    sender: Any, request: ApprovalRequest, group_name: str, **kwargs: Any
) -> None:
    queue(
        WebhookEvent.APPROVAL_ESCALATED,
        lambda: {"request": payloads.request_data(request), "group": group_name},
    )


def on_run_completed(sender: Any, run_id: int, **kwargs: Any) -> None:
    queue(WebhookEvent.RUN_COMPLETED, lambda: payloads.run_data(run_id))


def on_run_failed(sender: Any, run_id: int, **kwargs: Any) -> None:
    queue(WebhookEvent.RUN_FAILED, lambda: payloads.run_data(run_id))


def connect() -> None:
    post_save.connect(forget_subscribed, sender=WebhookEndpoint, dispatch_uid="webhooks.saved")
    post_delete.connect(forget_subscribed, sender=WebhookEndpoint, dispatch_uid="webhooks.gone")
    signals.approval_created.connect(on_approval_created, dispatch_uid="webhooks.created")
    signals.approval_decided.connect(on_approval_decided, dispatch_uid="webhooks.decided")
    signals.approval_escalated.connect(on_approval_escalated, dispatch_uid="webhooks.escalated")
    signals.run_completed.connect(on_run_completed, dispatch_uid="webhooks.completed")
    signals.run_failed.connect(on_run_failed, dispatch_uid="webhooks.failed")
    signals.server_loop_started.connect(delivery.on_server_loop, dispatch_uid="webhooks.loop")
