"""`manage.py send_notifications`: send every email notification that is due, then exit (for
cron, beside the server's timer or the workers' tasks; they never send one row twice)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from notifications import sending


class Command(BaseCommand):
    help = "Send the email notifications that are due (digests and retries whose time came)."

    def handle(self, *args: Any, **options: Any) -> None:
        claimed = sending.send_all_due()
        self.stdout.write(f"Handled {claimed} email notification(s).")
