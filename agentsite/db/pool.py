"""How a process shares its bounded pool of database connections (PostgreSQL, psycopg's pool
through Django's `OPTIONS["pool"]`).

A process never opens more than `DATABASE_POOL_MAX_SIZE` connections. Threads borrow one per
operation and give it back at its end: a request at the request's end (Django's
`request_finished`), a hop (`hops.py`) after each call, the trace exporter after each batch.
A thread that finds none free waits up to `DATABASE_POOL_TIMEOUT` seconds.

One wait could last forever, though: a request's thread keeps its connection for the whole
request, and some requests wait for a hop (`async_to_sync(session.get_items)`), which needs a
connection of its own. Were every connection held by such a request, no hop could run. So
the pool is split: at most half of it serves requests at once (`requests_at_once`; the others
wait their turn in the event loop, holding nothing), the other half serves the hops
(`hop_threads`) and the background threads.

Without a pool (SQLite, or `DATABASE_POOL=0`) nothing is gated, and hops get asyncio's
default number of threads.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse

BUSY = "The site is busy right now and nothing was saved. Please try again in a moment."
BUSY_RETRY_AFTER = 5


def pool_max_size() -> int | None:
    """The default database's pool size in this process, or None without a pool."""
    options = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    if not options:
        return None
    if options is True:
        return 4  # psycopg_pool's own default
    return int(options.get("max_size") or options.get("min_size") or 4)


def requests_at_once() -> int | None:
    """How many HTTP requests a process serves at once, or None for no limit."""
    size = pool_max_size()
    return None if size is None else max(1, size // 2)


def hop_threads() -> int:
    size = pool_max_size()
    if size is None:
        return min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor
    return max(1, size - size // 2)


def is_exhausted(error: BaseException) -> bool:
    """Whether `error` says there was no connection to be had: none came free in the pool
    within its timeout, or the server had no slot left. Either way: busy, try again."""
    try:
        from psycopg_pool import PoolTimeout
    except ImportError:  # installed without the postgres extra: no pool, nothing times out
        return False
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, PoolTimeout) or "too many clients" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def busy_response() -> HttpResponse:
    """503 with Retry-After, written without a template: rendering the site's layout would
    ask the database again."""
    response = HttpResponse(
        f'<!doctype html><html lang="en"><title>Busy</title><p role="alert">{BUSY}</p></html>',
        status=503,
    )
    response["Retry-After"] = str(BUSY_RETRY_AFTER)
    return response


class BusyMiddleware:
    """A request that found no database connection in time is answered 503 "busy, try
    again" rather than a 500."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse = self.get_response(request)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return busy_response() if is_exhausted(exception) else None


class RequestGate:
    """ASGI: at most `requests_at_once()` HTTP requests of `app` at once (no limit without a
    pool); the others wait here, in the event loop, before any thread or connection is
    taken."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.limit = requests_at_once()
        self._semaphore: asyncio.Semaphore | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.limit is None:
            await self.app(scope, receive, send)
            return
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.limit)
        async with self._semaphore:
            await self.app(scope, receive, send)
