"""`manage.py deliver_webhooks`: send every webhook delivery that is due, then exit (for cron,
beside the server's timer or the workers' tasks; they never send one attempt twice)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from webhooks import delivery


class Command(BaseCommand):
    help = "Send the webhook deliveries that are due (retries whose time came included)."

    def handle(self, *args: Any, **options: Any) -> None:
        made = delivery.deliver_all_due()
        self.stdout.write(f"Made {made} webhook delivery attempt(s).")
