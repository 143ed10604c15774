"""Where runs execute. The executor knows jobs by name and run id, nothing of the engine:
the function that runs a job, and the one that enqueues it for workers, are given to it at
startup (`engine.apps.EngineConfig.ready`, the composition root).

- "inprocess" (the default): an asyncio task on the server's event loop, so a run streams to
  the pages of the same process with no other moving part. Outside a server (a management
  command, a test, the admin under WSGI) the tasks go to one background loop of this
  process instead. Tasks are kept referenced until done.
- "tasks": Django's Tasks framework with the database backend (django-tasks-db); workers in
  separate processes (`manage.py run_worker`, many runs at once each) pick runs up, so runs
  survive a web process restart and scale out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from engine import serverloop

Job = Literal["execute", "resume"]
Runner = Callable[[Job, int], Awaitable[None]]
Enqueuer = Callable[[Job, int], None]
LoopHook = Callable[[asyncio.AbstractEventLoop], object]


class _Wiring:
    runner: Runner | None = None
    enqueue: Enqueuer | None = None
    on_server_loop: list[LoopHook] = []


_wiring = _Wiring()


def configure(*, runner: Runner, enqueue: Enqueuer, on_server_loop: LoopHook | None = None) -> None:
    """Give the executor the engine's job runner and task enqueuer (once, at startup)."""
    _wiring.runner = runner
    _wiring.enqueue = enqueue
    _wiring.on_server_loop = [on_server_loop] if on_server_loop else []


def _runner() -> Runner:
    if _wiring.runner is None:
        raise ImproperlyConfigured("The executor has no job runner: is 'engine' installed?")
    return _wiring.runner


class InProcessExecutor:
    def __init__(self) -> None:
        self._background_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: dict[asyncio.Task[None] | concurrent.futures.Future[None], int] = {}
        self._closing = False

    def submit(self, job: Job, run_id: int) -> None:
        if self._closing:
            # The process is shutting down: the job is left to the next process's recovery
            # (the run stays queued or resuming, nothing of it executed).
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        target = serverloop.current()
        if target is None:
            target = running if running is not None else self._get_background_loop()
        work = _runner()(job, run_id)
        if target is running:
            self._keep(target.create_task(work), run_id)  # type: ignore[arg-type]
        else:
            future: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
                work,  # type: ignore[arg-type]
                target,
            )
            self._keep(future, run_id)

    def _keep(self, work: Any, run_id: int) -> None:
        with self._lock:
            self._pending[work] = run_id
        work.add_done_callback(self._forget)

    def _forget(self, work: Any) -> None:
        with self._lock:
            self._pending.pop(work, None)

    async def drain(self, grace: float) -> list[int]:
        """Shutting down: start no new job and give the running ones `grace` seconds to end.
        Returns the run ids of the jobs still going (then `cancel_pending` ends them)."""
        self._closing = True
        await self.await_idle(within=grace)
        with self._lock:
            return sorted(set(self._pending.values()))

    def cancel_pending(self) -> int:
        with self._lock:
            left = list(self._pending)
        for work in left:
            work.cancel()
        return len(left)

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
    """Hands jobs to Django's Tasks framework; `manage.py run_worker` processes run them."""

    def submit(self, job: Job, run_id: int) -> None:
        if _wiring.enqueue is None:
            raise ImproperlyConfigured("The executor has no task enqueuer: is 'engine' installed?")
        _wiring.enqueue(job, run_id)


_inprocess = InProcessExecutor()
_tasks = TasksExecutor()


def get_executor() -> InProcessExecutor | TasksExecutor:
    kind = settings.AGENTSITE_EXECUTOR
    if kind == "inprocess":
        return _inprocess
    if kind == "tasks":
        return _tasks
    raise ImproperlyConfigured(f"AGENTSITE_EXECUTOR must be 'inprocess' or 'tasks', not {kind!r}.")


def submit(job: Job, run_id: int) -> None:
    get_executor().submit(job, run_id)


def bind_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The server's loop is known (asgi.py calls this on each connection): in-process jobs
    run on it from now on, and the hooks given at startup (the sweeper) start on it."""
    if serverloop.bind(loop):
        for hook in _wiring.on_server_loop:
            hook(loop)


def inprocess() -> InProcessExecutor:
    return _inprocess


def wait_for_inprocess_jobs(timeout: float) -> bool:
    """For management commands: in-process jobs run on a daemon thread of the command, so
    exiting at once would kill them half-way. True when none is left (or none can be)."""
    if not isinstance(get_executor(), InProcessExecutor):
        return True
    return _inprocess.wait_idle(timeout=timeout)
