"""Every AGENTSITE_SWEEP_SECONDS, the server expires overdue approvals and deals with runs
that a dead process left behind, so neither needs a cron job.

Every AGENTSITE_HEARTBEAT_SECONDS, each process that runs agents beats (`engine.heartbeat`)
and, on each beat, fails what it could not end itself (a final write that gave up) and what
processes that are gone left running (`runs.recover_orphans`): a web server on its loop
(`start`), a task worker (`run_worker`, `db_worker`) or a management command on a daemon
thread (`start_thread`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time

from django.conf import settings
from django.db import connections

from agentsite.db.hops import db_hop
from engine import heartbeat, runs, signals
from engine.models import ProcessKind

logger = logging.getLogger(__name__)

# One sweeper and one heartbeat per loop, referenced until its loop closes (a task nobody
# references may be garbage-collected mid-sleep).
_sweepers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
_beats: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
_thread_lock = threading.Lock()
_thread: threading.Thread | None = None


def start(loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
    """Start the heartbeat of this web process and the sweep on `loop`; the sweep's task, or
    None when it already sweeps there or sweeping is off. Receivers of
    `signals.server_loop_started` (the webhooks' delivery timer) start on it too."""
    signals.server_loop_started.send(sender=None, loop=loop)
    if loop not in _beats and not _beating_on_thread() and heartbeat.begin(ProcessKind.WEB):
        beating = loop.create_task(_beat_forever(settings.AGENTSITE_HEARTBEAT_SECONDS))
        _beats[loop] = beating
        beating.add_done_callback(lambda _: _beats.pop(loop, None))
        # `agentsite.serve` marks it stopped when it has drained; any other clean exit here.
        atexit.register(_stop_at_exit)
    if loop in _sweepers or settings.AGENTSITE_SWEEP_SECONDS <= 0:
        return None
    task = loop.create_task(_sweep_forever(settings.AGENTSITE_SWEEP_SECONDS))
    _sweepers[loop] = task
    task.add_done_callback(lambda _: _sweepers.pop(loop, None))
    return task


async def _sweep_forever(every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await runs.expire_overdue_async()
            await db_hop(runs.recover_stuck_runs)()
        except Exception:
            logger.exception("The sweep of overdue approvals and stuck runs failed")


def pulse() -> bool:
    """One heartbeat of this process, then what it brings to light: this process's runs whose
    final write gave up fail now that the database answers, and runs of processes that are
    gone fail (or, queued, are taken over). False when this process keeps no heartbeat."""
    if not heartbeat.beat():
        return False
    runs.fail_abandoned()
    runs.recover_orphans()
    return True


def _pulse_said_once(failing: bool, every: float) -> bool:
    """One `pulse`; whether it failed. A database outage is said once, when it starts, not
    every beat; the beats go on."""
    try:
        pulse()
    except Exception:
        if not failing:
            logger.exception("The heartbeat of this process failed; retrying every %g s", every)
        return True
    return False


async def _beat_forever(every: float) -> None:
    failing = False
    while heartbeat.owner():
        failing = await db_hop(_pulse_said_once)(failing, every)
        await asyncio.sleep(every)


def start_thread(kind: ProcessKind) -> bool:
    """For a process without a server loop (a task worker, a management command): beat now,
    so the row exists before the first run is claimed, then on a daemon thread; a clean exit
    marks the row stopped. Idempotent; False when heartbeats are off."""
    global _thread
    with _thread_lock:
        if _thread is not None:
            return True
        if not heartbeat.begin(kind):
            return False
        pulse()
        _thread = threading.Thread(
            target=_beat_on_thread,
            args=(settings.AGENTSITE_HEARTBEAT_SECONDS,),
            name="agentsite-heartbeat",
            daemon=True,
        )
        _thread.start()
    atexit.register(_stop_at_exit)
    return True


def _beating_on_thread() -> bool:
    return _thread is not None


def _beat_on_thread(every: float) -> None:
    failing = False
    while True:
        time.sleep(every)
        if not heartbeat.owner():
            return
        try:
            failing = _pulse_said_once(failing, every)
        finally:
            # Given back between beats (so each beat starts on a fresh one): with a pool, a
            # connection kept while this thread sleeps would be a slot lost for good.
            connections.close_all()


def _stop_at_exit() -> None:
    try:
        heartbeat.stop()
    except Exception:
        logger.exception("Could not mark this process stopped; it is taken as gone when silent")


def forget_thread() -> None:
    """Tests: let `start_thread` start again after `heartbeat.reset()`."""
    global _thread
    with _thread_lock:
        _thread = None
