"""The run's rows: `AgentRun` (its status, its one signed saved state, who asked, which
branch of its conversation it runs on), `ConsumedState` (each pause's state taken once) and
`ServerProcess` (the processes that run agents, and their heartbeats).

The database is the truth about a run. Status changes that can race (claiming a run,
failing it, claiming it for resumption) are conditional UPDATEs, so exactly one caller wins
however many try at once.

These rows were approvals' until the engine took them over: their tables keep the names
they had (`approvals_agentrun`, ...), so moving them rewrote no table.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models

from agentsite.db.faithful import FaithfulJSONField
from conversations.models import BRANCH_ID_MAX_LENGTH, MAIN_BRANCH, Conversation


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    RESUMING = "resuming", "Resuming"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    GUARDRAIL = "guardrail", "Stopped by a guardrail"


# Working on it: queued for, or held by, an executor.
ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING)
# A conversation takes one message at a time: none while a run of it works or waits.
BUSY_STATUSES = (*ACTIVE_STATUSES, RunStatus.WAITING)
FINISHED_STATUSES = (
    RunStatus.COMPLETED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
    RunStatus.GUARDRAIL,
)


class ProcessKind(models.TextChoices):
    WEB = "web", "Web server"
    WORKER = "worker", "Task worker"
    COMMAND = "command", "Management command"


class ServerProcessQuerySet(models.QuerySet["ServerProcess"]):
    def gone(self, silent_since: datetime) -> ServerProcessQuerySet:
        """Processes that will not finish what they own: stopped cleanly, or without a beat
        since `silent_since` (killed, frozen, cut off from the database)."""
        return self.filter(models.Q(stopped__isnull=False) | models.Q(beat__lt=silent_since))

    def alive(self, silent_since: datetime) -> ServerProcessQuerySet:
        """Processes that beat since `silent_since` and did not stop: what they own is theirs."""
        return self.filter(stopped__isnull=True, beat__gte=silent_since)


class ServerProcess(models.Model):
    """One row per web server, task worker or management command that runs agents: it beats
    every AGENTSITE_HEARTBEAT_SECONDS while it lives, and says when it stopped cleanly. A run
    names the process that owns it (`AgentRun.process`), so recovery can tell a dead owner
    from a quiet run."""

    identity = models.CharField(
        max_length=160, unique=True, help_text="kind:host:pid:random token, as runs name it."
    )
    kind = models.CharField(max_length=20, choices=ProcessKind.choices)
    host = models.CharField(max_length=100)
    pid = models.PositiveIntegerField()
    started = models.DateTimeField()
    beat = models.DateTimeField(help_text="Its last heartbeat.")
    stopped = models.DateTimeField(null=True, blank=True, help_text="Set on a clean stop.")

    objects = ServerProcessQuerySet.as_manager()

    class Meta:
        db_table = "approvals_serverprocess"
        ordering = ["-started"]
        verbose_name_plural = "server processes"

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.pid} on {self.host}"


class AgentRunQuerySet(models.QuerySet["AgentRun"]):
    def busy(self) -> AgentRunQuerySet:
        """Runs that keep their conversation from taking a new message."""
        return self.filter(status__in=BUSY_STATUSES)

    def started_by_since(self, user: Any, since: datetime) -> AgentRunQuerySet:
        """The runs `user` started from `since` on: what the message rate limit counts."""
        return self.filter(requested_by=user, created__gte=since)

    def stuck(self, cutoff: datetime) -> AgentRunQuerySet:
        """Active runs that have not moved since `cutoff` (a live run beats every 30 s)."""
        return self.filter(status__in=ACTIVE_STATUSES, updated__lt=cutoff)

    def on_branch(self, branch: str) -> AgentRunQuerySet:
        """The runs started on `branch` of their conversation."""
        return self.filter(branch=branch)


class AgentRun(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="runs")
    # The branch of its conversation it was started on (the one the conversation was on then,
    # read under its lock): its session reads and writes there, and the chat shows it with
    # that branch.
    branch = models.CharField(max_length=BRANCH_ID_MAX_LENGTH, default=MAIN_BRANCH)
    agent_name = models.CharField(max_length=100)
    input = models.TextField(help_text="What the user wrote to start this run.")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agent_runs",
    )
    status = models.CharField(
        max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True
    )
    # The one saved RunState (`RunState.to_json()`), present only while the run waits, and
    # the server's signature over it: a state edited in the database no longer matches.
    state = FaithfulJSONField(null=True, blank=True, editable=False)
    state_signature = models.CharField(max_length=64, blank=True, editable=False)
    # Set when a resumption takes the state: a state is resumed at most once, ever.
    state_consumed = models.BooleanField(default=False)
    # How many times this run has paused; its requests carry the pause they belong to.
    pause_count = models.PositiveIntegerField(default=0)
    # Version tags of the saved state.
    sdk_version = models.CharField(max_length=40, blank=True)
    state_schema_version = models.CharField(max_length=20, blank=True)
    agent_fingerprint = models.CharField(max_length=64, blank=True)
    trace_id = models.CharField(max_length=64, blank=True, db_index=True)
    final_output = models.TextField(blank=True)
    streamed_text = models.TextField(
        blank=True,
        editable=False,
        help_text="What the agent has written so far while it streams, so a reload shows it.",
    )
    usage = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    # Why it failed, for operators: what `engine.model_errors.describe` read from the error
    # (kind, status code, request id, the provider's error; the API key masked). `error` is
    # the sentence the user reads.
    error_detail = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    finished = models.DateTimeField(null=True, blank=True)
    # The `ServerProcess.identity` of the process that claimed it (set by the claim itself),
    # or, for a queued run of the in-process executor, of the process whose queue holds its
    # job; empty when that process keeps no heartbeat. A string, not a foreign key: the
    # claim writes it in its one UPDATE, whether or not the process's row is written yet.
    process = models.CharField(max_length=160, blank=True, default="")
    # Set by the user's Stop while the run streams (`engine.runs.stop`): the process that
    # runs it notices and cancels the stream.
    stop_requested = models.DateTimeField(null=True, blank=True, editable=False)

    objects = AgentRunQuerySet.as_manager()

    class Meta:
        db_table = "approvals_agentrun"
        ordering = ["-created"]
        indexes = [models.Index(fields=["conversation", "-created"], name="run_conv_created")]

    def __str__(self) -> str:
        return f"Run {self.pk} of {self.agent_name} ({self.get_status_display()})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_busy(self) -> bool:
        return self.status in BUSY_STATUSES

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


class ConsumedState(models.Model):
    """One row per pause whose saved state was taken, by a resumption or by the run's failure.

    The row, unique per (run, pause), is inserted in the transaction that claims the state:
    a copy of a state written back later finds it and is refused, so no state runs twice.
    """

    run = models.ForeignKey(
        AgentRun,
        on_delete=models.CASCADE,
        related_name="consumed_states",
        db_index=False,  # `consumed_state_once` starts with it
    )
    pause = models.PositiveIntegerField(help_text="Which pause of the run the state was saved at.")
    nonce = models.CharField(
        max_length=64,
        blank=True,
        help_text="The nonce signed into that state; empty for states saved without one.",
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "approvals_consumedstate"
        ordering = ["run", "pause"]
        constraints = [
            models.UniqueConstraint(fields=["run", "pause"], name="consumed_state_once"),
        ]

    def __str__(self) -> str:
        return f"State of run {self.run_id} at pause {self.pause}, consumed"
