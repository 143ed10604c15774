"""A run's final write, through a database outage: retried with backoff for
AGENTSITE_FINAL_WRITE_RETRY_SECONDS (a broken connection closed and reopened); if it still
cannot be written, the run is left to this process's next heartbeat, which fails it. And the
ways a run is failed from outside its stream (a shutdown, a crashed job)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from agents import RunResultStreaming
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from agentsite.db.hops import db_hop
from engine import events
from engine.models import ACTIVE_STATUSES, AgentRun, RunStatus
from engine.runs import rows

logger = logging.getLogger(__name__)


# A connection that broke or a database that does not answer: worth another try.
FINAL_WRITE_ERRORS = (OperationalError, InterfaceError)
FINAL_WRITE_FIRST_DELAY = 0.05
FINAL_WRITE_MAX_DELAY = 2.0
ABANDONED_REASON = (
    "The run ended, but its result could not be saved: the database could not be reached. "
    "Nothing was retried."
)
# Runs of this process whose final write gave up, with the reason they fail with:
# `fail_abandoned` fails them on the process's next heartbeat that reaches the database.
_abandoned: dict[int, str] = {}
_abandoned_lock = threading.Lock()


async def write[T](
    run_id: int,
    gave_up: T,
    write: Callable[..., T],
    *args: Any,
    lost_reason: str = ABANDONED_REASON,
) -> T:
    """`write(*args)` in a database thread, tried again with backoff for
    AGENTSITE_FINAL_WRITE_RETRY_SECONDS while the database cannot be reached (each write is
    one transaction, conditional on the run still running, so a retry never applies twice).
    If it still cannot be written, the run is left to this process's next heartbeat, which
    fails it, and `gave_up` is returned."""
    deadline = time.monotonic() + settings.AGENTSITE_FINAL_WRITE_RETRY_SECONDS
    delay = FINAL_WRITE_FIRST_DELAY
    attempt = 1
    while True:
        try:
            return await db_hop(_attempt_write)(write, *args)
        except FINAL_WRITE_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                logger.error(
                    "Run %s: its final write failed %d time(s), the last with %r; it fails at "
                    "this process's next heartbeat.",
                    run_id,
                    attempt,
                    exc,
                )
                with _abandoned_lock:
                    _abandoned[run_id] = lost_reason
                return gave_up
            logger.warning(
                "Run %s: its final write failed (%r); trying again in %.2g s.", run_id, exc, delay
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, FINAL_WRITE_MAX_DELAY)
        attempt += 1


def _attempt_write[T](write: Callable[..., T], *args: Any) -> T:
    try:
        return write(*args)
    except FINAL_WRITE_ERRORS:
        # The connection may be broken: the next attempt opens a new one.
        if not connection.in_atomic_block:
            with contextlib.suppress(DatabaseError):
                connection.close()
        raise


def fail_abandoned() -> int:
    """Fail this process's runs whose final write gave up (the database answers again: the
    heartbeat that calls this just reached it). Returns how many failed."""
    with _abandoned_lock:
        left = sorted(_abandoned.items())
    failed = 0
    for run_id, reason in left:
        if rows.fail_sync(run_id, reason, from_statuses=(RunStatus.RUNNING,)):
            failed += 1
            conversation_id = (
                AgentRun.objects.filter(pk=run_id).values_list("conversation_id", flat=True).get()
            )
            events.publish_sync(
                [rows.run_updated(run_id, conversation_id, RunStatus.FAILED, reason)]
            )
        with _abandoned_lock:
            _abandoned.pop(run_id, None)
    return failed


async def fail(
    run: AgentRun,
    reason: str,
    result: RunResultStreaming | None = None,
    *,
    status: str = RunStatus.FAILED,
    from_statuses: tuple[str, ...] = ACTIVE_STATUSES,
    masked_input: str = "",
    error_detail: dict[str, Any] | None = None,
) -> None:
    """End the run as failed (or with another finished `status`, see `rows.fail_sync`), the
    write retried as every final write is, and tell the pages once it is stored."""
    end = functools.partial(
        rows.fail_sync,
        from_statuses=from_statuses,
        status=status,
        masked_input=masked_input,
        error_detail=error_detail,
    )
    if await write(run.pk, False, end, run.pk, reason, result, lost_reason=reason):
        await events.publish([rows.run_updated(run.pk, run.conversation_id, status, reason)])


SHUTDOWN_REASON = (
    "Interrupted by a shutdown: the server stopped before this run ended. Nothing was retried."
)


def interrupt(run_ids: list[int]) -> int:
    """Fail the runs a stopping process could not finish in time (`executor.drain`): those
    still running, perhaps mid-tool, are never retried. Runs whose job had not started yet
    stay queued or resuming for the next process's recovery. Returns how many failed."""
    return sum(
        rows.fail_sync(run_id, SHUTDOWN_REASON, from_statuses=(RunStatus.RUNNING,))
        for run_id in run_ids
    )


async def fail_unfinished(run_id: int, reason: str) -> None:
    """Fail a run that a crash left queued, running or resuming; others stay as they are."""
    if await write(run_id, False, rows.fail_sync, run_id, reason, lost_reason=reason):
        conversation_id = (
            await AgentRun.objects.filter(pk=run_id)
            .values_list("conversation_id", flat=True)
            .aget()
        )
        await events.publish([rows.run_updated(run_id, conversation_id, RunStatus.FAILED, reason)])
