"""A database outage at a run's end (`engine/runs/final.py`). The final write is retried with
backoff; if it still cannot be written, the run fails at its process's next heartbeat
instead of staying "running" (and its conversation busy) for good."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper

from engine import heartbeat, runs, sweeper
from engine.models import AgentRun, ProcessKind, RunStatus
from engine.runs import driving, final
from tests.factories import start_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def is_completion(sql: str) -> bool:
    """The run's completion: the one UPDATE that stores its reply."""
    return sql.lstrip().upper().startswith("UPDATE") and "final_output" in sql


def inject(
    monkeypatch: pytest.MonkeyPatch,
    times: int,
    matches: Callable[[str], bool] = is_completion,
    fault: Callable[[CursorWrapper], None] | None = None,
) -> dict[str, int]:
    """The first `times` statements that `matches` fail at the database layer, as the driver
    fails when the server goes away (or: `fault` is done to the connection first, and the
    statement goes to the server). Returns the count of statements hit."""
    hit = {"n": 0}
    original = CursorWrapper._execute  # type: ignore[attr-defined]

    def failing(self: CursorWrapper, sql: str, params: Any, *rest: Any) -> Any:
        if matches(sql) and hit["n"] < times:
            hit["n"] += 1
            if fault is not None:
                fault(self)
            else:
                with self.db.wrap_database_errors:
                    raise self.db.Database.OperationalError("injected: connection closed")
        return original(self, sql, params, *rest)

    monkeypatch.setattr(CursorWrapper, "_execute", failing)
    return hit


@pytest.fixture
def fast_retries(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(final, "FINAL_WRITE_FIRST_DELAY", 0.01)
    settings.AGENTSITE_FINAL_WRITE_RETRY_SECONDS = 10


@pytest.fixture
def beating(settings: Any) -> Iterator[str]:
    settings.AGENTSITE_HEARTBEAT_SECONDS = 5
    identity = heartbeat.begin(ProcessKind.WEB)
    assert heartbeat.beat()
    yield identity
    heartbeat.reset()
    sweeper.forget_thread()
    final._abandoned.clear()


@pytest.mark.usefixtures("fast_retries", "submitted")
def test_the_completion_is_retried_through_an_outage_and_the_reply_stored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    run = start_run("where is order 7")
    hit = inject(monkeypatch, times=3)

    with caplog.at_level(logging.WARNING, logger="engine.runs"):
        asyncio.run(runs.execute(run.pk))

    run.refresh_from_db()
    assert hit["n"] == 3
    assert run.status == RunStatus.COMPLETED, run.error
    assert "order 7" in run.final_output.lower() and run.finished is not None
    assert sum("its final write failed" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.usefixtures("submitted")
def test_a_final_write_that_gives_up_fails_the_run_at_the_next_heartbeat(
    monkeypatch: pytest.MonkeyPatch, settings: Any, beating: str
) -> None:
    monkeypatch.setattr(final, "FINAL_WRITE_FIRST_DELAY", 0.01)
    settings.AGENTSITE_FINAL_WRITE_RETRY_SECONDS = 0.2
    run = start_run("where is order 7")
    inject(monkeypatch, times=10_000)

    asyncio.run(runs.execute(run.pk))

    run.refresh_from_db()
    # Its owner is alive, so recovery leaves it alone however quiet it is...
    assert (run.status, run.process) == (RunStatus.RUNNING, beating)
    assert runs.recover_stuck_runs().failed == 0
    monkeypatch.undo()  # the database answers again
    # ...and the owner itself fails it on its next beat.
    assert sweeper.pulse()
    run.refresh_from_db()
    assert (run.status, run.error) == (RunStatus.FAILED, runs.ABANDONED_REASON)
    assert not AgentRun.objects.filter(conversation=run.conversation).busy().exists()
    assert not final._abandoned


@pytest.mark.usefixtures("fast_retries", "submitted")
def test_a_failure_is_retried_too(monkeypatch: pytest.MonkeyPatch) -> None:
    run = start_run("where is order 7")
    AgentRun.objects.filter(pk=run.pk).update(agent_name="gone")  # the claim, then a failure
    hit = inject(
        monkeypatch,
        times=2,
        matches=lambda sql: sql.lstrip().upper().startswith("UPDATE") and "error" in sql.lower(),
    )

    asyncio.run(runs.execute(run.pk))

    run.refresh_from_db()
    assert hit["n"] == 2
    assert run.status == RunStatus.FAILED and "'gone' is not available" in run.error


@pytest.mark.usefixtures("fast_retries", "submitted")
def test_a_real_connection_killed_at_the_final_write_is_reopened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On PostgreSQL the server terminates the run's own connection (pg_terminate_backend,
    from another connection) just as its completion is sent: the write fails for real and is
    retried on a new connection. (A SQLite file has no server to lose: there the driver's own
    error stands for it.)"""
    killed: list[int] = []
    fault: Callable[[CursorWrapper], None] | None = None
    if connection.vendor == "postgresql":
        import psycopg

        db = connection.settings_dict
        admin = psycopg.connect(
            dbname=db["NAME"],
            user=db["USER"],
            password=db["PASSWORD"] or None,
            host=db["HOST"],
            port=db["PORT"],
            autocommit=True,
        )

        def terminate(cursor: CursorWrapper) -> None:
            pid = cursor.db.connection.info.backend_pid
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])
            killed.append(pid)

        fault = terminate
    run = start_run("where is order 7")
    hit = inject(monkeypatch, times=1, fault=fault)
    try:
        asyncio.run(runs.execute(run.pk))
    finally:
        if fault is not None:
            admin.close()

    run.refresh_from_db()
    assert hit["n"] == 1
    assert len(killed) == (1 if connection.vendor == "postgresql" else 0)
    assert run.status == RunStatus.COMPLETED, run.error
    assert "order 7" in run.final_output.lower()


@pytest.mark.usefixtures("submitted")
def test_a_sign_of_life_that_cannot_be_written_does_not_end_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = start_run("where is order 7")
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    hit = inject(
        monkeypatch, times=1, matches=lambda sql: sql.lstrip().upper().startswith("UPDATE")
    )

    driving._heartbeat(run.pk)  # raised OperationalError into the stream, failing the run

    assert hit["n"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
