"""Database work from async code: one hop to a worker thread per operation.

Hops are not thread-sensitive, so independent operations really run in parallel, each
worker thread with its own connection. The threads are the process's own, as many as its
share of the connection pool (`pool.hop_threads()`; asyncio's default number without a
pool), and every loop of the process uses them (`adopt`): a worker's loop (`run_worker`, or
a stock `db_worker`'s `asyncio.run` per task) does not start threads (and connections) of its
own each time.

Nothing closes those connections at the end of a request, so each hop does what Django does
around a request: before it, drop a connection that broke or outlived `CONN_MAX_AGE`; after
it, the same, which with a pool (`CONN_MAX_AGE` 0) gives the connection back, so that a
thread between two hops holds none.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from agentsite.db import pool


class HopExecutor(ThreadPoolExecutor):
    """The process's hop threads. Every call is a fresh operation (`_fresh`): its thread's
    connection is checked before and given back after, whoever submits it (our hops, or the
    SDK running a sync function tool through `asyncio.to_thread` on a loop that `adopt`ed
    these threads). No loop shuts it down: `asyncio.run` shuts its loop's default executor
    down at the end, and these threads serve the next loop too."""

    def submit[T](self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(_fresh, functools.partial(fn, *args, **kwargs))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


class _Threads:
    executor: HopExecutor | None = None
    lock = threading.Lock()


def hop_executor() -> HopExecutor:
    """The process's hop threads, started on first use (settings are read by then)."""
    with _Threads.lock:
        if _Threads.executor is None:
            _Threads.executor = HopExecutor(
                max_workers=pool.hop_threads(), thread_name_prefix="db-hop"
            )
        return _Threads.executor


def adopt(loop: asyncio.AbstractEventLoop) -> None:
    """Make the hop threads `loop`'s default executor, so that `asyncio.to_thread` (the SDK's
    sync tools) gives connections back too, and draws on the same bounded threads."""
    loop.set_default_executor(hop_executor())


def _fresh[T](function: Callable[[], T]) -> T:
    close_old_connections()
    try:
        return function()
    finally:
        close_old_connections()


def db_hop[**P, T](function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`function` as a coroutine function that runs it in a hop thread."""
    hop: Callable[P, Coroutine[Any, Any, T]] | None = None

    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        nonlocal hop
        if hop is None:  # at the first call: the executor needs the settings
            hop = sync_to_async(function, thread_sensitive=False, executor=hop_executor())
        return await hop(*args, **kwargs)

    return run


def db_thread[**P, T](function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Like `db_hop`, as `asyncio.to_thread` does it, which costs less than asgiref's
    `sync_to_async`. Only for work that never calls back into async code (`async_to_sync`
    needs the loop that asgiref records): the session store's queries."""

    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        call = functools.partial(function, *args, **kwargs)
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(hop_executor(), context.run, call)

    return run
