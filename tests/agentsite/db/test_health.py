"""The pool's check of a connection before it is handed out (`agentsite/db/health.py`): a round
trip at most once per `CHECK_SECONDS` a connection, and a connection that went bad while it
sat in the pool longer than that is replaced, on a real PostgreSQL server and psycopg's pool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from agentsite.db import health
from tests.postgres import PostgresServer, running_postgres


class FakeConnection:
    """What the check reads of a psycopg connection; counts the round trips it is asked."""

    def __init__(self) -> None:
        self.closed = False
        self.autocommit = True
        self.round_trips = 0

    def execute(self, query: str) -> None:
        self.round_trips += 1


def test_a_connection_is_asked_once_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(health, "monotonic", lambda: now[0])
    connection = FakeConnection()

    for _ in range(5):
        health.check_connection(connection)
        now[0] += 0.3
    assert connection.round_trips == 1  # 1.2 s of borrowing: one check

    now[0] += health.CHECK_SECONDS
    health.check_connection(connection)
    assert connection.round_trips == 2  # idle past the window: asked again


def test_a_connection_known_closed_is_refused_without_a_round_trip() -> None:
    connection = FakeConnection()
    health.check_connection(connection)
    connection.closed = True  # psycopg's state after a failed operation broke it

    with pytest.raises(psycopg.OperationalError):
        health.check_connection(connection)
    assert connection.round_trips == 1


def test_a_failed_round_trip_is_not_remembered_as_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
    connection = FakeConnection()

    def dropped(query: str) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(connection, "execute", dropped)
    for _ in range(2):
        with pytest.raises(psycopg.OperationalError):
            health.check_connection(connection)
    assert getattr(connection, "_agentsite_checked", None) is None


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres(max_connections=10) as server:
        yield server


def _backend(pool: ConnectionPool[Any]) -> int:
    with pool.connection() as connection:
        row = connection.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])


def test_on_postgresql_a_connection_dropped_while_idle_is_replaced(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the pooled connection's session (a restart, `idle_session_timeout`);
    the next borrower past the window gets a working connection, not an error."""
    now = [1000.0]
    monkeypatch.setattr(health, "monotonic", lambda: now[0])
    pool: ConnectionPool[Any] = ConnectionPool(
        postgres.url, min_size=1, max_size=1, check=health.check_connection, open=True
    )
    try:
        first = _backend(pool)
        assert _backend(pool) == first  # within the window: the same connection, no check
        with postgres.connect() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [first])

        now[0] += health.CHECK_SECONDS
        second = _backend(pool)
        assert second != first
        assert _backend(pool) == second
    finally:
        pool.close()
