"""The exporter: what the SDK's BatchTraceProcessor hands it is stored, in bulk, whatever comes."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from agents.tracing import (
    CustomSpanData,
    FunctionSpanData,
    GenerationSpanData,
    TracingProcessor,
    get_trace_provider,
    set_trace_processors,
)
from agents.tracing import Span as SDKSpan
from agents.tracing import Trace as SDKTrace
from agents.tracing.processors import default_processor
from django.db import DataError, OperationalError, connection

from engine.models import RunStatus
from tests.factories import make_conversation
from tests.live import ROOT
from tests.live import test_database_url as database_url
from tracing import exporter as exporter_module
from tracing import rows
from tracing import sql as tracing_sql
from tracing.exporter import DatabaseExporter, make_processor
from tracing.models import Span, Trace, TraceStatus

pytestmark = pytest.mark.django_db(transaction=True)


def sdk_trace(trace_id: str | None = None, **kwargs: Any) -> SDKTrace:
    kwargs.setdefault("name", "workflow")
    return get_trace_provider().create_trace(trace_id=trace_id, **kwargs)


def sdk_span(trace: SDKTrace | SDKSpan[Any], data: Any = None) -> SDKSpan[Any]:
    """A finished span, as the SDK hands it over on `on_span_end`."""
    span = get_trace_provider().create_span(data or CustomSpanData("step", {}), parent=trace)
    span.start()
    span.finish()
    return span


def generation(tokens: dict[str, int]) -> GenerationSpanData:
    return GenerationSpanData(input=[], output=[], model="m", usage=tokens)


class CountingExporter(DatabaseExporter):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def export(self, items: list[Any]) -> None:
        self.calls.append(len(items))
        super().export(items)


def test_a_burst_of_ten_thousand_spans_is_stored_completely_in_batches(settings: Any) -> None:
    settings.AGENTSITE_TRACE_BATCH_DELAY = 0.2
    exporter = CountingExporter()
    processor = make_processor(exporter)
    set_trace_processors([processor])
    traces = [sdk_trace(name=f"burst {n}") for n in range(100)]
    try:
        started = time.perf_counter()
        for trace in traces:
            trace.start()
            root = get_trace_provider().create_span(CustomSpanData("root", {}), parent=trace)
            root.start()
            for _ in range(49):
                sdk_span(root, generation({"input_tokens": 3, "output_tokens": 2}))
            for _ in range(50):
                sdk_span(root)
            root.finish()
            trace.finish()
        emitted = time.perf_counter()
        # Stored by the processor's own thread, on its own schedule, as in production.
        deadline = time.monotonic() + 60
        while exporter.stats.spans < 10_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        stored = time.perf_counter()
    finally:
        set_trace_processors([])
        processor.shutdown()

    ids = [trace.trace_id for trace in traces]
    assert Span.objects.filter(trace_id__in=ids).count() == 10_000
    assert exporter.stats.dropped_items == 0
    assert 1 < len(exporter.calls) < 10_000
    assert max(exporter.calls) <= exporter_module.MAX_BATCH_SIZE
    assert set(Trace.objects.filter(trace_id__in=ids).values_list("total_tokens", flat=True)) == {
        49 * 5
    }
    print(
        f"\n10,000 spans: emitted in {emitted - started:.2f} s, stored after "
        f"{stored - started:.2f} s in {len(exporter.calls)} exports "
        f"({10_000 / (stored - started):,.0f} spans/s end to end, "
        f"{10_000 / (stored - emitted):,.0f} spans/s once emitted)"
    )


def test_it_stores_spans_that_arrive_after_their_trace_ended() -> None:
    exporter = DatabaseExporter()
    trace = sdk_trace(group_id="conv_1", metadata={"k": "v"})
    trace.start()
    first = sdk_span(trace)
    trace.finish()
    exporter.export([trace, first])

    time.sleep(0.01)
    late = [sdk_span(trace, generation({"input_tokens": 7, "output_tokens": 3}))]
    exporter.export(late)

    row = Trace.objects.get(trace_id=trace.trace_id)
    assert row.spans.count() == 2
    assert row.workflow_name == "workflow"
    assert row.group_id == "conv_1"
    assert row.total_tokens == 10
    assert row.started_at is not None and row.ended_at is not None
    assert row.ended_at == Span.objects.get(span_id=late[0].span_id).ended_at


def test_a_span_of_an_unknown_trace_gets_a_placeholder_that_the_trace_fills_in_later() -> None:
    exporter = DatabaseExporter()
    trace = sdk_trace(group_id="conv_2", metadata={"run_id": "999999"})
    exporter.export([sdk_span(trace)])

    placeholder = Trace.objects.get(trace_id=trace.trace_id)
    assert (placeholder.workflow_name, placeholder.group_id, placeholder.run_id) == ("", "", None)
    Trace.objects.filter(pk=placeholder.pk).update(status=TraceStatus.WAITING)  # as the engine

    exporter.export([trace])  # in another process a resumed run announces its trace again

    row = Trace.objects.get(trace_id=trace.trace_id)
    assert (row.workflow_name, row.group_id) == ("workflow", "conv_2")
    assert row.status == TraceStatus.WAITING  # the engine's, not overwritten
    assert row.run_id is None  # run 999999 does not exist: no broken foreign key
    assert row.spans.count() == 1


def test_it_links_the_run_by_the_trace_id_the_engine_chose() -> None:
    from engine.models import AgentRun

    run = AgentRun.objects.create(
        conversation=make_conversation(),
        agent_name="support",
        input="hi",
        trace_id="trace_" + "a" * 32,
    )
    exporter = DatabaseExporter()
    exporter.export([sdk_span(sdk_trace(trace_id=run.trace_id))])
    assert Trace.objects.get(trace_id=run.trace_id).run == run
    assert run.status == RunStatus.QUEUED


def test_an_error_span_marks_its_trace_failed_and_a_root_span_ends_a_foreign_trace() -> None:
    exporter = DatabaseExporter()
    failing, fine = sdk_trace(), sdk_trace()
    broken = get_trace_provider().create_span(CustomSpanData("x", {}), parent=failing)
    broken.start()
    broken.set_error({"message": "boom for jane@example.com", "data": None})
    broken.finish()
    exporter.export([failing, fine, broken, sdk_span(fine)])

    assert Trace.objects.get(trace_id=failing.trace_id).status == TraceStatus.ERROR
    assert Trace.objects.get(trace_id=fine.trace_id).status == TraceStatus.OK
    assert Span.objects.get(span_id=broken.span_id).error == {
        "message": "boom for [email]",
        "data": None,
    }
    for row in Trace.objects.filter(trace_id__in=[failing.trace_id, fine.trace_id]):
        assert row.status == row.derived_status()


def test_it_names_and_types_spans_like_the_sdk_means_them() -> None:
    from agents.tracing import AgentSpanData, HandoffSpanData, TaskSpanData, TurnSpanData

    trace = sdk_trace()
    spans = [
        sdk_span(trace, TaskSpanData(name="agentsite: Support desk")),
        sdk_span(trace, AgentSpanData(name="Support desk")),
        sdk_span(trace, TurnSpanData(turn=2, agent_name="Billing")),
        sdk_span(trace, generation({"input_tokens": 1, "output_tokens": 1})),
        sdk_span(trace, FunctionSpanData(name="lookup_order", input='{"order_id":7}', output="ok")),
        sdk_span(trace, HandoffSpanData(from_agent="Support desk", to_agent="Billing")),
        sdk_span(trace, CustomSpanData("weather_lookup", {"city": "Rome"})),
    ]
    DatabaseExporter().export([trace, *spans])

    stored = {
        s.span_id: (s.span_type, s.name) for s in Span.objects.filter(trace_id=trace.trace_id)
    }
    assert [stored[s.span_id] for s in spans] == [
        ("task", "agentsite: Support desk"),
        ("agent", "Support desk"),
        ("turn", "turn 2: Billing"),
        ("generation", "m"),
        ("function", "lookup_order"),
        ("handoff", "Support desk → Billing"),
        ("custom", "weather_lookup"),
    ]


def test_it_drops_model_and_tool_inputs_and_outputs_when_sensitive_data_is_off(
    settings: Any,
) -> None:
    settings.AGENTSITE_TRACE_SENSITIVE_DATA = False
    trace = sdk_trace()
    function = sdk_span(
        trace, FunctionSpanData(name="cancel_order", input="{}", output="A reviewer said no")
    )
    DatabaseExporter().export([trace, function])
    data = Span.objects.get(span_id=function.span_id).span_data
    assert (data["name"], data["input"], data["output"]) == ("cancel_order", None, None)


def test_it_stores_a_span_whose_data_json_cannot_hold() -> None:
    trace = sdk_trace()
    odd = sdk_span(trace, CustomSpanData("odd", {"obj": object(), "nan": float("nan"), 3: b"x"}))
    exporter = DatabaseExporter()
    exporter.export([trace, odd])
    data = Span.objects.get(span_id=odd.span_id).span_data["data"]
    assert data["nan"] is None
    assert data["obj"].startswith("<object object at")
    assert data["3"] == "b'x'"
    assert exporter.stats.dropped_items == 0


def test_it_never_raises_when_an_item_cannot_be_read(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def export(self) -> dict[str, Any]:
            raise RuntimeError("unreadable")

    trace = sdk_trace()
    exporter = DatabaseExporter()
    with caplog.at_level(logging.WARNING, logger="tracing.exporter"):
        exporter.export([trace, Broken(), sdk_span(trace)])
    assert Span.objects.filter(trace_id=trace.trace_id).count() == 1
    assert exporter.stats.dropped_items == 1
    assert "unreadable" in caplog.text


def test_it_never_raises_when_the_database_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("database is locked")

    monkeypatch.setattr(exporter_module, "_insert_spans", down)  # after the trace's upsert
    trace = sdk_trace()
    exporter = DatabaseExporter()
    with caplog.at_level(logging.ERROR, logger="tracing.exporter"):
        exporter.export([trace, sdk_span(trace), sdk_span(trace)])
    assert exporter.stats.failures == 1
    assert exporter.stats.dropped_items == 3
    assert "database is locked" in caplog.text
    # The batch was one transaction: not even its trace is half-stored.
    assert not Trace.objects.filter(trace_id=trace.trace_id).exists()


def test_one_bad_span_does_not_take_its_batch_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = sdk_trace()
    good, bad = sdk_span(trace), sdk_span(trace)
    real_write = exporter_module._write

    def write(batch: Any) -> None:
        if bad.span_id in batch.spans:
            raise DataError("value too long")
        real_write(batch)

    monkeypatch.setattr(exporter_module, "_write", write)
    exporter = DatabaseExporter()
    exporter.export([trace, good, bad])
    stored = Span.objects.filter(trace_id=trace.trace_id).values_list("span_id", flat=True)
    assert list(stored) == [good.span_id]
    assert Trace.objects.filter(trace_id=trace.trace_id).exists()
    assert exporter.stats.dropped_items == 1


def test_it_stores_a_span_delivered_twice_once() -> None:
    trace = sdk_trace()
    span = sdk_span(trace, generation({"total_tokens": 12}))
    exporter = DatabaseExporter()
    exporter.export([trace, span])
    exporter.export([span])
    assert Span.objects.filter(span_id=span.span_id).count() == 1
    assert Trace.objects.get(trace_id=trace.trace_id).total_tokens == 12


# --- rows as the ORM would write them -------------------------------------------------------
# The exporter writes tuples with SQL of its own; what lands in the columns must be what
# `bulk_create` would have put there, on SQLite and PostgreSQL alike.


class Exported:
    """An item as the SDK hands it over, with the dict its `export()` returns."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def export(self) -> dict[str, Any]:
        return self.data


def raw_columns(model: type[Any], key: str, value: str, names: list[str]) -> tuple[Any, ...]:
    """The stored values as text (no converter between them and the test)."""
    table = model._meta.db_table
    columns = [model._meta.get_field(name).column for name in names]
    select = ", ".join(f"CAST({column} AS TEXT)" for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {select} FROM {table} WHERE {key} = %s", [value])
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


def test_the_rows_hold_every_field_of_the_models() -> None:
    for model, names in (
        (Trace, tracing_sql.TRACE_FIELDS),
        (Span, tracing_sql.SPAN_FIELDS),
    ):
        own = [f.name for f in model._meta.concrete_fields if not f.primary_key]
        assert sorted(names) == sorted(own), model


@pytest.mark.parametrize(
    ("started", "ended"),
    [
        ("2025-06-01T12:00:00.123456+00:00", "2025-06-01T12:00:01.000001+00:00"),
        ("2025-06-01T12:00:00+00:00", "2025-06-01T12:00:01Z"),  # no microseconds
        ("2025-06-01T14:00:00.5+02:00", "2025-06-01T12:00:02"),  # an offset; a naive time
        (None, "not a time"),
    ],
)
def test_it_stores_spans_and_traces_as_bulk_create_would(started: Any, ended: Any) -> None:
    trace_id = "trace_" + "c" * 32
    trace = {
        "object": "trace",
        "id": trace_id,
        "workflow_name": "wf jane@example.com",
        "group_id": "conv_9",
        "metadata": {"k": "ünï", "n": 1.5},
    }
    span = {
        "object": "trace.span",
        "id": "span_" + "d" * 24,
        "trace_id": trace_id,
        "parent_id": "span_parent",
        "started_at": started,
        "ended_at": ended,
        "span_data": {
            "type": "generation",
            "input": [{"role": "user", "content": "mail jane@example.com, ü\u2603"}],
            "model": "m",
            "usage": {"input_tokens": 3, "output_tokens": 4},
        },
        "error": {"message": "boom", "data": {"x": [1, None]}},
    }
    DatabaseExporter().export([Exported(trace), Exported(span)])

    # The same rows through the ORM, under other ids.
    trace_row = rows.trace_row({**trace, "id": "trace_orm"})
    span_row = rows.span_row({**span, "id": "span_orm", "trace_id": "trace_orm"})
    Trace.objects.bulk_create([Trace(**trace_row._asdict())])
    # The agent of a model call is its trace's, filled in when the batch is written.
    agent = rows.trace_agent(trace_row.metadata, trace_row.workflow_name)
    Span.objects.bulk_create([Span(**{**span_row._asdict(), "agent": agent})])

    span_names = [n for n in tracing_sql.SPAN_FIELDS if n not in ("span_id", "trace")]
    assert raw_columns(Span, "span_id", span["id"], span_names) == raw_columns(
        Span, "span_id", "span_orm", span_names
    )
    trace_names = ["workflow_name", "group_id", "metadata", "run"]
    assert raw_columns(Trace, "trace_id", trace_id, trace_names) == raw_columns(
        Trace, "trace_id", "trace_orm", trace_names
    )
    stored = Trace.objects.get(trace_id=trace_id)
    assert (stored.total_tokens, stored.status) == (7, TraceStatus.ERROR)
    assert stored.workflow_name == "wf [email]"


def test_its_times_are_adapted_as_django_adapts_them() -> None:
    adapt = exporter_module._time_adapter()
    for text in (
        "2025-06-01T12:00:00.123456+00:00",
        "2025-06-01T12:00:00+00:00",
        "2025-06-01T12:00:00.000000+00:00",
        "2025-06-01T12:00:00Z",
        "2025-06-01T23:30:00.5-05:30",
        "0001-01-01T00:00:00+00:00",
        "2025-06-01T12:00:00",
        None,
    ):
        value = rows.parse_time(text)
        assert adapt(value) == connection.ops.adapt_datetimefield_value(value), text


def test_a_root_span_ends_only_a_foreign_running_trace_and_an_error_wins() -> None:
    from engine.models import AgentRun

    run = AgentRun.objects.create(
        conversation=make_conversation(), agent_name="support", input="hi", trace_id="trace_run"
    )
    ours, waiting, failing = sdk_trace(trace_id=run.trace_id), sdk_trace(), sdk_trace()
    exporter = DatabaseExporter()
    exporter.export([waiting])
    Trace.objects.filter(trace_id=waiting.trace_id).update(status=TraceStatus.WAITING)
    broken = get_trace_provider().create_span(CustomSpanData("root", {}), parent=failing)
    broken.start()
    broken.set_error({"message": "boom", "data": None})
    broken.finish()

    exporter.export([ours, sdk_span(ours), sdk_span(waiting), failing, broken])

    statuses = dict(Trace.objects.values_list("trace_id", "status"))
    assert statuses[ours.trace_id] == TraceStatus.RUNNING  # a run's: follows its run
    assert statuses[waiting.trace_id] == TraceStatus.WAITING
    assert statuses[failing.trace_id] == TraceStatus.ERROR


def test_a_run_id_no_run_can_have_does_not_cost_the_batch() -> None:
    trace = sdk_trace(metadata={"run_id": str(10**30)})
    exporter = DatabaseExporter()
    exporter.export([trace, sdk_span(trace)])
    assert exporter.stats.dropped_items == 0
    assert Trace.objects.get(trace_id=trace.trace_id).run_id is None


def test_it_writes_a_batch_in_a_bounded_number_of_queries(
    django_assert_max_num_queries: Any,
) -> None:
    traces = [sdk_trace() for _ in range(5)]
    items: list[Any] = [*traces, sdk_span(sdk_trace())]  # and a span of an unknown trace
    for trace in traces:
        items += [sdk_span(trace, generation({"total_tokens": 2})) for _ in range(20)]
    # BEGIN, runs, traces, placeholders, spans, times and statuses, COMMIT, the announcement:
    # one query (an executemany at most) each, however many items.
    with django_assert_max_num_queries(8):
        DatabaseExporter().export(items)
    assert Span.objects.count() == 101


# --- installing -----------------------------------------------------------------------------


class Other(TracingProcessor):
    """Stands for a processor an integration (OpenTelemetry, Logfire, ...) registered."""

    def on_trace_start(self, trace: Any) -> None: ...
    def on_trace_end(self, trace: Any) -> None: ...
    def on_span_start(self, span: Any) -> None: ...
    def on_span_end(self, span: Any) -> None: ...
    def shutdown(self) -> None: ...
    def force_flush(self) -> None: ...


def registered() -> tuple[Any, ...]:
    return get_trace_provider()._multi_processor._processors  # type: ignore[attr-defined]


@pytest.fixture
def fresh_install(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(exporter_module, "_installed", None)
    monkeypatch.setattr(exporter_module.atexit, "register", lambda *a, **k: None)
    yield
    set_trace_processors([])


def test_without_an_api_key_it_replaces_the_openai_uploader_and_keeps_the_others(
    fresh_install: Any,
) -> None:
    other = Other()
    set_trace_processors([default_processor(), other])
    ours = exporter_module.install()
    assert registered() == (other, ours)
    assert exporter_module.install() is ours  # once
    assert registered() == (other, ours)


def test_with_an_api_key_it_adds_itself_beside_the_openai_uploader(
    fresh_install: Any, settings: Any
) -> None:
    settings.OPENAI_API_KEY = "sk-test"
    set_trace_processors([default_processor()])
    ours = exporter_module.install()
    assert registered() == (default_processor(), ours)


def test_it_installs_nothing_when_tracing_is_off(fresh_install: Any, settings: Any) -> None:
    settings.AGENTSITE_TRACING = False
    assert exporter_module.install() is None
    assert registered() == ()


def test_it_takes_its_batch_delay_and_queue_size_from_the_settings(settings: Any) -> None:
    settings.AGENTSITE_TRACE_BATCH_DELAY = 2.5
    settings.AGENTSITE_TRACE_QUEUE_SIZE = 100
    processor = make_processor()
    assert processor._schedule_delay == 2.5
    assert processor._max_queue_size == 100


EXITING_PROCESS = """
import django, time
django.setup()
from agents import trace, custom_span
with trace("at exit", trace_id="{trace_id}"):
    with custom_span("last words"):
        pass
# Exit at once: the batch delay (an hour) has not passed, so only the exit hook stores these.
"""


def test_it_stores_what_is_queued_when_the_process_exits() -> None:
    trace_id = "trace_" + "e" * 32
    result = subprocess.run(
        [sys.executable, "-c", EXITING_PROCESS.format(trace_id=trace_id)],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url(),
            "AGENTSITE_TRACE_BATCH_DELAY": "3600",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    row = Trace.objects.get(trace_id=trace_id)
    assert row.workflow_name == "at exit"
    assert list(row.spans.values_list("name", flat=True)) == ["last words"]
    assert row.status == TraceStatus.OK
    assert row.duration_seconds is not None and row.duration_seconds < 5


def test_a_failing_listener_of_stored_traces_costs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[list[exporter_module.StoredTrace]] = []

    def broken(stored: list[exporter_module.StoredTrace]) -> None:
        raise RuntimeError("a listener broke")

    exporter_module.on_stored(broken)
    exporter_module.on_stored(heard.append)
    try:
        with caplog.at_level("ERROR", logger="tracing.exporter"):
            exporter_module._tell([exporter_module.StoredTrace("trace_1", "ok", 3)])
    finally:
        exporter_module._listeners.remove(broken)
        exporter_module._listeners.remove(heard.append)
    assert heard == [[exporter_module.StoredTrace("trace_1", "ok", 3)]]
    assert "a listener of stored traces failed" in caplog.text


def test_a_run_that_never_waited_waited_no_time_to_the_microsecond() -> None:
    """Active time is the sum of the root spans' durations in SQL, the duration the trace's
    own span times: both to the microsecond (SQLite's julianday counts whole milliseconds, so
    a run that never waited showed "0.20 ms" of waiting there and "—" on PostgreSQL)."""
    provider = get_trace_provider()
    trace = provider.create_trace(name="w")
    DatabaseExporter().export([trace])
    span = provider.create_span(GenerationSpanData(model="m"), parent=trace)
    span.start()
    span.finish()
    start = datetime(2026, 11, 30, 10, 0, 0, 900, tzinfo=UTC)
    span._started_at = start.isoformat()  # type: ignore[attr-defined]
    span._ended_at = (start + timedelta(microseconds=200)).isoformat()  # type: ignore[attr-defined]
    DatabaseExporter().export([span])

    row = Trace.objects.get(trace_id=trace.trace_id)
    assert row.duration_seconds == pytest.approx(0.0002, abs=1e-9)
    assert row.active_seconds == pytest.approx(0.0002, abs=1e-9)
    assert row.waiting_seconds == pytest.approx(0.0, abs=1e-9)
