"""The tracing app's plain SQL: the exporter's statements, made once per database from the
models (`agentsite.db.sql`).

Why plain SQL: `DatabaseExporter` stores every span the SDK emits, on the SDK's processor
thread beside the runs. Its rows go as tuples in one `executemany` per statement, because
`bulk_create`'s preparation of each field of each row cost more than the inserts; the
benchmark rows are "tracing cost: agentsite turn, traced ÷ untraced" (goal ≤ 1.1×) and
"tracing cost: exporter throughput, 10,000-span burst" (docs/benchmarks.md). And the engine's
`follow_run`, in every completion and pause: the ORM's insert and update with the status rule
cost 1.8 ms against 0.07 ms for this one statement, which lost "turn overhead: one turn, one
tool call" (goal ≤ 1.5× the bare SDK).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F, Field
from django.db.models.constants import OnConflict
from django.db.models.expressions import Combinable, RawSQL
from django.db.models.sql import UpdateQuery

from agentsite.db.sql import column, per_vendor, placeholders, qualified, table
from approvals.models import ApprovalDecision, ApprovalRequest
from engine.models import AgentRun
from tracing.models import SPAN_FIELDS, Span, Trace, TraceStatus, status_expression

# The fields the exporter writes, in the order of its rows: all of each model's own but the
# primary key (a test holds them to the models); a span's are `tracing.models.SPAN_FIELDS`.
TRACE_FIELDS = (
    "trace_id",
    "workflow_name",
    "group_id",
    "metadata",
    "started_at",
    "ended_at",
    "status",
    "total_tokens",
    "active_seconds",
    "outcome",
    "outcome_reason",
    "run",
    "created",
    "updated",
)
# What a trace delivered again updates (never its status, which the engine owns).
TRACE_UPSERT_FIELDS = ("workflow_name", "group_id", "metadata", "run", "updated")


@dataclass(frozen=True)
class Statements:
    # `executemany` of the batch's traces, `TRACE_FIELDS` rows (tracing cost, throughput).
    upsert_traces: str
    # `executemany` of the traces only known from their spans, `TRACE_FIELDS` rows (same).
    insert_placeholders: str
    # `executemany` of the batch's spans, `SPAN_FIELDS` rows (same: most of an export).
    insert_spans: str
    # `executemany` per touched trace, rows from `update_trace_row`: its times and tokens from
    # its spans, its status by the rule (`tracing.models.status_expression`) (same).
    update_trace: str
    update_trace_params: tuple[Any, ...]
    # The runs of the batch's traces, one query per batch (same):
    # `runs + " OR ".join(runs_by_trace, runs_by_pk)`, `{keys}` made placeholders.
    runs: str
    runs_by_trace: str
    runs_by_pk: str
    run_pk_range: tuple[int | None, int | None]
    # Each touched trace's status and span count, one query per batch (same); `{keys}`.
    announce: str
    # `follow_run`: a run's trace row inserted with its status, or an existing row's status
    # set by the rule (a span's error wins); a `new_trace` row + `follow_run_params` (turn
    # overhead: it runs in every completion).
    follow_run: str
    follow_run_params: tuple[Any, ...]
    # Params: trace id, agent name. The trace's first agent span, one of that agent first
    # (the parent of a decision's span; pause and resume: the ORM's query with its CASE
    # ordering cost most of a decision's span).
    first_agent_span: str
    # Params: run id. The run's decisions, oldest first: kind, tool, reviewer's username,
    # policy, message (`recording.run_outcome`, in every completion of a run that paused).
    run_decisions: str

    def update_trace_row(self, updated: Any, trace_id: str) -> tuple[Any, ...]:
        return (updated, *self.update_trace_params, trace_id)


def _insert(model: type[Any], names: tuple[str, ...], on_conflict: OnConflict) -> str:
    """The INSERT of `bulk_create(ignore_conflicts=True)` or, for traces, of
    `bulk_create(update_conflicts=True, unique_fields=["trace_id"],
    update_fields=TRACE_UPSERT_FIELDS)`, with the database's own conflict clause (`INSERT OR
    IGNORE` on SQLite, `ON CONFLICT DO NOTHING` on PostgreSQL, `ON CONFLICT (...) DO UPDATE`
    on both)."""
    ops = connection.ops
    fields = [model._meta.get_field(name) for name in names]
    updating = on_conflict == OnConflict.UPDATE
    suffix = ops.on_conflict_suffix_sql(
        fields,
        on_conflict,
        [_name(Trace, name) for name in TRACE_UPSERT_FIELDS] if updating else None,
        [_name(Trace, "trace_id")] if updating else None,
    )
    return (
        f"{ops.insert_statement(on_conflict=on_conflict)} {table(model)} "
        f"({_columns(model, names)}) "
        f"VALUES ({placeholders(len(names))}) {suffix}"
    ).strip()


def _columns(model: type[Any], names: tuple[str, ...]) -> str:
    return ", ".join(column(model, name) for name in names)


def _seconds() -> str:
    """A span's duration in seconds, in this database's SQL (null while it has no end)."""
    started, ended = qualified(Span, "started_at"), qualified(Span, "ended_at")
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM ({ended} - {started}))"
    # Whole seconds, then the microseconds of the stored text ("YYYY-MM-DD HH:MM:SS.ffffff",
    # from its 20th character; none: 0). julianday() counts whole milliseconds, which made a
    # run that never waited seem to wait a fraction of one.
    # (unixepoch(), not strftime('%s'): the statement takes parameters, "%s" is one.)
    return (
        f"((unixepoch({ended}) - unixepoch({started})) + "
        f"(CAST(substr({ended}, 20) AS REAL) - CAST(substr({started}, 20) AS REAL)))"
    )


def _name(model: type[Any], name: str) -> str:
    """A column's name unquoted, as `on_conflict_suffix_sql` takes it."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column
    return str(field.column)


def _status_sql(run_trace_status: Combinable) -> tuple[str, tuple[Any, ...]]:
    """The status rule (`tracing.models.status_expression`) as SQL, compiled by the ORM for
    an UPDATE of traces."""
    query = UpdateQuery(Trace)
    expression = status_expression(run_trace_status).resolve_expression(
        query, allow_joins=False, for_save=True
    )
    sql, params = query.get_compiler(connection=connection).compile(expression)
    return sql, tuple(params)


@per_vendor
def statements() -> Statements:
    """The exporter's SQL for this database."""
    traces, spans, runs = table(Trace), table(Span), table(AgentRun)
    trace_id = qualified(Trace, "trace_id")
    spans_of_trace = f"FROM {spans} WHERE {qualified(Span, 'trace')} = {trace_id}"
    # The exporter's writes leave a run's trace the status the engine gave it.
    status, status_params = _status_sql(F("status"))
    # `follow_run` gives it the one of the row it would insert.
    followed, followed_params = _status_sql(RawSQL(f"EXCLUDED.{column(Trace, 'status')}", ()))
    assert Span._meta.pk is not None and AgentRun._meta.pk is not None
    run_pk = qualified(AgentRun, AgentRun._meta.pk.name)
    span_type, span_name = qualified(Span, "span_type"), qualified(Span, "name")
    decision, request = table(ApprovalDecision), table(ApprovalRequest)
    people = get_user_model()
    return Statements(
        run_decisions=(
            "SELECT "
            + ", ".join(
                (
                    qualified(ApprovalDecision, "kind"),
                    qualified(ApprovalRequest, "tool_name"),
                    qualified(people, people.USERNAME_FIELD),
                    qualified(ApprovalDecision, "policy_name"),
                    qualified(ApprovalDecision, "message"),
                )
            )
            + f" FROM {decision} INNER JOIN {request} ON {qualified(ApprovalDecision, 'request')}"
            f" = {qualified(ApprovalRequest, 'id')} LEFT OUTER JOIN {table(people)} ON "
            f"{qualified(ApprovalDecision, 'reviewer')} = {qualified(people, 'id')} "
            f"WHERE {qualified(ApprovalRequest, 'run')} = %s ORDER BY "
            f"{qualified(ApprovalDecision, 'created')}, {qualified(ApprovalDecision, 'id')}"
        ),
        first_agent_span=(
            f"SELECT {qualified(Span, 'span_id')} FROM {spans} "
            f"WHERE {qualified(Span, 'trace')} = %s AND {span_type} = 'agent' "
            f"ORDER BY CASE WHEN {span_name} = %s THEN 0 ELSE 1 END, "
            f"{qualified(Span, 'started_at')}, {qualified(Span, 'id')} LIMIT 1"
        ),
        upsert_traces=_insert(Trace, TRACE_FIELDS, OnConflict.UPDATE),
        insert_placeholders=_insert(Trace, TRACE_FIELDS, OnConflict.IGNORE),
        insert_spans=_insert(Span, SPAN_FIELDS, OnConflict.IGNORE),
        update_trace=(
            f"UPDATE {traces} SET "
            f"{column(Trace, 'started_at')} = "
            f"(SELECT MIN({qualified(Span, 'started_at')}) {spans_of_trace}), "
            f"{column(Trace, 'ended_at')} = "
            f"(SELECT MAX({qualified(Span, 'ended_at')}) {spans_of_trace}), "
            f"{column(Trace, 'total_tokens')} = "
            f"COALESCE((SELECT SUM({qualified(Span, 'total_tokens')}) {spans_of_trace}), 0), "
            f"{column(Trace, 'active_seconds')} = (SELECT SUM({_seconds()}) {spans_of_trace} "
            f"AND {qualified(Span, 'parent_id')} IS NULL), "
            f"{column(Trace, 'updated')} = %s, "
            f"{column(Trace, 'status')} = {status} "
            f"WHERE {trace_id} = %s"
        ),
        update_trace_params=status_params,
        runs=f"SELECT {run_pk}, {qualified(AgentRun, 'trace_id')} FROM {runs} WHERE ",
        runs_by_trace=f"{qualified(AgentRun, 'trace_id')} IN ({{keys}})",
        runs_by_pk=f"{run_pk} IN ({{keys}})",
        run_pk_range=connection.ops.integer_field_range(AgentRun._meta.pk.get_internal_type()),
        announce=(
            f"SELECT {trace_id}, {qualified(Trace, 'status')}, "
            f"COUNT({qualified(Span, Span._meta.pk.name)}) "
            f"FROM {traces} LEFT JOIN {spans} ON {qualified(Span, 'trace')} = {trace_id} "
            f"WHERE {trace_id} IN ({{keys}}) GROUP BY {trace_id}, {qualified(Trace, 'status')}"
        ),
        follow_run=(
            f"INSERT INTO {traces} ({_columns(Trace, TRACE_FIELDS)}) "
            f"VALUES ({placeholders(len(TRACE_FIELDS))}) "
            f"ON CONFLICT ({column(Trace, 'trace_id')}) "
            f"DO UPDATE SET {column(Trace, 'status')} = {followed}, "
            f"{column(Trace, 'outcome')} = EXCLUDED.{column(Trace, 'outcome')}, "
            f"{column(Trace, 'outcome_reason')} = EXCLUDED.{column(Trace, 'outcome_reason')}"
        ),
        follow_run_params=followed_params,
    )


def new_trace(
    trace_id: str,
    run_id: int | None,
    now: Any,
    workflow_name: str = "",
    group_id: str = "",
    metadata: dict[str, Any] | None = None,
    status: str = TraceStatus.RUNNING.value,
    outcome: tuple[str, str] = ("", ""),
) -> tuple[Any, ...]:
    """A new `Trace` row, in `TRACE_FIELDS` order, with the model's defaults."""
    return (
        trace_id,
        workflow_name,
        group_id,
        connection.ops.adapt_json_value({} if metadata is None else metadata, None),
        None,
        None,
        status,
        0,
        None,
        *outcome,
        run_id,
        now,
        now,
    )
