"""The engine's signals (`engine.signals`), received inside the engine's transactions: one
delivery row per endpoint that wants the event, inserted in the same transaction as what it
announces, so a crash never loses one and a rolled-back decision never announces one. The
sending happens elsewhere (`delivery.py`), woken once the rows are committed."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from engine import signals
from webhooks import delivery, payloads
from webhooks.models import (
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    new_event_id,
)

logger = logging.getLogger(__name__)


def queue(event_type: str, data: Callable[[], dict[str, Any]]) -> list[WebhookDelivery]:
    """A delivery of `event_type` to each enabled endpoint that subscribed to it; `data` is
    only built when one did (the common case, none, costs one small query).

    In a savepoint of the engine's transaction: should building or writing the deliveries
    fail, the event is lost (logged as an error) and the engine's write goes on; a webhook
    never fails a run or a decision."""
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


def on_run_completed(sender: Any, run_id: int, **kwargs: Any) -> None:
    queue(WebhookEvent.RUN_COMPLETED, lambda: payloads.run_data(run_id))


def on_run_failed(sender: Any, run_id: int, **kwargs: Any) -> None:
    queue(WebhookEvent.RUN_FAILED, lambda: payloads.run_data(run_id))


def connect() -> None:
    signals.approval_created.connect(on_approval_created, dispatch_uid="webhooks.created")
    signals.approval_decided.connect(on_approval_decided, dispatch_uid="webhooks.decided")
    signals.run_completed.connect(on_run_completed, dispatch_uid="webhooks.completed")
    signals.run_failed.connect(on_run_failed, dispatch_uid="webhooks.failed")
    signals.server_loop_started.connect(delivery.on_server_loop, dispatch_uid="webhooks.loop")
