"""Which trace processors agentsite runs with, and switching them for a measurement.

The SDK's default processor uploads to OpenAI; it is dropped at setup (there is no key, so it
would only log, but a benchmark must never try a network). Whatever the `tracing` app
installed is kept. If it installed nothing but `tracing.exporter` defines a
`TracingExporter`, agentsite's runs get that exporter behind the SDK's `BatchTraceProcessor`,
which is how the SDK expects an exporter to be used.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agents import set_trace_processors, set_tracing_disabled
from agents.tracing import get_trace_provider
from agents.tracing.processor_interface import TracingExporter, TracingProcessor
from agents.tracing.processors import BackendSpanExporter, BatchTraceProcessor
from django.test import override_settings

_installed: list[TracingProcessor] = []
_fallback: list[TracingProcessor] = []  # made once, if the tracing app installed nothing
DEFAULT_BATCH_SIZE = 128  # BatchTraceProcessor's max_batch_size


def current_processors() -> list[TracingProcessor]:
    multi = getattr(get_trace_provider(), "_multi_processor", None)
    return list(getattr(multi, "_processors", ()))


def _uploads_to_openai(processor: TracingProcessor) -> bool:
    exporter = getattr(processor, "_exporter", None)
    return isinstance(exporter, BackendSpanExporter)


def drop_openai_export() -> None:
    """Keep the processors the site installed, less the SDK's upload to OpenAI."""
    kept = [p for p in current_processors() if not _uploads_to_openai(p)]
    set_trace_processors(kept)
    _installed[:] = kept


def exporter_class() -> type[TracingExporter] | None:
    """The `TracingExporter` subclass that `tracing.exporter` defines, if it exists yet."""
    try:
        module = importlib.import_module("tracing.exporter")
    except ImportError:
        return None
    for _, value in inspect.getmembers(module, inspect.isclass):
        if (
            issubclass(value, TracingExporter)
            and value is not TracingExporter
            and value.__module__ == module.__name__
            and not inspect.isabstract(value)
        ):
            return value
    return None


def site_processors() -> tuple[list[TracingProcessor], str]:
    """The processors agentsite's runs use, and a few words saying which they are."""
    if _installed:
        names = ", ".join(type(p).__name__ for p in _installed)
        return list(_installed), f"trace export as the tracing app installed it ({names})"
    cls = exporter_class()
    if cls is None:
        return [], "no trace export (tracing.exporter is not available yet)"
    if not _fallback:
        _fallback.append(BatchTraceProcessor(cls()))
    return list(_fallback), f"trace export through {cls.__name__}"


class NoOpExporter(TracingExporter):
    """Exports nowhere: what the SDK's batching costs by itself."""

    def export(self, items: list[Any]) -> None:
        for item in items:
            item.export()


@contextmanager
def processors(chosen: list[TracingProcessor]) -> Iterator[None]:
    """Trace through `chosen` only, then back to the setup's processors."""
    set_trace_processors(chosen)
    try:
        yield
    finally:
        for processor in chosen:
            processor.force_flush()
        set_trace_processors(_installed)


@contextmanager
def disabled() -> Iterator[None]:
    """No tracing at all: the SDK makes no spans, and the site records nothing of its own
    into traces (`AGENTSITE_TRACING`, where the tracing app has that setting)."""
    set_tracing_disabled(True)
    try:
        with override_settings(AGENTSITE_TRACING=False):
            yield
    finally:
        set_tracing_disabled(False)


def batch_size(chosen: list[TracingProcessor]) -> int:
    """How many items the site's processor hands its exporter at once."""
    for processor in chosen:
        if isinstance(processor, BatchTraceProcessor):
            return int(getattr(processor, "_max_batch_size", DEFAULT_BATCH_SIZE))
    return DEFAULT_BATCH_SIZE


def flush(chosen: list[TracingProcessor]) -> None:
    for processor in chosen:
        processor.force_flush()
