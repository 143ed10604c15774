"""Tracing cost: agentsite's turns with its trace exporter against the same turns untraced,
and the exporter's throughput for a burst of spans.

It runs once `tracing.exporter` defines a `TracingExporter` subclass (built with no
arguments) or the tracing app installs a processor itself; until then its rows say
"not available yet".
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.tracing import custom_span, function_span, generation_span, trace
from agents.tracing.processor_interface import TracingExporter, TracingProcessor
from agents.tracing.processors import BatchTraceProcessor
from django.test import override_settings

from bench import tracing_setup
from bench.harness import Config, Goal, Row, Samples, compared, interleave, ms, note, ratio
from bench.turn import site_turns

BENCHMARK = "tracing cost"
GOAL = Goal(1.1, "≤ 1.1×")
SPANS_PER_TRACE = 20


class SQLiteJSONExporter(TracingExporter):
    """The peer: the least a durable exporter can do. Each item's `export()` dict as JSON,
    one `executemany` per batch, in a SQLite file set up as the site's database is."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS traces (id TEXT PRIMARY KEY, data TEXT)")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS spans (id TEXT PRIMARY KEY, trace_id TEXT, data TEXT)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS spans_trace ON spans (trace_id)")

    def export(self, items: list[Any]) -> None:
        traces, spans = [], []
        for item in items:
            exported = item.export()
            if not exported:
                continue
            if exported.get("object") == "trace":
                traces.append((exported["id"], json.dumps(exported)))
            else:
                spans.append((exported["id"], exported["trace_id"], json.dumps(exported)))
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO traces VALUES (?, ?)", traces)
            self.db.executemany("INSERT OR REPLACE INTO spans VALUES (?, ?, ?)", spans)


def burst(spans: int) -> list[Any]:
    """`spans` finished spans, in traces of 20, with each trace ahead of its spans as a
    `BatchTraceProcessor` queues them: model calls and tool calls, as turns make them."""
    items: list[Any] = []
    with tracing_setup.processors([]):
        for _ in range(spans // SPANS_PER_TRACE):
            with trace("bench burst", group_id="conv_bench", metadata={"run_id": "1"}) as current:
                items.append(current)
                with custom_span(
                    "turn", {"sdk_span_type": "turn", "usage": {"requests": 1}}
                ) as turn:
                    for i in range(SPANS_PER_TRACE - 1):
                        if i % 2:
                            span: Any = function_span(
                                "lookup_order", input='{"order_id":7}', output="Order 7 shipped."
                            )
                        else:
                            span = generation_span(
                                input=[{"role": "user", "content": "Where is my order 7?"}],
                                output=[{"role": "assistant", "content": "It shipped."}],
                                model="scripted-model",
                                usage={"input_tokens": 120, "output_tokens": 30},
                            )
                        with span:
                            pass
                        items.append(span)
                items.append(turn)
    return items


def export_all(exporter: TracingExporter, items: list[Any], batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(items), batch):
        exporter.export(items[start : start + batch])
    return time.perf_counter() - started


def run(config: Config) -> list[Row]:
    processors, words = tracing_setup.site_processors()
    if not processors:
        return [
            note(BENCHMARK, "turns with the exporter ÷ untraced", "not available yet: " + words),
            note(
                BENCHMARK, "exporter throughput, 10,000-span burst", "not available yet: " + words
            ),
        ]
    return turn_cost(config, processors, words) + throughput(config, processors)


def turn_samples(
    repeats: int, count: int, processors: list[TracingProcessor], *, noop: bool = True
) -> dict[str, Samples]:
    """`count` turns a repeat through agentsite with `processors` ("exporter"), with tracing
    disabled ("untraced") and, if `noop`, with the SDK's batching alone ("noop"), interleaved."""
    contenders: dict[str, Callable[[], list[float]]] = {
        "exporter": lambda: site_turns(count, processors)
    }
    if noop:
        batching: list[TracingProcessor] = [BatchTraceProcessor(tracing_setup.NoOpExporter())]
        contenders["noop"] = lambda: _without_site_recording(lambda: site_turns(count, batching))
    contenders["untraced"] = lambda: site_turns(count, [], tracing=False)
    return interleave(contenders, repeats)


def turn_cost(config: Config, processors: list[TracingProcessor], words: str) -> list[Row]:
    samples = turn_samples(config.pick(3, 15), config.pick(5, 20), processors)
    untraced = samples["untraced"]
    return [
        compared(
            BENCHMARK,
            "agentsite turn, traced ÷ untraced",
            ms(samples["exporter"].mean()),
            ms(untraced.mean()),
            ratio(samples["exporter"], untraced),
            f"the turn of 'turn overhead' with {words} (each repeat's final flush charged to it) "
            "÷ the same turn with tracing disabled",
            GOAL,
        ),
        compared(
            BENCHMARK,
            "reference: SDK batching alone ÷ untraced",
            ms(samples["noop"].mean()),
            ms(untraced.mean()),
            ratio(samples["noop"], untraced),
            "the same turn through BatchTraceProcessor with an exporter that only calls "
            "export(), AGENTSITE_TRACING off: what the SDK's spans and batching cost before any "
            "storage",
        ),
    ]


def _without_site_recording(turns: Callable[[], list[float]]) -> list[float]:
    with override_settings(AGENTSITE_TRACING=False):
        return turns()


def throughput(config: Config, processors: list[TracingProcessor]) -> list[Row]:
    cls = tracing_setup.exporter_class()
    if cls is None:
        return [note(BENCHMARK, "exporter throughput", "not available: no TracingExporter class")]
    try:
        ours = cls()
    except TypeError as exc:
        return [note(BENCHMARK, "exporter throughput", f"not measured: {cls.__name__}() {exc}")]
    spans = config.pick(2_000, 10_000)
    peer = SQLiteJSONExporter(config.workdir / "sdk-traces.sqlite3")
    repeats = config.pick(2, 5)
    batch = tracing_setup.batch_size(processors)
    samples: dict[str, Samples] = interleave(
        {
            "ours": lambda: [export_all(ours, burst(spans), batch) / spans],
            "peer": lambda: [export_all(peer, burst(spans), batch) / spans],
        },
        repeats,
    )
    return [
        compared(
            BENCHMARK,
            f"exporter throughput, {spans:,}-span burst",
            f"{1 / samples['ours'].mean():,.0f} spans/s",
            f"{1 / samples['peer'].mean():,.0f} spans/s",
            ratio(samples["ours"], samples["peer"]),
            f"{cls.__name__}.export over {spans:,} finished spans (in traces of "
            f"{SPANS_PER_TRACE}, in batches of {batch} as the site's BatchTraceProcessor hands "
            "them over) ÷ a plain sqlite3 exporter storing each span's export() JSON, same "
            "batches: time per span",
        )
    ]
