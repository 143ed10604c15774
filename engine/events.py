"""What the run engine tells the pages, through channel-layer groups.

A push is a hint, never the truth: the channel layer delivers at most once, so every page
re-reads the database when its socket (re)connects. Payloads are pydantic models, so what a
consumer receives is validated on both ends.

The channel message `type` is the event's `type` ("approval.created" is handled by a
consumer's `approval_created` method), and the payload sits under "event".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from pydantic import BaseModel

from agentsite.db import hops
from engine import serverloop

if TYPE_CHECKING:
    from approvals.models import ApprovalRequest

logger = logging.getLogger(__name__)

INBOX_GROUP = "inbox"


def conversation_group(conversation_id: int) -> str:
    return f"conversation.{conversation_id}"


def user_group(user_id: int) -> str:
    """The group of every open socket of one user (see `engine.access`)."""
    return f"user.{user_id}"


# Channels accepts group names of ASCII letters, digits, hyphens, underscores and periods,
# shorter than 100 characters. The SDK does not validate trace ids, so some may not fit.
_TRACE_ID = re.compile(r"[A-Za-z0-9_.-]{1,90}")


def trace_group(trace_id: str) -> str | None:
    """The group of a trace's open pages, or None when its id cannot name a group."""
    return f"trace.{trace_id}" if _TRACE_ID.fullmatch(trace_id) else None


class Event(BaseModel):
    type: str

    def groups(self) -> list[str]:
        raise NotImplementedError


class ApprovalCreated(Event):
    type: Literal["approval.created"] = "approval.created"
    request_id: int
    run_id: int
    conversation_id: int
    agent_name: str
    tool_name: str
    call: str
    created: datetime
    expires_at: datetime
    # The kind of tool and its MCP server, for the inbox's filters (absent from an event a
    # process of the previous release sent: a function tool's, as then).
    kind: str = "function"
    server: str = ""

    @classmethod
    def for_request(cls, request: ApprovalRequest) -> ApprovalCreated:
        """The event of a stored request (with its run loaded, for the conversation)."""
        return cls(
            request_id=request.pk,
            run_id=request.run_id,
            conversation_id=request.run.conversation_id,
            agent_name=request.agent_name,
            tool_name=request.tool_name,
            call=request.call_display(),
            created=request.created,
            expires_at=request.expires_at,
            kind=request.kind,
            server=request.server,
        )

    def groups(self) -> list[str]:
        return [INBOX_GROUP, conversation_group(self.conversation_id)]


class ApprovalDecided(Event):
    type: Literal["approval.decided"] = "approval.decided"
    request_id: int
    run_id: int
    conversation_id: int
    status: str
    decided_by: str | None
    decided_at: datetime | None
    message: str = ""

    def groups(self) -> list[str]:
        return [INBOX_GROUP, conversation_group(self.conversation_id)]


class ApprovalWithdrawn(ApprovalDecided):
    """The person who asked withdrew the request: it leaves every open inbox."""

    type: Literal["approval.withdrawn"] = "approval.withdrawn"  # type: ignore[assignment]


class RunUpdated(Event):
    type: Literal["run.updated"] = "run.updated"
    run_id: int
    conversation_id: int
    status: str
    error: str = ""

    def groups(self) -> list[str]:
        return [conversation_group(self.conversation_id)]


class TextDelta(Event):
    type: Literal["run.text_delta"] = "run.text_delta"
    run_id: int
    conversation_id: int
    delta: str
    # Where the delta starts in the text streamed since the run started or resumed (in code
    # points), and which stretch that is (the run's pause count): a page that shows the
    # stored prefix (`AgentRun.streamed_text`) appends only what it lacks.
    at: int = 0
    segment: int = 0

    def groups(self) -> list[str]:
        return [conversation_group(self.conversation_id)]


class ConversationChanged(Event):
    """The conversation's messages changed other than by a run: another version shown, an
    exchange undone, the conversation cleared. Its open pages re-read them."""

    type: Literal["conversation.changed"] = "conversation.changed"
    conversation_id: int

    def groups(self) -> list[str]:
        return [conversation_group(self.conversation_id)]


def changed_on_commit(conversation_id: int) -> None:
    """Tell the conversation's open pages, once the change is committed, to re-read it."""
    event = ConversationChanged(conversation_id=conversation_id)
    transaction.on_commit(lambda: publish_threadsafe([event]))


class TraceUpdated(Event):
    """The exporter stored spans of this trace (a hint: pages re-read the trace)."""

    type: Literal["trace.updated"] = "trace.updated"
    trace_id: str
    span_count: int
    status: str

    def groups(self) -> list[str]:
        group = trace_group(self.trace_id)
        return [group] if group else []


class UserLoggedOut(Event):
    """A session of this user ended with a logout: its sockets close."""

    type: Literal["user.logged_out"] = "user.logged_out"
    user_id: int
    session_key: str | None = None

    def groups(self) -> list[str]:
        return [user_group(self.user_id)]


class UserChanged(Event):
    """This user, her groups or her permissions changed: her sockets check before they push."""

    type: Literal["user.changed"] = "user.changed"
    user_id: int

    def groups(self) -> list[str]:
        return [user_group(self.user_id)]


def traces_stored(stored: Iterable[Any]) -> None:
    """The trace exporter's listener (wired in `engine.apps`): each stored trace's open pages
    hear of it. `stored` holds `tracing.exporter.StoredTrace`s."""
    publish_threadsafe(
        TraceUpdated(trace_id=item.trace_id, status=item.status, span_count=item.span_count)
        for item in stored
    )


# While the channel layer fails (Redis down), events are dropped without trying for a while,
# so that a streaming run does not wait on a dead layer for each word, and the failure is
# logged once, not once per event. The wait doubles while it keeps failing, up to the most.
PUBLISH_SECONDS = 2.0
RETRY_SECONDS = 1.0
RETRY_MOST_SECONDS = 10.0


class _Outage:
    failing = False
    retry_after = 0.0  # time.monotonic() before which nothing is tried
    wait = RETRY_SECONDS


_outage = _Outage()


async def publish(events: Iterable[Event]) -> None:
    """Send each event to its groups. Never raises, and never waits more than
    `PUBLISH_SECONDS` on a layer that does not answer: a lost hint costs nothing (pages
    re-read the database), so while the layer fails, events are dropped."""
    layer = get_channel_layer()
    if layer is None:
        return
    for event in events:
        message = {"type": event.type, "event": event.model_dump(mode="json")}
        for group in event.groups():
            if _outage.failing and time.monotonic() < _outage.retry_after and _still_down(layer):
                return  # dropped: the layer failed a moment ago
            try:
                async with asyncio.timeout(PUBLISH_SECONDS):
                    await layer.group_send(group, message)
            except Exception as error:
                _publish_failed(event, group, error)
                return
            if _outage.failing:
                _outage.failing, _outage.wait = False, RETRY_SECONDS
                logger.info("Publishing events again: the channel layer answers.")


def _still_down(layer: Any) -> bool:
    """Whether the layer may still be down: `engine.layer.ChannelLayer` knows when another
    call (a socket joining its groups) reached Redis since, and then events go out at once."""
    return bool(getattr(layer, "down", True))


def _publish_failed(event: Event, group: str, error: Exception) -> None:
    if not _outage.failing:
        _outage.failing = True
        logger.warning(
            "Could not publish %s to %s (%s: %s); events are dropped until the channel layer "
            "answers (pages re-read the database meanwhile).",
            event.type,
            group,
            error.__class__.__name__,
            error,
        )
    else:
        _outage.wait = min(_outage.wait * 2, RETRY_MOST_SECONDS)
    _outage.retry_after = time.monotonic() + _outage.wait


def publish_sync(events: Iterable[Event]) -> None:
    """`publish` from synchronous code, waiting until the events are sent. Code a loop waits
    on (a `db_hop`'s work, a sync view under ASGI) sends them from that loop, whose
    channel-layer connections it shares; a thread no loop waits on (a worker's trace
    exporter, the heartbeat, a command) sends them from the process's publishing loop
    (`_publishing_loop`)."""
    events = list(events)
    if not events:
        return
    if hops.callback_loop() is not None:
        async_to_sync(publish)(events)
        return
    loop = _publishing_loop()
    sent = asyncio.run_coroutine_threadsafe(publish(events), loop)
    # Each group's send is bounded (`publish`); a layer slower than that on every group is
    # not waited for to the end.
    concurrent.futures.wait([sent], timeout=PUBLISH_SECONDS * 2)


# Tasks scheduled by `publish_threadsafe` on the caller's own loop, referenced until done.
_scheduled: set[asyncio.Future[None]] = set()


def publish_threadsafe(events: Iterable[Event]) -> None:
    """`publish` from any thread, e.g. the SDK's trace processor thread. Never raises, never
    waits for delivery.

    The in-memory channel layer is only safe on its own event loop: while the server's loop
    runs, the events are sent from that loop. Otherwise they go from this thread's running
    loop, if it has one, else through `publish_sync`.
    """
    try:
        events = list(events)
        if not events:
            return
        server = serverloop.current()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if server is not None and server.is_running() and server is not running:
            asyncio.run_coroutine_threadsafe(publish(events), server)
        elif running is not None:
            task = running.create_task(publish(events))
            _scheduled.add(task)
            task.add_done_callback(_scheduled.discard)
        else:
            publish_sync(events)
    except Exception:
        logger.exception("Could not publish events from a thread")


class _Publishing:
    lock = threading.Lock()
    loop: asyncio.AbstractEventLoop | None = None


def _publishing_loop() -> asyncio.AbstractEventLoop:
    """The process's loop for events from threads no loop waits on (`publish_sync`), started
    on first use. It keeps the channel layer's connections from one publish to the next:
    `async_to_sync` from such a thread ran each publish on a new loop, so with Redis a new
    connection each time (a worker's exporter publishes after every batch of spans it
    stores)."""
    with _Publishing.lock:
        if _Publishing.loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="event-publishing", daemon=True).start()
            _Publishing.loop = loop
        return _Publishing.loop
