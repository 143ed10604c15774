"""Expire overdue approval requests; their runs resume and tell the user."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from engine import executor, runs


class Command(BaseCommand):
    help = (
        "Apply the expiry policy of every approval request nobody decided in time "
        "(AGENTSITE_APPROVAL_TTL): reject it (the default; the agent tells the user it "
        "expired), escalate it once to a group, or approve it where the tool allows; and "
        "send the reminders that are due."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--wait",
            type=float,
            default=300.0,
            metavar="SECONDS",
            help=(
                "With the in-process executor, how long to wait for the resumed runs before "
                "exiting (default: %(default)s)."
            ),
        )

    def handle(self, *args: Any, wait: float, **options: Any) -> None:
        count = runs.expire_overdue()
        self.stdout.write(f"Expired {count} approval request(s).")
        if count and not executor.wait_for_inprocess_jobs(wait):
            self.stderr.write(
                f"Some resumed runs were still going after {wait:g} s; "
                "`manage.py recover_runs` will mark them failed."
            )
