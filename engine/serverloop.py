"""The server's event loop, once `asgi.py` has seen it.

In-process runs execute on it, and the in-memory channel layer is only safe on it, so both the
executor and `events` look it up here. Outside a server (a management command, a task
worker, a test) there is none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

_loop: asyncio.AbstractEventLoop | None = None


def bind(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Take `loop` as the server's loop. True if it was not already."""
    global _loop
    if _loop is loop:
        return False
    _loop = loop
    return True


def current() -> asyncio.AbstractEventLoop | None:
    """The server's loop, or None when there is none (or it was closed)."""
    if _loop is None or _loop.is_closed():
        return None
    return _loop


@contextmanager
def bound(loop: asyncio.AbstractEventLoop | None) -> Iterator[None]:
    """`loop` as the server's loop for a while (tests, benchmarks), then the previous one."""
    global _loop
    previous = _loop
    _loop = loop
    try:
        yield
    finally:
        _loop = previous
