"""Outbound sending, written once for the site's three senders: webhooks' deliveries
(`webhooks/delivery.py`), notifications' emails (`notifications/sending.py`) and the spans
forwarded to an OpenTelemetry collector (`tracing/otlp.py`). Each keeps what is its own (what
it sends, what it logs, which answers it retries); this module keeps the mechanism.

Waits. The wait before the next attempt is jittered ±20 %, so that what failed together is
not tried again at the same instant: a step of a table (the last repeats) after a number of
failed attempts, until a most (`retry_at`, `stepped_backoff`), or a first wait that doubles
(`doubling_backoff`).

Claims. An outbox's row is claimed (one conditional UPDATE, by its app) for a `lease` that
outlasts the network waits its sending may make; past it, another process may claim it
again: the one that claimed it died.

The POST. `opener` follows no redirect: a redirect is an answer that is not 2xx, and what
is posted is never sent on to another address. `refusal` is what such an answer said. It
connects only to addresses `common.destinations` allows (public ones, and the private hosts
a deployment named), checked on the address it connects to, and through no proxy (the
environment's `http_proxy` would connect it to an address the check did not see).

Rounds. An outbox's rows are written in the transaction of what they announce; sending
happens elsewhere, by rounds an `OutboxSender` runs:
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
import http.client
import logging
import random
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from common import destinations

logger = logging.getLogger(__name__)

Enqueue = Callable[[datetime | None], None]


# --- waits and claims -------------------------------------------------------------------------


def jittered(seconds: float) -> float:
    """`seconds`, ±20 %."""
    return seconds * random.uniform(0.8, 1.2)


def stepped_backoff(steps: Sequence[float], failures: int) -> timedelta:
    """The wait after `failures` failed attempts: the step of that number in `steps` (the
    last repeats; 60 s when there are none), jittered."""
    step = steps[min(failures, len(steps)) - 1] if steps else 60.0
    return timedelta(seconds=jittered(step))


def retry_at(failures: int, *, most: int, steps: Sequence[float], now: datetime) -> datetime | None:
    """When to try again after `failures` failed attempts (`stepped_backoff`); None once
    `most` attempts were made: failed for good."""
    if failures >= most:
        return None
    return now + stepped_backoff(steps, failures)


def doubling_backoff(first: float, retry: int) -> float:
    """Seconds to wait before retry number `retry` (0 the first): `first`, doubling each time,
    jittered."""
    return jittered(first * 2**retry)


def lease(timeout: float, *, waits: int, margin: float) -> timedelta:
    """How long a claimed row is its process's: `waits` network waits of `timeout` seconds
    each, and `margin` more. Past it, another process may claim it again."""
    return timedelta(seconds=waits * timeout + margin)


# --- the POST ---------------------------------------------------------------------------------


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer that is not 2xx (`HTTPError`): the POST is not sent on to
    another address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _CheckedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = destinations.connect


class _CheckedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = destinations.connect


class CheckedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_CheckedHTTPConnection, req)


class CheckedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_CheckedHTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


# Shared by every sender's threads: its handlers keep no state between requests.
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), CheckedHTTPHandler, CheckedHTTPSHandler, NoRedirect
)


def refusal(refused: urllib.error.HTTPError, limit: int) -> str:
    """What an answer that is not 2xx said: its status and reason, and the first `limit`
    bytes of its body, as text. Closes it."""
    with contextlib.closing(refused):
        said = refused.read(limit).decode("utf-8", "replace").strip()
    return f"HTTP {refused.code} {refused.reason}" + (f": {said}" if said else "")


# --- rounds -----------------------------------------------------------------------------------


def release_connection() -> None:
    """Give this thread's connection back before waiting on the network (not inside a
    transaction: then it is the caller's)."""
    if not connection.in_atomic_block:
        connection.close()


class _Timer:
    def __init__(self, sender: OutboxSender, loop: asyncio.AbstractEventLoop) -> None:
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


class OutboxSender:
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
