"""A value a process reads from the database at most every few seconds: what the outboxes ask
on every pause and decision ("does any endpoint want this event?", "did anybody opt in to
email?"), whose answer is almost always the same. A change made in the process is seen at
once (`forget`, from a model signal); one made by another process within the seconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Remembered[T]:
    """`read()`'s value, read again once `seconds()` went by since (a callable, so that the
    module constant it names can be changed, as tests do)."""

    def __init__(self, read: Callable[[], T], seconds: Callable[[], float]) -> None:
        self._read, self._seconds = read, seconds
        self._lock = threading.Lock()
        self._value: T | None = None
        self._known = False
        self._read_at = 0.0

    def get(self) -> T:
        now = time.monotonic()
        with self._lock:
            if self._known and now - self._read_at < self._seconds():
                return self._value  # type: ignore[return-value]
        value = self._read()
        with self._lock:
            self._value, self._known, self._read_at = value, True, now
        return value

    def forget(self, *_: Any, **__: Any) -> None:
        """Read again at the next `get` (a model signal's receiver too)."""
        with self._lock:
            self._known = False
