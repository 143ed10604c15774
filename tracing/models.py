"""Traces and spans as the SDK exports them, stored for the trace viewer and the admin.

Ids are the SDK's (`trace_<32 hex>`, `span_<24 hex>`); a span points at its trace by that id.
Rows are written by `tracing.exporter` (off the request path, after masking) and, for the
approval decisions and the trace's status, by the run engine through `tracing.recording`.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.expressions import Combinable

from approvals.models import AgentRun, RunStatus


class TraceStatus(models.TextChoices):
    RUNNING = "running", "Running"
    WAITING = "waiting", "Waiting for approval"
    OK = "ok", "OK"
    ERROR = "error", "Error"


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
