"""`manage.py run_worker`: django-tasks-db's worker, running up to `--concurrency` tasks at once.

`manage.py db_worker` runs one task at a time, and a run is one task from its claim to its
end, model calls included: a worker that waits two seconds for a model waits with its core
idle and every other run queued behind it. This worker claims as django-tasks-db's does (its
`Worker.run`: `get_locked()` + `claim()` in an exclusive transaction, with the same options),
but hands each claimed task on instead of running it, and claims again while fewer than
`--concurrency` are in flight and the runs' loop is not busy computing (its timers late: runs
that are CPU, not waits; then queued runs are left to a worker with CPU to spare):

- a coroutine task (the engine's `execute_run` / `resume_run`) runs on one event loop, in a
  thread of this worker, which uses the process's database hop threads (`hops.adopt`);
- any other task runs in a small thread pool, exactly as `db_worker` runs it.

Each finished task is marked successful or failed, and the task_started / task_finished
signals sent, as `db_worker` does. The heartbeat starts with the worker, before its first
claim. SIGTERM or SIGINT: no more claims, the tasks in flight finish, exit 0; a second one:
exit 1 at once, the tasks in flight marked failed; their runs, left running, are failed by
the other processes' recovery ("interrupted by a restart"), never run again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import threading
import time
from argparse import ArgumentParser, ArgumentTypeError
from concurrent.futures import Future
from inspect import iscoroutinefunction
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.core.management.base import CommandError
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV, run_with_reloader
from django_tasks_db.compat import TaskContext, task_finished, task_started
from django_tasks_db.management.commands import db_worker
from django_tasks_db.models import DBTaskResult

from agentsite.db import hops
from common import heap
from engine import sweeper
from engine.models import ProcessKind

logger = db_worker.logger

# Threads for tasks that are not coroutine functions (other apps' tasks): few, as they are
# not what this worker is for, and each holds a database connection while it runs.
SYNC_TASK_THREADS = 2

# A loop that runs its timers late is busy computing (runs that are CPU, not waits for a
# model): while it is, or was within the window, the worker claims nothing more, so queued
# runs go to a worker with CPU to spare instead of waiting behind this one's. Runs that wait
# leave the loop idle, and the worker claims up to its concurrency at once.
LOOP_TICK_SECONDS = 0.01
LOOP_BUSY_LAG_SECONDS = 0.025
LOOP_BUSY_WINDOW_SECONDS = 0.25


class ConcurrentWorker(db_worker.Worker):
    """django-tasks-db's `Worker`, whose `run_task` starts the task it is given and returns
    (waiting first while `concurrency` tasks are in flight) instead of running it through."""

    def __init__(
        self,
        *,
        concurrency: int,
        max_tasks: int | None,
        busy_lag: float = LOOP_BUSY_LAG_SECONDS,
        **options: Any,
    ) -> None:
        # The base counts tasks as they end; here they are counted as they are claimed.
        super().__init__(max_tasks=None, **options)
        self.concurrency = concurrency
        # How late a tick of the runs' loop is busy; 0: never (claims up to the concurrency).
        self.busy_lag = busy_lag
        self.claim_limit = max_tasks
        self._claimed = 0
        self._signalled = False
        self._in_flight: dict[Any, DBTaskResult] = {}
        self._room = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="agentsite-worker-loop", daemon=True
        )
        self._threads = hops.HopExecutor(
            max_workers=SYNC_TASK_THREADS, thread_name_prefix="agentsite-worker-sync"
        )
        # When the loop last ran its tick, and last ran it late (`loop_busy`).
        self._ticked_at = time.monotonic()
        self._late_at = 0.0

    # --- the worker's life ------------------------------------------------------------------

    def run(self) -> None:
        """Beat, claim until stopped (`Worker.run`), then let the tasks in flight finish."""
        sweeper.start_thread(ProcessKind.WORKER)
        hops.adopt(self._loop)
        self._loop_thread.start()
        asyncio.run_coroutine_threadsafe(self._tick(), self._loop)
        logger.info(
            "Running up to %d tasks at once (worker_id=%s)", self.concurrency, self.worker_id
        )
        try:
            try:
                super().run()
            except Exception:
                # A claim failed (the database went away): the runs in flight may still end,
                # so they are given the drain a signal would give them before it exits.
                logger.exception("Claiming failed; finishing the tasks in flight, then exiting")
                self.running = False
                self._drain()
                raise
            self._drain()
        except SystemExit as exiting:
            self._fail_in_flight(exiting)
            raise
        else:
            self._close_loop()

    def stop(self) -> None:
        """Claim no more; the tasks in flight finish, then `run` returns."""
        self.running = False
        with self._room:
            self._room.notify_all()

    def shutdown(self, signum: int, frame: FrameType | None) -> None:
        if self._signalled:
            logger.warning(
                "Received %s - exiting now; %d task(s) in flight are failed, and their runs "
                "left to the other processes' recovery.",
                signal.strsignal(signum),
                self.in_flight(),
            )
            self.reset_signals()
            # Their runs make no more progress here (a write already in a hop thread may
            # still land): what they left is the others' recovery's.
            self._loop.call_soon_threadsafe(self._loop.stop)
            sys.exit(1)
        self._signalled = True
        logger.warning(
            "Received %s - claiming no more tasks; waiting for the %d in flight "
            "(send it again to exit at once).",
            signal.strsignal(signum),
            self.in_flight(),
        )
        self.stop()

    def in_flight(self) -> int:
        with self._room:
            return len(self._in_flight)

    # --- one task ---------------------------------------------------------------------------

    def run_task(self, db_task_result: DBTaskResult) -> None:
        """Start the claimed task; return once fewer than `concurrency` are in flight and
        the runs' loop is not busy computing (`loop_busy`), or the worker is stopping, so
        `Worker.run` claims the next one only then."""
        with self._room:
            self._in_flight[db_task_result.id] = db_task_result
        self._claimed += 1
        work: Future[None]
        if self._is_coroutine(db_task_result):
            work = asyncio.run_coroutine_threadsafe(self._run_on_loop(db_task_result), self._loop)
        else:
            work = self._threads.submit(
                functools.partial(db_worker.Worker.run_task, self, db_task_result)
            )
        work.add_done_callback(functools.partial(self._ended, db_task_result))
        if self.claim_limit is not None and self._claimed >= self.claim_limit:
            logger.info(
                "Claimed maximum tasks (%d) on worker=%s - finishing them, then exiting.",
                self._claimed,
                self.worker_id,
            )
            self.running = False
        with self._room:
            while self.running and len(self._in_flight) >= self.concurrency:
                self._room.wait(timeout=1.0)
        # (A claim comes before this check: a busy worker that was idle claims one more.)
        while self.running and self.in_flight() and self.loop_busy():
            time.sleep(LOOP_TICK_SECONDS)

    def loop_busy(self) -> bool:
        """Whether the runs' loop is computing now (its tick is overdue) or was lately."""
        if not self.busy_lag:
            return False
        now = time.monotonic()
        overdue = now - self._ticked_at > LOOP_TICK_SECONDS + self.busy_lag
        return overdue or now - self._late_at < LOOP_BUSY_WINDOW_SECONDS

    async def _tick(self) -> None:
        """On the runs' loop: note each tick, and each tick that came late."""
        while True:
            before = time.monotonic()
            await asyncio.sleep(LOOP_TICK_SECONDS)
            self._ticked_at = now = time.monotonic()
            if now - before - LOOP_TICK_SECONDS > self.busy_lag:
                self._late_at = now

    @staticmethod
    def _is_coroutine(db_task_result: DBTaskResult) -> bool:
        try:
            return iscoroutinefunction(db_task_result.task.func)
        except (ImportError, SuspiciousOperation):
            # Not importable: `Worker.run_task` (in a thread) marks it failed, as db_worker does.
            return False

    async def _run_on_loop(self, db_task_result: DBTaskResult) -> None:
        """`Worker.run_task` for a coroutine task: the task awaited on this loop, the
        database work around it (the signals' receivers, the result's row) in hop threads."""
        try:
            task = db_task_result.task
            task_result = db_task_result.task_result
            backend_type = task.get_backend()
            await hops.db_hop(task_started.send)(sender=backend_type, task_result=task_result)
            args = list(task_result.args)
            if task.takes_context:
                args.insert(0, TaskContext(task_result=task_result))
            return_value = await task.func(*args, **task_result.kwargs)
            await hops.db_hop(self._succeeded)(db_task_result, backend_type, return_value)
        except BaseException as error:
            await hops.db_hop(self._failed)(db_task_result, error)
            if not isinstance(error, Exception):
                raise

    @staticmethod
    def _succeeded(db_task_result: DBTaskResult, backend_type: Any, return_value: Any) -> None:
        db_task_result.set_successful(return_value)
        task_finished.send(sender=backend_type, task_result=db_task_result.task_result)

    @staticmethod
    def _failed(db_task_result: DBTaskResult, error: BaseException) -> None:
        db_task_result.set_failed(error)
        try:
            sender = type(db_task_result.task.get_backend())
            task_result = db_task_result.task_result
        except (ImportError, SuspiciousOperation):
            logger.exception("Task id=%s failed unexpectedly", db_task_result.id)
        else:
            task_finished.send(sender=sender, task_result=task_result)

    def _ended(self, db_task_result: DBTaskResult, work: Future[None]) -> None:
        if not work.cancelled() and work.exception() is not None:
            # Only the recording itself can fail here (the task's own failure is recorded).
            logger.error(
                "Task id=%s: its result could not be recorded",
                db_task_result.id,
                exc_info=work.exception(),
            )
        with self._room:
            self._in_flight.pop(db_task_result.id, None)
            self._room.notify_all()

    # --- stopping ---------------------------------------------------------------------------

    def _drain(self) -> None:
        with self._room:
            if self._in_flight:
                logger.info("Waiting for %d task(s) in flight", len(self._in_flight))
            while self._in_flight:
                self._room.wait(timeout=1.0)

    def _close_loop(self) -> None:
        """Everything has ended: the loop's leftovers (a run's watchers) are cancelled and
        the loop closed, as `asyncio.run` ends its loop."""

        async def wind_down() -> None:
            current = asyncio.current_task()
            leftovers = [task for task in asyncio.all_tasks() if task is not current]
            for task in leftovers:
                task.cancel()
            await asyncio.gather(*leftovers, return_exceptions=True)
            await asyncio.get_running_loop().shutdown_asyncgens()

        asyncio.run_coroutine_threadsafe(wind_down(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=10)
        self._loop.close()

    def _fail_in_flight(self, exiting: SystemExit) -> None:
        """Exiting at once: the tasks in flight are failed, as `db_worker` fails the task it
        was running when its second signal came."""
        with self._room:
            left = list(self._in_flight.values())
        for db_task_result in left:
            try:
                db_task_result.set_failed(exiting)
            except Exception:
                logger.exception("Task id=%s could not be marked failed", db_task_result.id)


def valid_concurrency(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ArgumentTypeError("Must be at least 1")
    return number


class Command(db_worker.Command):
    help = (
        "Run a database background worker that runs up to --concurrency tasks at once "
        "(coroutine tasks on one event loop)"
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--concurrency",
            type=valid_concurrency,
            default=None,
            help="The most tasks in flight at once (default: AGENTSITE_WORKER_CONCURRENCY, "
            f"{settings.AGENTSITE_WORKER_CONCURRENCY})",
        )
        parser.add_argument(
            "--busy-lag",
            type=float,
            default=LOOP_BUSY_LAG_SECONDS,
            metavar="SECONDS",
            help="How late a 10 ms tick of the runs' loop means it is busy computing, so the "
            "worker claims no more while it is (default: %(default)s); 0: never busy, claim "
            "up to the concurrency whatever the load (a machine shared with other work).",
        )

    def handle(  # type: ignore[override]
        self,
        *,
        verbosity: int,
        queue_name: str,
        exclude_queues: str,
        reload: bool,
        batch: bool,
        concurrency: int | None,
        busy_lag: float,
        **options: Any,
    ) -> None:
        self.configure_logging(verbosity)
        if concurrency is None:
            concurrency = settings.AGENTSITE_WORKER_CONCURRENCY
            if concurrency < 1:
                raise CommandError(f"AGENTSITE_WORKER_CONCURRENCY={concurrency} must be at least 1")
        if reload and batch:
            logger.warning(
                "--reload and --batch cannot be specified together. Disabling autoreload."
            )
            reload = False
        queue_names = queue_name.split(",")
        excluded_queue_names = exclude_queues.split(",") if exclude_queues else []
        if excluded_queue_names and "*" not in queue_names:
            raise CommandError("--exclude-queues can only be used with --queue-name=*")
        worker = ConcurrentWorker(
            concurrency=concurrency,
            queue_names=queue_names,
            excluded_queue_names=excluded_queue_names,
            batch=batch,
            interval=options["interval"],
            backend_name=options["backend_name"],
            startup_delay=options["startup_delay"],
            max_tasks=options["max_tasks"],
            worker_id=options["worker_id"],
            busy_lag=max(0.0, busy_lag),
        )
        if reload:
            if os.environ.get(DJANGO_AUTORELOAD_ENV) == "true":
                worker.configure_signals()
            run_with_reloader(worker.run)
        else:
            worker.configure_signals()
            # What the worker imported lives as long as it: out of the collector's sight.
            heap.freeze_startup_heap()
            worker.run()
