"""Traces and spans as the SDK exports them, stored for the trace viewer and the admin.

Ids are the SDK's (`trace_<32 hex>`, `span_<24 hex>`); a span points at its trace by that id.
Rows are written by `tracing.exporter` (off the request path, after masking) and, for the
approval decisions and the trace's status, by the run engine through `tracing.recording`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.expressions import Combinable

from engine.models import AgentRun, RunStatus


class TraceStatus(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    OK = "ok", "OK"
    ERROR = "error", "Error"


class TraceOutcome(models.TextChoices):
    """How a run ended, for operators: more than OK / Error (`recording.run_outcome` decides
    it from the run and its decisions; a trace without a run takes it from its status)."""

    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    COMPLETED = "completed", "Completed"
    APPROVED = "approved", "Completed, a call approved"
    REJECTED = "rejected", "Completed, a call rejected"
    EXPIRED = "expired", "A request expired"
    WITHDRAWN = "withdrawn", "Withdrawn by the user"
    STOPPED = "stopped", "Stopped by the user"
    GUARDRAIL = "guardrail", "Stopped by a guardrail"
    FAILED = "failed", "Failed"


# A trace whose outcome nobody stored (no run: a foreign trace) has its status's.
STATUS_OUTCOME: dict[str, TraceOutcome] = {
    "running": TraceOutcome.RUNNING,
    "waiting": TraceOutcome.WAITING,
    "ok": TraceOutcome.COMPLETED,
    "error": TraceOutcome.FAILED,
}


def outcome_filter(outcome: str) -> Q:
    """The traces of one outcome, stored or (without one) read from the status."""
    statuses = [status for status, value in STATUS_OUTCOME.items() if value == outcome]
    return Q(outcome=outcome) | Q(outcome="", status__in=statuses)


# A run's trace follows its run: the trace's status for each status of the run (any other,
# queued to resuming: running). A run its user stopped, or its guardrail ended, did not fail:
# an operator's "Error" means something broke; the trace's spans say who stopped it
# (`tracing.recording.STOP_SPAN_NAME`) or which guardrail tripped.
RUN_TRACE_STATUS: dict[str, TraceStatus] = {
    RunStatus.WAITING: TraceStatus.WAITING,
    RunStatus.COMPLETED: TraceStatus.OK,
    RunStatus.FAILED: TraceStatus.ERROR,
    RunStatus.CANCELLED: TraceStatus.OK,
    RunStatus.GUARDRAIL: TraceStatus.OK,
}
# The error the SDK sets on the agent span of a run that a guardrail's tripwire ended: the
# guardrail did its job, so that error alone does not fail the trace.
GUARDRAIL_TRIPPED = "Guardrail tripwire triggered"
# A span whose error fails its trace.
FAILED_SPAN = Q(error__isnull=False) & (
    Q(error__message__isnull=True) | ~Q(error__message=GUARDRAIL_TRIPPED)
)


def trace_status(
    run_status: str | None,
    *,
    has_error: bool = False,
    has_root: bool = False,
    stored: str = TraceStatus.RUNNING,
) -> str:
    """The rule of a trace's status (`status_expression` is the same rule in SQL).

    A span with an error fails the trace (`FAILED_SPAN`: a guardrail's tripwire is none).
    Otherwise a run's trace follows its run (`RUN_TRACE_STATUS`); any other trace, still
    running, is done once its root span (it ends last) has arrived, and else keeps its
    `stored` status.
    """
    if has_error:
        return TraceStatus.ERROR
    if run_status is not None:
        return RUN_TRACE_STATUS.get(run_status, TraceStatus.RUNNING)
    if has_root and stored == TraceStatus.RUNNING:
        return TraceStatus.OK
    return stored


def status_expression(run_trace_status: Combinable) -> Case:
    """`trace_status` as SQL, for an UPDATE of traces: the new status of each row.

    `run_trace_status` is what a run's trace takes: its run's status through
    `RUN_TRACE_STATUS`, or `F("status")` where the engine owns it (the exporter's writes).
    """
    spans = Span.objects.filter(trace=OuterRef("trace_id"))
    return Case(
        When(Exists(spans.filter(FAILED_SPAN)), then=Value(TraceStatus.ERROR.value)),
        When(run__isnull=False, then=run_trace_status),
        When(
            Q(status=TraceStatus.RUNNING.value) & Exists(spans.filter(parent_id__isnull=True)),
            then=Value(TraceStatus.OK.value),
        ),
        default=F("status"),
    )


class Trace(models.Model):
    trace_id = models.CharField(max_length=64, unique=True)
    workflow_name = models.CharField(max_length=255, blank=True)
    group_id = models.CharField(
        max_length=255, blank=True, help_text="The conversation's session id, for agentsite's runs."
    )
    metadata = models.JSONField(default=dict, blank=True)
    # From the spans: the SDK exports no times for a trace.
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(
        max_length=10, choices=TraceStatus.choices, default=TraceStatus.RUNNING
    )
    total_tokens = models.PositiveBigIntegerField(default=0)
    # The time the run was working, apart from the time it waited for a person: the sum of
    # the root spans' durations (a run paused and resumed has one root task span per part).
    # Its waiting time is the trace's whole duration less this. Kept by the exporter.
    active_seconds = models.FloatField(null=True, blank=True)
    # How its run ended and why, in a line (`TraceOutcome`; blank: read it from the status).
    # Kept by the engine (`recording.follow_run`), never by the exporter.
    outcome = models.CharField(max_length=20, choices=TraceOutcome.choices, blank=True)
    outcome_reason = models.CharField(max_length=300, blank=True)
    run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="traces"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-started_at", "-pk"]
        indexes = [
            models.Index(fields=["status", "-started_at"], name="trace_status_started"),
            models.Index(fields=["group_id"], name="trace_group"),
            models.Index(fields=["workflow_name"], name="trace_workflow"),
            models.Index(fields=["-started_at"], name="trace_started"),
            models.Index(fields=["outcome", "-started_at"], name="trace_outcome_started"),
            # The dashboard's counts and percentiles of a range, read from the index alone.
            models.Index(
                fields=["started_at", "outcome", "status", "active_seconds"],
                name="trace_dashboard",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name or 'Trace'} {self.trace_id}"

    def derived_status(self) -> str:
        """What `status` should be, read from the run and the spans (the stored field is kept
        in sync by the engine and the exporter; `trace_status` is the rule they follow)."""
        return trace_status(
            self.run.status if self.run is not None else None,
            has_error=self.spans.filter(FAILED_SPAN).exists(),
            has_root=self.spans.filter(parent_id__isnull=True).exists(),
        )

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def waiting_seconds(self) -> float | None:
        """The time it waited for people: its whole duration less its active time."""
        total = self.duration_seconds
        if total is None or self.active_seconds is None:
            return None
        return max(0.0, total - self.active_seconds)

    @property
    def shown_outcome(self) -> str:
        """Its outcome, or (none stored) its status's."""
        return self.outcome or STATUS_OUTCOME.get(self.status, TraceOutcome.RUNNING).value

    def get_shown_outcome_display(self) -> str:
        return str(TraceOutcome(self.shown_outcome).label)


# Where a span sits in its trace: the fields the tree, the admin and the exporter all start with.
SPAN_PLACE_FIELDS = (
    "span_id",
    "trace",
    "parent_id",
    "span_type",
    "name",
    "started_at",
    "ended_at",
)
# Every field of a span but its primary key, in the order the exporter writes them.
SPAN_FIELDS = (
    *SPAN_PLACE_FIELDS,
    "span_data",
    "error",
    "total_tokens",
    "model",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "agent",
)


class Span(models.Model):
    span_id = models.CharField(max_length=64, unique=True)
    # Keyed by the SDK's trace id, so the exporter writes spans without looking traces up.
    trace = models.ForeignKey(
        Trace,
        to_field="trace_id",
        db_column="trace_id",
        on_delete=models.CASCADE,
        related_name="spans",
        db_index=False,  # the (trace, started_at) index serves
    )
    parent_id = models.CharField(max_length=64, null=True, blank=True)
    span_type = models.CharField(
        max_length=40,
        help_text="agent, generation, response, function, handoff, guardrail, custom, task, "
        "turn, ... (a custom span's `sdk_span_type` when it has one).",
    )
    name = models.CharField(max_length=255, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    span_data = models.JSONField(default=dict, blank=True)
    error = models.JSONField(null=True, blank=True)
    total_tokens = models.PositiveBigIntegerField(
        default=0, help_text="Tokens of a generation or response span; 0 for the others."
    )
    # A model call's usage, for its cost (`tracing.pricing`): only generation and response
    # spans have a model; every other span leaves it blank (so the usage index skips them).
    model = models.CharField(max_length=200, blank=True, default="")
    input_tokens = models.PositiveBigIntegerField(
        default=0, help_text="Input tokens, the cached ones included."
    )
    cached_tokens = models.PositiveBigIntegerField(
        default=0, help_text="Of the input tokens, those read from the provider's cache."
    )
    output_tokens = models.PositiveBigIntegerField(default=0)
    # A model call's agent, copied from its trace by the exporter (the trace's
    # `metadata["agent"]`, else its workflow name), so that tokens and cost per agent are
    # summed from the `span_usage` index alone, without a lookup of each call's trace.
    agent = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["started_at", "pk"]
        indexes = [
            models.Index(fields=["trace", "started_at"], name="span_trace_started"),
            # The model calls by time, for cost and token totals per day, model and agent: with
            # their agent and tokens, so that the sums read the index alone (the dashboard).
            models.Index(
                fields=[
                    "started_at",
                    "model",
                    "agent",
                    "input_tokens",
                    "cached_tokens",
                    "output_tokens",
                    "total_tokens",
                ],
                name="span_usage",
                condition=~Q(model=""),
            ),
            # The calls of a tool, for the trace list's tool filter.
            models.Index(
                fields=["name", "trace"], name="span_tool", condition=Q(span_type="function")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.span_type} {self.name or self.span_id}"

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def data(self) -> dict[str, Any]:
        """A custom span's `data` (task, turn, approval decision, ...), else `{}`."""
        data = self.span_data.get("data") if isinstance(self.span_data, dict) else None
        return data if isinstance(data, dict) else {}


class ModelPrice(models.Model):
    """What a model's tokens cost, from a date on: the price table operators keep in admin.

    `model` is a model's name as its spans report it (`gpt-4.1-mini`), or a pattern with `*`
    (`gpt-4.1-mini-*`, for its dated snapshots). For a call, the exact name wins over a
    pattern, a longer pattern over a shorter one, and of one name the price with the latest
    `valid_from` on or before the call's day (`tracing.pricing`). A model with no price shows
    "no price for <model>", never a cost of 0.
    """

    model = models.CharField(
        max_length=200,
        help_text="The model's name as its spans report it, or a pattern with * "
        "(e.g. gpt-4.1-mini-* for its dated snapshots).",
    )
    input_per_million = models.DecimalField(
        max_digits=12, decimal_places=4, help_text="Price of a million input tokens."
    )
    cached_input_per_million = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="Price of a million cached input tokens; blank: the input price.",
    )
    output_per_million = models.DecimalField(
        max_digits=12, decimal_places=4, help_text="Price of a million output tokens."
    )
    currency = models.CharField(max_length=3, default="USD", help_text="ISO 4217, e.g. USD.")
    valid_from = models.DateField(help_text="The first day (UTC) this price applies.")
    note = models.CharField(max_length=200, blank=True, help_text="Where the price comes from.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "-valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["model", "valid_from"], name="price_model_from"),
        ]

    def __str__(self) -> str:
        return f"{self.model} from {self.valid_from}"


class FeedbackScore(models.IntegerChoices):
    UP = 1, "Thumbs up"
    DOWN = -1, "Thumbs down"


class Feedback(models.Model):
    """An end user's rating of a reply (the run that wrote it): up or down, with an optional
    comment. One per run and user: rating again changes it."""

    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_feedback"
    )
    score = models.SmallIntegerField(choices=FeedbackScore.choices)
    comment = models.TextField(blank=True, max_length=2000)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["run", "user"], name="feedback_run_user"),
        ]
        indexes = [models.Index(fields=["score", "-updated"], name="feedback_score")]

    def __str__(self) -> str:
        return f"{self.get_score_display()} on run {self.run_id}"
