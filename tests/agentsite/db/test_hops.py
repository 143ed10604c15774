"""`db_hop` and `db_thread`: a hop to a worker thread that hands back what its work returned
or raised, runs its work to its end when the caller stops waiting, and gives the connection
it used back as Django does after a request; in a `db_hop`, `async_to_sync` runs on the
caller's loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from django.db import connections

from agentsite.db.hops import db_hop, db_thread

pytestmark = pytest.mark.django_db(transaction=True)

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")
hops = pytest.mark.parametrize("hop", [db_hop, db_thread], ids=["db_hop", "db_thread"])


@hops
async def test_it_returns_what_the_work_returns_in_the_callers_context(hop: Any) -> None:
    seen.set("caller's")

    def work(a: int, *, b: int) -> tuple[int, str, bool]:
        return a + b, seen.get(), threading.current_thread() is threading.main_thread()

    assert await hop(work)(1, b=2) == (3, "caller's", False)


@hops
async def test_it_raises_what_the_work_raises(hop: Any) -> None:
    def work() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        await hop(work)()


@hops
async def test_a_caller_that_stops_waiting_does_not_stop_the_work(hop: Any) -> None:
    started, finished = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        time.sleep(0.2)
        finished.set()
        return "done"

    task = asyncio.ensure_future(hop(work)())
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(finished.wait, 5)


@hops
async def test_it_gives_back_a_connection_that_outlived_its_age(hop: Any) -> None:
    def work() -> Any:
        database = connections["default"]
        database.ensure_connection()
        database.close_at = time.monotonic() - 1  # as CONN_MAX_AGE makes it, passed
        return database

    database = await hop(work)()
    assert database.connection is None


async def test_async_to_sync_in_a_db_hop_runs_on_the_callers_loop() -> None:
    """What `engine.events.publish_sync` needs from a hop (a commit hook's publish in a
    worker): the channel layer's connections belong to the caller's loop."""
    caller = asyncio.get_running_loop()

    async def where() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        return asyncio.get_running_loop(), threading.current_thread()

    def work() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
        return async_to_sync(where)()[0], threading.current_thread()

    loop, thread = await db_hop(work)()
    assert loop is caller
    assert thread is not threading.current_thread()

    # The next work on that thread that is not a `db_hop` finds no stale loop there.
    def left() -> tuple[threading.Thread, object]:
        return threading.current_thread(), getattr(SyncToAsync.threadlocal, "main_event_loop", None)

    for _ in range(500):
        on, loop_left = await db_thread(left)()
        if on is thread:
            break
    assert on is thread  # (the pool's idle threads take works in no fixed order)
    assert loop_left is None
