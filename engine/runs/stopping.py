"""Stopping a reply: a run not started yet is cancelled at once; a streaming one is marked, and
the process that runs it cancels the SDK's stream (at once when the Stop came to it, else on
its next read of the mark), keeps what was said and ends the run as cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agents import RunResultStreaming
from asgiref.sync import sync_to_async
from django.utils import timezone

from agentsite.db.hops import db_hop
from conversations.items import is_user_message, message_text, output_view, stopped_output
from conversations.models import Conversation
from engine import events
from engine.models import AgentRun, RunStatus
from engine.runs import errors, final, rows, streaming
from tracing import recording

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from engine.permissions import User


logger = logging.getLogger(__name__)


# How often the runs streaming on a loop read whether their users pressed Stop in another
# process (one read for all of them); a Stop taken by the process that runs one cancels it at
# once (`_streaming`).
STOP_POLL_SECONDS = 1.0
STOPPED_REASON = "Stopped by {who}."
# Runs streaming in this process, and how to stop each, from any thread.
_streaming: dict[int, Callable[[], None]] = {}
# Per event loop: the Stoppers of the runs streaming on it, and the one task that reads their
# marks. A worker streams a hundred runs at once on one loop; each used to read its own mark
# every second (a hop and a query each, about a twelfth of the worker's time then).
_watched: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Stopper]] = (
    weakref.WeakKeyDictionary()
)
_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)


class Stopper:
    """Cancels a streamed run when its user asks (`stop` marks the run): at once when the
    Stop reaches this process, else within `STOP_POLL_SECONDS` (one indexed read a second
    for all the runs streaming on the loop, never a write per token). Knows where the
    response being streamed starts in the run's `streaming.Streamed` text, which the SDK
    drops on a cancel, so that what was said stays."""

    def __init__(
        self, run: AgentRun, result: RunResultStreaming, streamed: streaming.Streamed
    ) -> None:
        self.run_id = run.pk
        # A stop counts from this stream's claim on (a stop that came too late for an
        # earlier stream of the run, which paused meanwhile, does not stop this one).
        self.since = run.updated
        self.result = result
        self.stopped = False
        self.streamed = streamed
        self.response_from = 0
        self.loop = asyncio.get_running_loop()
        _streaming[run.pk] = self._stop_threadsafe
        _watch(self)

    @classmethod
    def watching(
        cls, run: AgentRun, result: RunResultStreaming, streamed: streaming.Streamed
    ) -> Stopper:
        stopper = cls(run, result, streamed)
        if run.stop_requested is not None and run.stop_requested >= stopper.since:
            stopper.stop()
        return stopper

    def heard(self, data: Any) -> None:
        if getattr(data, "type", "") == "response.created":
            # A finished response is in the session already: only this one's text is kept.
            self.response_from = self.streamed.length

    def partial(self) -> str:
        """The text of the response the stop cut short."""
        return self.streamed.text()[self.response_from :]

    def stop(self) -> None:
        if not self.stopped and not self.result.is_complete:
            self.stopped = True
            self.result.cancel()

    def _stop_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop closed: the run is over anyway
            self.loop.call_soon_threadsafe(self.stop)

    def done(self) -> None:
        _streaming.pop(self.run_id, None)
        watched = _watched.get(self.loop)
        if watched is not None and watched.get(self.run_id) is self:
            del watched[self.run_id]


def _watch(stopper: Stopper) -> None:
    """`stopper`'s run is read with the others streaming on its loop, by the loop's one
    watcher (started when there is none)."""
    loop = stopper.loop
    _watched.setdefault(loop, {})[stopper.run_id] = stopper
    watcher = _watchers.get(loop)
    if watcher is None or watcher.done():
        _watchers[loop] = loop.create_task(_watch_loop(loop), name="stop-watcher")


async def _watch_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Every `STOP_POLL_SECONDS`, while runs stream on `loop`: one read of which of them
    were marked to stop since their stream began; those are stopped. Ends when none is left
    (the next Stopper starts another)."""
    try:
        while True:
            await asyncio.sleep(STOP_POLL_SECONDS)
            watched = _watched.get(loop)
            if not watched:
                return
            since = {run_id: stopper.since for run_id, stopper in watched.items()}
            try:
                marked = await db_hop(_stops_requested)(since)
            except Exception:  # a bug, not an outage (those read as nothing marked)
                logger.exception("Reading the streaming runs' stop marks failed")
                continue
            for run_id in marked:
                stopper = watched.get(run_id)
                if stopper is not None:
                    stopper.stop()
    finally:
        if _watchers.get(loop) is asyncio.current_task():
            del _watchers[loop]


def _stops_requested(since: dict[int, Any]) -> list[int]:
    """Which of the runs `since` (run id -> its stream's start) were marked to stop since."""
    try:
        marked = AgentRun.objects.filter(pk__in=since, stop_requested__isnull=False).values_list(
            "pk", "stop_requested"
        )
        return [run_id for run_id, at in marked if at >= since[run_id]]
    except final.FINAL_WRITE_ERRORS:
        return []  # the database is away for a moment: the next read asks again


def stop(run: AgentRun | int, user: User | AnonymousUser | None) -> bool:
    """The conversation's owner stops a reply: a run that has not started (queued, or
    decided and not resumed yet) is cancelled at once, nothing of it executed; a streaming
    one is marked, and the process that runs it cancels the SDK's stream, keeps what was
    already said in the chat and the session, and ends the run as cancelled. False when
    the run had already ended (or paused: a waiting request is withdrawn instead).

    Raises:
        DecisionRefused: the user is not the one the conversation belongs to.
    """
    run_id = run.pk if isinstance(run, AgentRun) else int(run)
    found = (
        AgentRun.objects.filter(pk=run_id)
        .values_list("conversation__owner_id", "conversation_id")
        .first()
    )
    if user is None or not user.is_authenticated or found is None or found[0] != user.pk:
        raise errors.DecisionRefused("Only the person who asked can stop this reply.")
    conversation_id = found[1]
    reason = STOPPED_REASON.format(who=user.get_username())
    if rows.fail_sync(
        run_id,
        reason,
        from_statuses=(RunStatus.QUEUED, RunStatus.RESUMING),
        status=RunStatus.CANCELLED,
    ):
        recording.record_stop(run_id, user.get_username(), timezone.now())
        events.publish_threadsafe(
            [rows.run_updated(run_id, conversation_id, RunStatus.CANCELLED, reason)]
        )
        return True
    now = timezone.now()
    if not AgentRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(stop_requested=now):
        return False
    signal = _streaming.get(run_id)
    if signal is not None:
        signal()  # it streams in this process: no need to wait for its next read
    return True


astop = sync_to_async(stop)


async def end_stopped(
    run: AgentRun, session: Any, stopper: Stopper, result: RunResultStreaming
) -> None:
    """What was said before the Stop stays: the SDK stores no part of a response it was
    cancelled in, so the text streamed so far goes into the session as the agent's message
    (unless the session already ends with it)."""
    partial = stopper.partial()
    try:
        recent = await session.get_items(rows.LOOKBACK_ITEMS)
        added = unanswered_calls(recent)
        said = bool(recent) and message_text(recent[-1]) == partial
        if partial.strip() and not (said and recent[-1].get("role") == "assistant"):
            added.append({"type": "message", "role": "assistant", "content": partial})
        if added:
            await session.add_items(added)
    except Exception:
        logger.exception("Run %s: what was said before its stop was not saved", run.pk)
    who = await db_hop(_stopped_by)(run)
    reason = STOPPED_REASON.format(who=who)
    # Recorded once the stream did stop (a Stop that came as the reply ended stops nothing).
    await db_hop(recording.record_stop)(run.pk, who, timezone.now())
    await final.fail(
        run, reason, result, status=RunStatus.CANCELLED, from_statuses=(RunStatus.RUNNING,)
    )


# A call stopped while it ran (a resumed run's approved call, saved with the pause) has no
# output in the session, which a model refuses on the next turn: it gets this one.
STOPPED_CALL_OUTPUT = (
    "The user stopped the reply while this call was running; it may or may not have completed."
)


def unanswered_calls(items: list[Any]) -> list[dict[str, Any]]:
    """An output for each tool call of the latest turn (since its user message) that has none,
    of the type its kind of call takes (a shell command's, a patch's, a function's)."""
    start = max((i for i, item in enumerate(items) if is_user_message(item)), default=-1)
    turn = items[start + 1 :]
    answered = {answer[0] for item in turn if (answer := output_view(item)) is not None}
    outputs = (stopped_output(item, STOPPED_CALL_OUTPUT) for item in turn)
    return [each for each in outputs if each is not None and each["call_id"] not in answered]


def _stopped_by(run: AgentRun) -> str:
    owner = Conversation.objects.filter(pk=run.conversation_id).values_list(
        "owner__username", flat=True
    )
    return owner.first() or "the user"
