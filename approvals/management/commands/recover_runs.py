"""Deal with runs a dead process left behind; no tool ever runs twice."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from engine import executor, runs, sweeper
from engine.models import ProcessKind


class Command(BaseCommand):
    help = (
        "Fail every run still 'running' whose process is gone (stopped, or without a "
        "heartbeat for AGENTSITE_PROCESS_TIMEOUT) or, owned by no live process, with no sign "
        "of life for a while (nothing is retried), and submit again the jobs of queued or "
        "resuming runs that never started (nothing of them had executed)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=int,
            default=None,
            metavar="SECONDS",
            help="How long without progress makes a run stuck "
            "(default: AGENTSITE_STUCK_RUN_TIMEOUT).",
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=300.0,
            metavar="SECONDS",
            help="With the in-process executor, how long to wait for resubmitted runs "
            "before exiting (default: %(default)s).",
        )

    def handle(self, *args: Any, older_than: int | None, wait: float, **options: Any) -> None:
        if older_than is None:
            older_than = settings.AGENTSITE_STUCK_RUN_TIMEOUT
        if older_than < 0:
            raise CommandError("--older-than must be zero or more seconds.")
        # The runs this command resubmits may execute here: they are owned by a process
        # that beats, and fail at once if it dies.
        sweeper.start_thread(ProcessKind.COMMAND)
        recovery = runs.recover_stuck_runs(timedelta(seconds=older_than))
        self.stdout.write(
            f"Marked {recovery.failed} stuck run(s) as failed; "
            f"resubmitted {recovery.resubmitted} lost job(s)."
        )
        if recovery.resubmitted and not executor.wait_for_inprocess_jobs(wait):
            self.stderr.write(f"Some resubmitted runs were still going after {wait:g} s.")
