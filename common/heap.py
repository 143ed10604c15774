"""The garbage collector and a long-lived process's startup heap.

A server or worker imports Django, the SDK, pydantic's models and the agents, and keeps all
of it for its life: hundreds of thousands of tracked objects that every full collection
walks again, with the event loop stopped meanwhile. On the concurrency benchmark's process
(100 runs in flight) a full collection took 190-250 ms; after `freeze_startup_heap` 60-80
ms (`docs/benchmarks.md`, issue 28): every page, socket and run of the process waited that
long, a few times a minute under load.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect what startup left as garbage, then move every object alive to the collector's
    permanent generation (`gc.freeze`), which no collection walks. Call it once, when the
    process has set itself up and before it serves; the objects it made since are collected
    as always. Returns how many objects it froze."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
