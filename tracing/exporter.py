"""The SDK's traces and spans, stored in the database.

The SDK's own `BatchTraceProcessor` queues what the runs emit and hands it, in batches, from
its own thread, to `DatabaseExporter.export`, which masks it (`tracing.redaction`) and writes
each batch in one transaction with a bounded number of queries:

- traces are upserted by trace id (workflow, group, metadata, run; never the status, which
  the engine owns);
- a span whose trace is unknown gets a placeholder trace row first: a resumed run's spans
  arrive after its trace ended, and in another process the trace is not announced again;
- spans are inserted in bulk, duplicates ignored;
- the touched traces' start, end and token total are recomputed from their spans, in one
  UPDATE statement that also marks a trace with an error span as failed;
- once committed, each touched trace is told to the listeners (`on_stored`): the engine
  registers one at startup that publishes `events.TraceUpdated`, so open trace pages grow
  while the run executes. The exporter itself knows nothing of the channel layer.

The rows are made from the SDK's dicts by `tracing.rows` (pure functions); this module writes
them. Rows are tuples written with one `executemany` per statement, in SQL made once from the
models (`tracing.sql`: `bulk_create` prepared each field of each row, which cost more than the
inserts), and masked by one `redaction.Cleaner` per batch, which cleans each distinct string
once.

`export` never raises and never runs on an event loop. `install()` registers the processor
once, at startup (`TracingConfig.ready`), and beside it, when `AGENTSITE_OTLP_ENDPOINT` is set,
a second one whose `OtlpExporter` forwards the same spans, masked the same way, to an
OpenTelemetry collector (`tracing.otlp`).
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from agents.tracing import Span as SDKSpan
from agents.tracing import Trace as SDKTrace
from agents.tracing import add_trace_processor, get_trace_provider, set_trace_processors
from agents.tracing.processor_interface import TracingExporter, TracingProcessor
from agents.tracing.processors import BatchTraceProcessor, default_processor
from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    transaction,
)
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from agentsite.db.sql import placeholders
from tracing import forwarding as forwarding_module
from tracing import otlp, redaction
from tracing.models import Trace
from tracing.rows import (
    SpanInsert,
    TraceInsert,
    run_id_of,
    span_row,
    trace_agent,
    trace_row,
    with_response_model,
    with_tool_output,
    with_waiting_mark,
)
from tracing.sql import new_trace, statements

logger = logging.getLogger(__name__)

# Spans per export call. The SDK's default (128) costs a transaction per 128 spans; larger
# batches store a burst several times faster and still keep a batch's memory small.
MAX_BATCH_SIZE = 512


@dataclass
class ExportStats:
    """What this exporter stored and lost since it started (failures are logged too)."""

    batches: int = 0
    traces: int = 0
    spans: int = 0
    failures: int = 0
    dropped_items: int = 0


@dataclass
class _Batch:
    traces: dict[str, TraceInsert] = field(default_factory=dict)
    run_ids: dict[str, int] = field(default_factory=dict)  # trace id -> metadata run_id
    spans: dict[str, SpanInsert] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.traces) + len(self.spans)

    def trace_ids(self) -> set[str]:
        return set(self.traces) | {span.trace_id for span in self.spans.values()}


class DatabaseExporter(TracingExporter):
    """Writes what `BatchTraceProcessor` hands it into `Trace` and `Span` rows."""

    def __init__(self) -> None:
        self.stats = ExportStats()

    def export(self, items: list[SDKTrace | SDKSpan[Any]]) -> None:
        try:
            # This runs on the processor's thread, which keeps its connection between
            # batches: drop it when it broke or outlived CONN_MAX_AGE, as a request would.
            if not connection.in_atomic_block:
                close_old_connections()
            batch = self._parse(items)
            if batch:
                self._store(batch)
        except Exception:  # never let a trace problem reach the SDK or a run
            self._failed(len(items))
            logger.exception("Tracing: a batch of %d item(s) was not stored", len(items))
        finally:
            # With a pool (CONN_MAX_AGE 0) this gives the connection back between batches.
            if not connection.in_atomic_block:
                close_old_connections()

    # --- reading the SDK's items ----------------------------------------------------------

    def _parse(self, items: list[SDKTrace | SDKSpan[Any]]) -> _Batch:
        batch = _Batch()
        # One per batch: each distinct string of the batch is masked once.
        cleaner = redaction.Cleaner()
        sensitive = bool(getattr(settings, "AGENTSITE_TRACE_SENSITIVE_DATA", True))
        for item in items:
            try:
                exported = item.export()
                if not exported:
                    continue
                if exported.get("object") == "trace":
                    trace = trace_row(exported, cleaner=cleaner)
                    batch.traces[trace.trace_id] = trace
                    run_id = run_id_of(exported.get("metadata"))
                    if run_id is not None:
                        batch.run_ids[trace.trace_id] = run_id
                else:
                    exported = with_response_model(item, exported)
                    exported = with_waiting_mark(with_tool_output(item, exported))
                    span = span_row(exported, cleaner=cleaner, sensitive=sensitive)
                    batch.spans[span.span_id] = span
            except Exception as exc:
                self._failed(1)
                logger.warning("Tracing: an item could not be read and was dropped: %r", exc)
        return batch

    # --- writing --------------------------------------------------------------------------

    def _store(self, batch: _Batch) -> None:
        try:
            _write(batch)
        except (OperationalError, InterfaceError) as exc:
            # The database is unreachable or busy: item by item would fail the same way.
            self._failed(len(batch))
            logger.error("Tracing: %d item(s) dropped, the database failed: %r", len(batch), exc)
            return
        except DatabaseError as exc:
            logger.warning("Tracing: a batch failed (%r); storing its items one by one", exc)
            self._store_one_by_one(batch)
            return
        self.stats.batches += 1
        self.stats.traces += len(batch.traces)
        self.stats.spans += len(batch.spans)
        _announce(batch.trace_ids())

    def _store_one_by_one(self, batch: _Batch) -> None:
        singles = [
            _Batch(traces={key: trace}, run_ids=_only(batch.run_ids, key))
            for key, trace in batch.traces.items()
        ] + [_Batch(spans={key: span}) for key, span in batch.spans.items()]
        for single in singles:
            try:
                _write(single)
            except Exception as exc:
                self._failed(1)
                logger.warning("Tracing: an item was dropped: %r", exc)
            else:
                self.stats.traces += len(single.traces)
                self.stats.spans += len(single.spans)
        self.stats.batches += 1
        _announce(batch.trace_ids())

    def _failed(self, count: int) -> None:
        self.stats.failures += 1
        self.stats.dropped_items += count


class OtlpExporter(DatabaseExporter):
    """Hands what its `BatchTraceProcessor` gives it to the process's OTLP forwarding
    (`tracing.forwarding`: OpenTelemetry's batch processor and exporter).

    It reads the SDK's items with the database exporter's own `_parse` (masked by
    `tracing.redaction`, inputs and outputs dropped with AGENTSITE_TRACE_SENSITIVE_DATA off),
    so what leaves the site is what the database holds; it converts (`tracing.otlp`) rather
    than stores. A trace item carries no span: it is remembered (a bounded few) so that its
    spans, which may come in later batches, name its conversation and run. `export` never
    raises and never waits for the collector.
    """

    REMEMBERED_TRACES = 1024

    def __init__(
        self, forwarding: forwarding_module.Forwarding, project: str = "agentsite"
    ) -> None:
        super().__init__()
        self.forwarding = forwarding
        self.project = project
        self._traces: OrderedDict[str, TraceInsert] = OrderedDict()

    def export(self, items: list[SDKTrace | SDKSpan[Any]]) -> None:
        try:
            batch = self._parse(items)
            for trace in batch.traces.values():
                self._traces[trace.trace_id] = trace
                self._traces.move_to_end(trace.trace_id)
            while len(self._traces) > self.REMEMBERED_TRACES:
                self._traces.popitem(last=False)
            if not batch.spans:
                return
            spans = otlp.readable_spans(batch.spans.values(), self._traces, project=self.project)
            self.forwarding.hand(spans)
            self.stats.batches += 1
            self.stats.spans += len(spans)
            if self.forwarding.forwarder.transport.stopping:
                # At exit, after the forwarding's own flush: these are the last.
                self.forwarding.flush(2.0)
        except Exception:
            self._failed(len(items))
            logger.exception("[non-fatal] OpenTelemetry: a batch of %d item(s) failed", len(items))

    def _request_shutdown(self) -> None:
        """Called by `BatchTraceProcessor.shutdown(timeout)` (the SDK's exit hook, within its
        budget): what is left is tried once per batch, without retries."""
        self.forwarding.forwarder.transport.stopping = True


class StoredTrace(NamedTuple):
    """What a listener hears of a trace a batch touched, once the batch is committed."""

    trace_id: str
    status: str
    span_count: int


StoredListener = Callable[[list[StoredTrace]], object]
_listeners: list[StoredListener] = []


def on_stored(listener: StoredListener) -> None:
    """Call `listener` (from the exporter's thread, after commit) with the traces each batch
    touched. Registered once at startup by the composition root (`engine.apps`)."""
    if listener not in _listeners:
        _listeners.append(listener)


# Set once the process exits: what is flushed then is stored, but nobody is told. The pages
# of a dying process are gone, and publishing after the interpreter began to shut down fails
# ("cannot schedule new futures after interpreter shutdown").
_exiting = threading.Event()


def _flush_at_exit(processor: BatchTraceProcessor) -> None:
    _exiting.set()
    processor.force_flush()


def _tell(stored: list[StoredTrace]) -> None:
    if _exiting.is_set():
        return
    for listener in list(_listeners):
        try:
            listener(stored)
        except Exception:
            logger.exception("[non-fatal] Tracing: a listener of stored traces failed")


def _announce(trace_ids: set[str]) -> None:
    """Tell the listeners which traces were stored, once what was written is committed. A
    lost announcement costs nothing: pages re-read the trace when their socket reconnects."""
    if not trace_ids or not _listeners:
        return
    try:
        keys = sorted(trace_ids)
        with connection.cursor() as cursor:
            cursor.execute(statements().announce.format(keys=placeholders(len(keys))), keys)
            rows = cursor.fetchall()
        stored = [StoredTrace(trace_id, status, count) for trace_id, status, count in rows]
        transaction.on_commit(lambda: _tell(stored))
    except Exception:
        logger.exception("Tracing: the stored traces could not be announced")


def _only(mapping: dict[str, int], key: str) -> dict[str, int]:
    return {key: mapping[key]} if key in mapping else {}


def _write(batch: _Batch) -> None:
    """One transaction, a query per table: rows go as tuples, in one `executemany` each, with
    SQL made once from the models (`tracing.sql`); `bulk_create`'s preparation of each field
    of each row cost more than the inserts."""
    spans = batch.spans.values()
    span_trace_ids = {span.trace_id for span in spans}
    sql = statements()
    ops = connection.ops
    with transaction.atomic(), connection.cursor() as cursor:
        runs = _runs_of(cursor, set(batch.traces) | span_trace_ids, set(batch.run_ids.values()))
        now = ops.adapt_datetimefield_value(timezone.now())
        if batch.traces:
            cursor.executemany(
                sql.upsert_traces,
                [
                    new_trace(
                        trace.trace_id,
                        runs.by_trace.get(trace.trace_id)
                        or runs.existing(batch.run_ids.get(trace.trace_id)),
                        now,
                        trace.workflow_name,
                        trace.group_id,
                        trace.metadata,
                    )
                    # In one order everywhere, so that two processes never lock rows crosswise.
                    for trace in sorted(batch.traces.values(), key=_by_trace_id)
                ],
            )
        unknown = span_trace_ids - set(batch.traces)
        if unknown:
            cursor.executemany(
                sql.insert_placeholders,
                [new_trace(key, runs.by_trace.get(key), now) for key in sorted(unknown)],
            )
        if not spans:
            return
        adapt_json = ops.adapt_json_value
        adapt_time = _time_adapter()
        agents = _agents_of(batch, {span.trace_id for span in spans if span.model})
        _insert_spans(
            cursor,
            sql.insert_spans,
            [
                (
                    span.span_id,
                    span.trace_id,
                    span.parent_id,
                    span.span_type,
                    span.name,
                    adapt_time(span.started_at),
                    adapt_time(span.ended_at),
                    adapt_json(span.span_data, None),
                    None if span.error is None else adapt_json(span.error, None),
                    span.total_tokens,
                    span.model,
                    span.input_tokens,
                    span.cached_tokens,
                    span.output_tokens,
                    agents.get(span.trace_id, "") if span.model else "",
                )
                for span in spans
            ],
        )
        # Each trace's first start, last end and token total, from all its spans, and its
        # status by the rule: a span with an error fails the trace; a root span ends a
        # foreign trace still running (a run's trace follows its run, by the engine).
        cursor.executemany(
            sql.update_trace,
            [sql.update_trace_row(now, key) for key in sorted(span_trace_ids)],
        )


def _agents_of(batch: _Batch, trace_ids: set[str]) -> dict[str, str]:
    """The agent of each trace of the batch's model calls: from the batch's own traces (the
    SDK exports a trace when it starts, so usually in the batch of its first spans), else
    from the stored rows, in one query (a run resumed in another process, a late batch)."""
    agents = {
        key: trace_agent(batch.traces[key].metadata, batch.traces[key].workflow_name)
        for key in trace_ids
        if key in batch.traces
    }
    missing = trace_ids - set(agents)
    if missing:
        stored = Trace.objects.filter(trace_id__in=missing).values_list(
            "trace_id", "metadata", "workflow_name"
        )
        agents.update((key, trace_agent(metadata, name)) for key, metadata, name in stored)
    return agents


def _time_adapter() -> Callable[[datetime | None], Any]:
    """`connection.ops.adapt_datetimefield_value` for the aware datetimes of `parse_time`,
    cheaper. On SQLite that is, once its checks passed, the time in the connection's time
    zone as text without an offset; for a UTC time to a UTC connection (the SDK's times,
    Django's default), its `isoformat(" ")` less "+00:00". A test holds it to Django's."""
    if connection.vendor != "sqlite" or not settings.USE_TZ:
        return connection.ops.adapt_datetimefield_value
    zone = connection.timezone

    def adapt(value: datetime | None) -> str | None:
        if value is None:
            return None
        if value.tzinfo is UTC and zone is UTC:
            return value.isoformat(" ")[:-6]
        return str(value.astimezone(zone).replace(tzinfo=None))

    return adapt


def _by_trace_id(trace: TraceInsert) -> str:
    return trace.trace_id


def _insert_spans(cursor: CursorWrapper, sql: str, rows: list[tuple[Any, ...]]) -> None:
    cursor.executemany(sql, rows)


@dataclass
class _Runs:
    by_trace: dict[str, int]
    pks: set[int]

    def existing(self, run_id: int | None) -> int | None:
        return run_id if run_id in self.pks else None


def _runs_of(cursor: CursorWrapper, trace_ids: set[str], run_ids: set[int]) -> _Runs:
    """The runs these traces belong to: by the trace id the engine chose, else by the
    `run_id` in the trace's metadata (only if that run exists: a foreign key must hold)."""
    sql = statements()
    # A run id out of the primary key's range names no run (and SQLite refuses it).
    low, high = sql.run_pk_range
    pk_keys = sorted(
        pk for pk in run_ids if (low is None or pk >= low) and (high is None or pk <= high)
    )
    trace_keys = sorted(trace_ids)
    conditions = [
        template.format(keys=placeholders(len(keys)))
        for template, keys in ((sql.runs_by_trace, trace_keys), (sql.runs_by_pk, pk_keys))
        if keys
    ]
    if not conditions:
        return _Runs({}, set())
    cursor.execute(sql.runs + " OR ".join(conditions), [*trace_keys, *pk_keys])
    rows = cursor.fetchall()
    by_trace: dict[str, int] = {}
    pks: set[int] = set()
    for pk, trace_id in rows:
        pks.add(pk)
        if trace_id in trace_ids:
            by_trace[trace_id] = pk
    return _Runs(by_trace, pks)


# --- installing -----------------------------------------------------------------------------

_installed: BatchTraceProcessor | None = None
_forwarding: BatchTraceProcessor | None = None
_install_lock = threading.Lock()


def make_processor(exporter: TracingExporter | None = None) -> BatchTraceProcessor:
    """The SDK's batch processor around our exporter, configured from the settings."""
    return BatchTraceProcessor(
        exporter or DatabaseExporter(),
        max_queue_size=settings.AGENTSITE_TRACE_QUEUE_SIZE,
        max_batch_size=MAX_BATCH_SIZE,
        schedule_delay=settings.AGENTSITE_TRACE_BATCH_DELAY,
    )


def make_forwarding_processor() -> BatchTraceProcessor | None:
    """The processor that forwards spans to `AGENTSITE_OTLP_ENDPOINT`, or None when unset."""
    forwarding = forwarding_module.from_settings()
    if forwarding is None:
        return None
    return make_processor(OtlpExporter(forwarding, settings.AGENTSITE_OTLP_SERVICE_NAME))


def install() -> BatchTraceProcessor | None:
    """Register the database processor with the SDK, once per process, and the OTLP
    forwarding one after it when `AGENTSITE_OTLP_ENDPOINT` is set.

    When OpenAI itself serves the model (`OPENAI_API_KEY` without `OPENAI_BASE_URL`, and
    `AGENTSITE_OPENAI_TRACE_EXPORT` on) they are added beside the SDK's default processor, so
    OpenAI's trace dashboard keeps working. Otherwise that uploader can only log warnings (or
    send another server's key to OpenAI), so it is removed; any processor an integration
    registered (OpenTelemetry, Logfire, ...) stays.

    The SDK flushes its processors at exit (an `atexit` hook registered with its provider),
    but within one 5-second budget shared by all of them in order of registration, so a slow
    upload to OpenAI could use it all up. Our queue is flushed by an `atexit` hook of its own,
    registered after the SDK's, so it runs first. The forwarding queue is left to the SDK's
    budget: an unreachable collector must not hold up a process's exit.
    """
    global _installed, _forwarding
    with _install_lock:
        if _installed is not None or not settings.AGENTSITE_TRACING:
            return _installed
        processor = make_processor()
        forwarding = make_forwarding_processor()
        ours = [processor] if forwarding is None else [processor, forwarding]
        if uploads_traces_to_openai():
            for each in ours:
                add_trace_processor(each)
        else:
            set_trace_processors([*_other_processors(), *ours])
        atexit.register(_flush_at_exit, processor)
        _installed = processor
        _forwarding = forwarding
        logger.debug("Tracing: runs are stored in the database")
        if forwarding is not None:
            logger.info(
                "Tracing: spans are forwarded to %s",
                forwarding_module.shown_endpoint(settings.AGENTSITE_OTLP_ENDPOINT),
            )
        return processor


def uploads_traces_to_openai() -> bool:
    """Whether the SDK's uploader to OpenAI's trace dashboard should stay: only when OpenAI
    itself serves the model (a key for another server is no key for OpenAI's dashboard)."""
    return bool(
        settings.OPENAI_API_KEY.strip()
        and not settings.OPENAI_BASE_URL.strip()
        and settings.AGENTSITE_OPENAI_TRACE_EXPORT
    )


def installed() -> BatchTraceProcessor | None:
    return _installed


def forwarding() -> BatchTraceProcessor | None:
    """The OTLP forwarding processor `install()` registered, if any."""
    return _forwarding


def _other_processors() -> list[TracingProcessor]:
    """The registered processors, less the SDK's default OpenAI uploader."""
    provider = get_trace_provider()
    # The SDK has no public getter for its processors; without one, keep none.
    registered = getattr(getattr(provider, "_multi_processor", None), "_processors", ())
    default = default_processor()
    return [processor for processor in registered if processor is not default]
