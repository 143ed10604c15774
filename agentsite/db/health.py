"""The pool's check of a PostgreSQL connection before it is handed out (psycopg_pool's `check`,
set in settings with `CONN_HEALTH_CHECKS`).

psycopg_pool's own `ConnectionPool.check_connection` is a round trip to the server each time
any thread borrows a connection. Threads here borrow one per operation (a request, each hop
of a run: `hops.py`), so a turn paid a round trip per hop on top of its queries: about a tenth
of a worker's time at 100 runs at once (py-spy, `docs/benchmarks.md`, issue 28 part 3).

What the check is for is a connection that went bad while it sat in the pool: the server
restarted, or closed it after `idle_session_timeout`, or the network dropped it. This one
asks the server at most once per `CHECK_SECONDS` per connection, and in between only looks
at what psycopg already knows (closed, or broken by a failed operation). A connection that a
thread used a moment ago is handed out again without a round trip; one idle for longer is
checked as before. What it gives up: were the server to drop a connection within
`CHECK_SECONDS` of its last check, the first operation on it fails instead of being given
another one, as it would have had the server dropped it a moment after the check. Django
then discards it (`close_if_unusable_or_obsolete`), and the run's final writes retry
(`engine.runs.final`).
"""

from __future__ import annotations

from time import monotonic
from typing import Any

# How long a connection's last check holds.
CHECK_SECONDS = 2.0


def check_connection(conn: Any) -> None:
    """Raise when `conn` is not fit to hand out (psycopg_pool then discards it and gives
    another); quiet when it is."""
    if conn.closed:  # broken by a failed operation, or closed
        import psycopg

        raise psycopg.OperationalError("the connection is closed")
    now = monotonic()
    checked = getattr(conn, "_agentsite_checked", None)
    if checked is not None and now - checked < CHECK_SECONDS:
        return
    from psycopg_pool import ConnectionPool

    ConnectionPool.check_connection(conn)
    conn._agentsite_checked = now
