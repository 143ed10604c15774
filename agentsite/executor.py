"""Where runs execute.

- "inprocess" (the default): an asyncio task on the server's event loop, so a run streams to
  the pages of the same process with no other moving part. Outside a server (a management
  command, a test, the admin under WSGI) the tasks go to one background loop of this
  process instead. Tasks are kept referenced until done; an exception that escapes a run is
  logged and stored on the run.
- "tasks": django-tasks with its database backend; workers in separate processes
  (`manage.py db_worker`) pick runs up, so runs survive a web process restart and scale out.

Both call the same `runs.execute` / `runs.resume`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any, Literal

from django.conf import settings

logger = logging.getLogger(__name__)

Job = Literal["execute", "resume"]


async def run_job(job: Job, run_id: int) -> None:
    """Run one job; whatever escapes it is logged and stored on the run, never lost."""
    from agentsite import runs

    try:
        await runs.expire_overdue_async()
        if job == "execute":
            await runs.execute(run_id)
        else:
            await runs.resume(run_id)
    except BaseException as exc:
        logger.exception("Run %s: %s failed", run_id, job)
        await runs.fail_unfinished(run_id, f"The run stopped unexpectedly: {exc!r}")
        if not isinstance(exc, Exception):
            raise


class InProcessExecutor:
    def __init__(self) -> None:
        self._server_loop: asyncio.AbstractEventLoop | None = None
        self._background_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: set[asyncio.Task[None] | concurrent.futures.Future[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run jobs on the server's loop from now on (asgi.py calls this)."""
        if self._server_loop is loop:
            return
        self._server_loop = loop
        start_sweeper(loop)

    def submit(self, job: Job, run_id: int) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        target = self._server_loop
        if target is None or target.is_closed():
            target = running if running is not None else self._get_background_loop()
        if target is running:
            task = target.create_task(run_job(job, run_id))
            self._keep(task)
        else:
            future = asyncio.run_coroutine_threadsafe(run_job(job, run_id), target)
            self._keep(future)

    def _keep(self, work: Any) -> None:
        with self._lock:
            self._pending.add(work)
        work.add_done_callback(self._forget)

    def _keep_forever(self, task: asyncio.Task[None]) -> None:
        # Referenced, but not counted as pending work: the sweeper never ends.
        self._sweeper = task

    def _forget(self, work: Any) -> None:
        with self._lock:
            self._pending.discard(work)

    def _get_background_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._background_loop is None or self._background_loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="agentsite-runs", daemon=True
                )
                thread.start()
                self._background_loop = loop
            return self._background_loop

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no job is pending (for tests and commands). True if idle in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pending() == 0:
                return True
            time.sleep(0.01)
        return self.pending() == 0

    async def await_idle(self, within: float = 30.0) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.pending() == 0:
                return True
            await asyncio.sleep(0.01)
        return self.pending() == 0


class TasksExecutor:
    """Hands jobs to django-tasks; `manage.py db_worker` processes run them."""

    def submit(self, job: Job, run_id: int) -> None:
        from agentsite import tasks

        task = tasks.execute_run if job == "execute" else tasks.resume_run
        task.enqueue(run_id)

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        start_sweeper(loop)


_sweeping: set[asyncio.AbstractEventLoop] = set()


def start_sweeper(loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
    """Every AGENTSITE_SWEEP_SECONDS, the server expires overdue approvals and deals with
    runs that a dead process left behind, so neither needs a cron job."""
    if loop in _sweeping or settings.AGENTSITE_SWEEP_SECONDS <= 0:
        return None
    _sweeping.add(loop)
    task = loop.create_task(_sweep_forever(settings.AGENTSITE_SWEEP_SECONDS))
    task.add_done_callback(lambda _: _sweeping.discard(loop))
    _inprocess._keep_forever(task)
    return task


async def _sweep_forever(every: float) -> None:
    from agentsite import runs
    from agentsite.db import db_hop

    while True:
        await asyncio.sleep(every)
        try:
            await runs.expire_overdue_async()
            await db_hop(runs.recover_stuck_runs)()
        except Exception:
            logger.exception("The sweep of overdue approvals and stuck runs failed")


_inprocess = InProcessExecutor()
_tasks = TasksExecutor()


def get_executor() -> InProcessExecutor | TasksExecutor:
    kind = settings.AGENTSITE_EXECUTOR
    if kind == "inprocess":
        return _inprocess
    if kind == "tasks":
        return _tasks
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"AGENTSITE_EXECUTOR must be 'inprocess' or 'tasks', not {kind!r}.")


def submit(job: Job, run_id: int) -> None:
    get_executor().submit(job, run_id)


def inprocess() -> InProcessExecutor:
    return _inprocess


def wait_for_inprocess_jobs(timeout: float) -> bool:
    """For management commands: in-process jobs run on a daemon thread of the command, so
    exiting at once would kill them half-way. True when none is left (or none can be)."""
    if not isinstance(get_executor(), InProcessExecutor):
        return True
    return _inprocess.wait_idle(timeout=timeout)
