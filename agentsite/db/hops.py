"""Database work from async code: one hop to a worker thread per operation.

Hops are not thread-sensitive, so independent operations really run in parallel, each
worker thread with its own connection. Nothing closes those connections at the end of a
request, so each hop first does what Django does between requests: drop a connection that
broke or outlived `CONN_MAX_AGE`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections


def db_hop[**P, T](function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """`function` as a coroutine function that runs it in a worker thread."""

    def fresh(*args: P.args, **kwargs: P.kwargs) -> T:
        close_old_connections()
        return function(*args, **kwargs)

    return sync_to_async(fresh, thread_sensitive=False)


def db_thread[**P, T](function: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Like `db_hop`, through `asyncio.to_thread`, which costs less than asgiref's
    `sync_to_async`. Only for work that never calls back into async code (`async_to_sync`
    needs the loop that asgiref records): the session store's queries."""

    async def run(*args: P.args, **kwargs: P.kwargs) -> T:
        def fresh() -> T:
            close_old_connections()
            return function(*args, **kwargs)

        return await asyncio.to_thread(fresh)

    return run
