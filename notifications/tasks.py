"""The task the "tasks" executor mode's workers run to send emails (`sending.py`)."""

from __future__ import annotations

from datetime import datetime

from django.db import connections
from django.tasks import task

from notifications import sending


@task()
def send_notifications() -> int:
    try:
        return sending.send_all_due()
    finally:
        connections.close_all()


def enqueue(at: datetime | None = None) -> None:
    """A sending round now, or at `at` (a digest's or a retry's time)."""
    (send_notifications if at is None else send_notifications.using(run_after=at)).enqueue()
