"""`db_thread`: a hop to a worker thread that hands back what its work returned or raised,
runs its work to its end when the caller stops waiting, and gives the connection it used
back as Django does after a request."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest
from django.db import connections

from agentsite.db.hops import db_thread

pytestmark = pytest.mark.django_db(transaction=True)

seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


async def test_it_returns_what_the_work_returns_in_the_callers_context() -> None:
    seen.set("caller's")

    def work(a: int, *, b: int) -> tuple[int, str, bool]:
        return a + b, seen.get(), threading.current_thread() is threading.main_thread()

    assert await db_thread(work)(1, b=2) == (3, "caller's", False)


async def test_it_raises_what_the_work_raises() -> None:
    def work() -> None:
        raise KeyError("gone")

    with pytest.raises(KeyError, match="gone"):
        await db_thread(work)()


async def test_a_caller_that_stops_waiting_does_not_stop_the_work() -> None:
    started, finished = threading.Event(), threading.Event()

    def work() -> str:
        started.set()
        time.sleep(0.2)
        finished.set()
        return "done"

    task = asyncio.ensure_future(db_thread(work)())
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(finished.wait, 5)


async def test_it_gives_back_a_connection_that_outlived_its_age() -> None:
    def work() -> Any:
        database = connections["default"]
        database.ensure_connection()
        database.close_at = time.monotonic() - 1  # as CONN_MAX_AGE makes it, passed
        return database

    database = await db_thread(work)()
    assert database.connection is None
