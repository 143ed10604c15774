"""Which tool calls ran, for the spans of calls that did not: the SDK opens a tool's span
(`function`) before it asks whether the call needs a person, and ends it, without an output,
when the call pauses for one; nothing in the span says so. The engine's run hooks
(`engine.runs.spans`) tell this module, in the run's own process, which traces they watch
(each model call of an engine run) and which tool spans reached the tool (its start hook
runs inside the span); a tool span of a watched trace that never reached its tool, ended
without an output or error, is a call that waited for a reviewer (`awaited`). The exporter
asks as it reads the span (the span has ended by then, so its start hook, if any, has run).

Bounded, process-local and thread-safe: the newest ids are kept, far more than a process's
spans in flight.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

KEPT = 16_384

_lock = threading.Lock()
_watched: OrderedDict[str, None] = OrderedDict()
_ran: OrderedDict[str, None] = OrderedDict()


def _keep(ids: OrderedDict[str, None], key: str) -> None:
    with _lock:
        ids[key] = None
        ids.move_to_end(key)
        if len(ids) > KEPT:
            ids.popitem(last=False)


def watch(trace_id: str) -> None:
    """The trace's tool spans are the engine's: one that does not reach its tool waited."""
    _keep(_watched, trace_id)


def ran(span_id: str) -> None:
    """The tool span reached its tool."""
    _keep(_ran, span_id)


def awaited(trace_id: str, span_id: str, data: dict[str, Any], error: Any) -> bool:
    """Whether the tool span (its exported `span_data`) is of a call that paused for a
    reviewer rather than ran."""
    if error is not None or data.get("output"):
        return False
    with _lock:
        return trace_id in _watched and span_id not in _ran
