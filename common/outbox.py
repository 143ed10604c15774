"""Who sends what an outbox holds (webhooks' deliveries, notifications' emails), written once.

An outbox's rows are written in the transaction of what they announce; sending happens
elsewhere, by rounds a `Sender` runs:
- with the "tasks" executor, a task is enqueued in that very transaction (`announce`: the
  task queue's rows live beside ours, so both commit or neither; its enqueuer is given at
  startup, `configure`);
- with "inprocess", a timer on the web server's loop (`start_timer`, from the engine's
  `server_loop_started`) runs a round every poll period, and as soon as a transaction that
  wrote rows commits (`announce`), or at the time a later row falls due;
- and, in either mode, the app's management command runs rounds from cron.
A round runs on a thread of its own, never on the loop's executor (the process's database hop
threads, which a network wait must never hold), and closes its thread's connections after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

logger = logging.getLogger(__name__)

Enqueue = Callable[[datetime | None], None]


def release_connection() -> None:
    """Give this thread's connection back before waiting on the network (not inside a
    transaction: then it is the caller's)."""
    if not connection.in_atomic_block:
        connection.close()


class _Timer:
    def __init__(self, sender: Sender, loop: asyncio.AbstractEventLoop) -> None:
        self.sender = sender
        self.loop = loop
        self.wake = asyncio.Event()
        self.thread = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=sender.thread_name
        )
        self.task: asyncio.Task[None] | None = None

    def wake_at(self, at: datetime | None) -> None:
        delay = 0.0 if at is None else max(0.0, (at - timezone.now()).total_seconds())
        with contextlib.suppress(RuntimeError):  # the loop closed
            self.loop.call_soon_threadsafe(self._wake_after, delay)

    def _wake_after(self, delay: float) -> None:
        if delay <= 0:
            self.wake.set()
        else:
            self.loop.call_later(delay, self.wake.set)

    async def run(self, every: float) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), every)
            self.wake.clear()
            try:
                await self.loop.run_in_executor(self.thread, self.sender.round_on_thread)
            except Exception:
                logger.exception("[non-fatal] %s: a sending round failed", self.sender.label)


class Sender:
    """The rounds of one outbox: `round()` sends what is due (on its own thread), every
    `settings.<poll_setting>` seconds on a web server's loop in "inprocess" mode (0: never;
    cron then), and when `announce` says rows were written."""

    def __init__(
        self, *, label: str, round: Callable[[], Any], poll_setting: str, thread_name: str
    ) -> None:
        self.label = label
        self.round = round
        self.poll_setting = poll_setting
        self.thread_name = thread_name
        self.enqueue: Enqueue | None = None
        self._timers: dict[asyncio.AbstractEventLoop, _Timer] = {}

    def configure(self, *, enqueue: Enqueue) -> None:
        """The task enqueuer for the "tasks" mode (once, at startup: the app's `ready`)."""
        self.enqueue = enqueue

    def announce(self, at: datetime | None = None) -> None:
        """Rows written in the current transaction are due at `at` (None: now): have them
        sent. A row nobody was told of is still sent by the next round."""
        if at is not None and at <= timezone.now():
            at = None
        if settings.AGENTSITE_EXECUTOR == "tasks":
            if self.enqueue is not None:
                self.enqueue(at)
            return
        transaction.on_commit(functools.partial(self.wake_timers, at))

    def round_on_thread(self) -> None:
        try:
            self.round()
        finally:
            connections.close_all()

    def wake_timers(self, at: datetime | None = None) -> None:
        """Have this process's timers run a round now (or at `at`): from any thread."""
        for timer in list(self._timers.values()):
            timer.wake_at(at)

    def start_timer(self, loop: asyncio.AbstractEventLoop) -> _Timer | None:
        """Send on `loop`'s timer (the "inprocess" mode's web server); None when it already
        does, when workers send ("tasks") or when polling is off."""
        every = float(getattr(settings, self.poll_setting))
        if loop in self._timers or settings.AGENTSITE_EXECUTOR != "inprocess" or every <= 0:
            return None
        timer = _Timer(self, loop)
        self._timers[loop] = timer
        timer.task = loop.create_task(timer.run(every))
        timer.task.add_done_callback(lambda _: self._timers.pop(loop, None))
        return timer

    def on_server_loop(self, sender: Any, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        """A receiver of `engine.signals.server_loop_started`."""
        self.start_timer(loop)

    def stop_timer(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
        """Stop sending on `loop`'s timer (tests; a server's loop ends with its process).
        Call it on `loop`; returns the cancelled task, to await."""
        timer = self._timers.pop(loop, None)
        if timer is None or timer.task is None:
            return None
        timer.task.cancel()
        timer.thread.shutdown(wait=False)
        return timer.task
