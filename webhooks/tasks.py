"""The task the "tasks" executor mode's workers run to send webhooks (`delivery.py`)."""

from __future__ import annotations

from datetime import datetime

from django.db import connections
from django.tasks import task

from webhooks import delivery


@task()
def deliver_webhooks() -> int:
    try:
        return delivery.deliver_all_due()
    finally:
        connections.close_all()


def enqueue(at: datetime | None = None) -> None:
    """A delivery round now, or at `at` (a retry's time)."""
    (deliver_webhooks if at is None else deliver_webhooks.using(run_after=at)).enqueue()
