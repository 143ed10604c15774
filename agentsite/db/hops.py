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
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from asgiref.sync import SyncToAsync
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

from agentsite.db import pool


class HopExecutor(ThreadPoolExecutor):
    """The process's hop threads. Every call is a fresh operation (`_fresh`): its thread's
    connection is checked before and given back after, whoever submits it (our hops, or the
    SDK running a sync function tool through `asyncio.to_thread` on a loop that `adopt`ed
    these threads). No loop shuts it down: `asyncio.run` shuts its loop's default executor
    down at the end, and these threads serve the next loop too."""

    def submit[T](self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(_fresh, functools.partial(fn, *args, **kwargs))

    def run_settled(self, work: Callable[[], None], /) -> None:
        """Run `work`, which checks its connection itself (`_on_default`) and hands every
        outcome to its caller (`db_thread`): nothing is left in the executor's own future."""
        super().submit(work)

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


def _on_default[T](function: Callable[[], T]) -> T:
    """`_fresh` for work that uses the default database alone: that connection checked
    before and after, with one lookup of it in Django's per-thread handler instead of four
    (a few µs of each of the session store's hops)."""
    database = connections[DEFAULT_DB_ALIAS]
    database.close_if_unusable_or_obsolete()
    try:
        return function()
    finally:
        database.close_if_unusable_or_obsolete()


def db_hop[**P, T](function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`function` as a coroutine function that runs it in a hop thread, every database
    connection of that thread checked before and after (`_fresh`).

    Sync code in the hop may call back into async code with `async_to_sync` (an event
    published from a commit hook, `engine.events.publish_sync`): it runs on the caller's
    loop, whose channel-layer connections it shares, as under asgiref's `sync_to_async`.
    That is all this keeps of `sync_to_async`, whose hop cost twice the CPU (146 against
    67 µs a call; `docs/benchmarks.md`, issue 28, part 5): no `Future` chained to another
    and shielded, and no copy of every context variable back to the caller."""

    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return await _hop(_fresh, True, functools.partial(function, *args, **kwargs))

    return run


def db_thread[**P, T](function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Like `db_hop`, for work on the default database that never calls back into async code:
    the session store's queries. Only that connection is checked (`_on_default`).

    It costs less than `asyncio.to_thread`, which the SDK's `SQLiteSession` uses: the thread
    hands its result straight to an asyncio future (no `concurrent.futures.Future` chained to
    one)."""

    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return await _hop(_on_default, False, functools.partial(function, *args, **kwargs))

    return run


async def _hop[T](
    check: Callable[[Callable[[], T]], T], calls_back: bool, call: Callable[[], T]
) -> T:
    """Run `call` in a hop thread, in a copy of the caller's context, through `check` (the
    connections checked before and after); its result or exception is handed to the
    caller's loop. As with `asyncio.to_thread`, a caller that stops waiting does not stop
    the work, which runs to its end. With `calls_back`, `async_to_sync` in the work runs its
    coroutine on the caller's loop: asgiref finds that loop where its own `sync_to_async`
    leaves it, `SyncToAsync.threadlocal` (tested: `tests/agentsite/db/test_hops.py`)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def work() -> None:
        local = SyncToAsync.threadlocal
        if calls_back:
            local.main_event_loop = loop
            local.main_event_loop_pid = os.getpid()
            local.task_context = []
        try:
            result = context.run(check, call)
        except BaseException as exc:
            _settle(loop, future, _failed, exc)
        else:
            _settle(loop, future, _succeeded, result)
        finally:
            if calls_back:
                # The next work on this thread may not call back: it gets no stale loop.
                local.main_event_loop = None

    (_Threads.executor or hop_executor()).run_settled(work)
    return await future


def callback_loop() -> asyncio.AbstractEventLoop | None:
    """The loop on which `async_to_sync` in this thread's work runs its coroutine: the caller's
    of a `db_hop` (or of asgiref's own `sync_to_async`, as a sync view's under ASGI); None in
    a thread no loop waits on, where `async_to_sync` would start a new loop each time."""
    local = SyncToAsync.threadlocal
    if getattr(local, "main_event_loop_pid", None) != os.getpid():
        return None
    return getattr(local, "main_event_loop", None)


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    settle: Callable[[asyncio.Future[Any], Any], None],
    outcome: Any,
) -> None:
    """Hand a hop's outcome to its loop; a loop closed meanwhile has no one waiting."""
    try:
        loop.call_soon_threadsafe(settle, future, outcome)
    except RuntimeError:
        if not loop.is_closed():
            raise


def _succeeded(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # not cancelled by a caller that stopped waiting
        future.set_result(result)


def _failed(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
