"""Traces and spans as the SDK exports them, stored for the trace viewer and the admin.

Ids are the SDK's (`trace_<32 hex>`, `span_<24 hex>`); a span points at its trace by that id.
Rows are written by `tracing.exporter` (off the request path, after masking) and, for the
approval decisions and the trace's status, by the run engine through `tracing.recording`.
"""

from __future__ import annotations

from typing import Any

from django.db import models

from approvals.models import AgentRun, RunStatus


class TraceStatus(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    OK = "ok", "OK"
    ERROR = "error", "Error"


def status_for_run(run_status: str, *, has_error: bool = False) -> str:
    """The status of a run's trace: error when the run failed (or was cancelled) or any
    span has an error; otherwise it follows the run."""
    if has_error or run_status in (RunStatus.FAILED, RunStatus.CANCELLED):
        return TraceStatus.ERROR
    if run_status == RunStatus.WAITING:
        return TraceStatus.WAITING
    if run_status == RunStatus.COMPLETED:
        return TraceStatus.OK
    return TraceStatus.RUNNING


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
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name or 'Trace'} {self.trace_id}"

    def derived_status(self) -> str:
        """What `status` should be, read from the run and the spans (the stored field is kept
        in sync by the engine and the exporter; this is the rule they follow)."""
        has_error = self.spans.filter(error__isnull=False).exists()
        if self.run is not None:
            return status_for_run(self.run.status, has_error=has_error)
        if has_error:
            return TraceStatus.ERROR
        # Not a run of ours: done once a root span (it ends last) has arrived.
        if self.spans.filter(parent_id__isnull=True).exists():
            return TraceStatus.OK
        return TraceStatus.RUNNING

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()


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
SPAN_FIELDS = (*SPAN_PLACE_FIELDS, "span_data", "error", "total_tokens")


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

    class Meta:
        ordering = ["started_at", "pk"]
        indexes = [models.Index(fields=["trace", "started_at"], name="span_trace_started")]

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
