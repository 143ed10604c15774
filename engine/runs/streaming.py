"""The text a run has streamed so far: each delta says where it starts, and the run's row holds a
prefix of it at most every STREAMED_SAVE_SECONDS, so a reload shows what was said."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from engine import events
from engine.models import AgentRun, RunStatus
from engine.runs import final

logger = logging.getLogger(__name__)


# How often, at most, a streaming run stores what it has written so far (a reload shows it).
STREAMED_SAVE_SECONDS = 0.5


@dataclass
class Streamed:
    """The text a run has streamed since it started or resumed (one "segment", numbered by
    the run's pause count). Each delta it publishes says where it starts (`at`, in code
    points) and `AgentRun.streamed_text` holds a prefix of it, so a page that renders the
    stored prefix appends only what it lacks (static/agentsite/chat.js)."""

    saved_at: float
    parts: list[str] = field(default_factory=list)
    length: int = 0
    saved_length: int = 0

    def add(self, delta: str) -> None:
        self.parts.append(delta)
        self.length += len(delta)

    def due(self) -> bool:
        now = time.monotonic()
        if self.length == self.saved_length or now - self.saved_at < STREAMED_SAVE_SECONDS:
            return False
        self.saved_at, self.saved_length = now, self.length
        return True

    def text(self) -> str:
        joined = "".join(self.parts)
        self.parts = [joined]
        return joined


def save_streamed(run_id: int, text: str) -> None:
    try:
        AgentRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(streamed_text=text)
    except final.FINAL_WRITE_ERRORS as exc:
        # Only what a reload shows: the run goes on, and the next save catches up.
        logger.warning("Run %s: what it streamed could not be stored (%r).", run_id, exc)


class Deltas:
    """A run's text deltas on their way to its conversation's pages, in order and never
    waited for by the stream: a delta goes out at once when none is being sent, and the
    deltas that arrive while one is (the channel layer's round trip) go out together as one,
    from where the first of them starts. A model that writes slowly gets a message per
    delta, as before; a worker streaming many runs at once sends fewer, larger messages
    instead of queueing a round trip per word (issue 28: a tenth of a worker's time at 100
    runs was these round trips)."""

    def __init__(self, run_id: int, conversation_id: int, segment: int) -> None:
        self.run_id = run_id
        self.conversation_id = conversation_id
        self.segment = segment
        self.pending: list[str] = []
        self.at = 0
        self.sender: asyncio.Task[None] | None = None

    def add(self, delta: str, at: int) -> None:
        """Send `delta`, which starts at `at` in the streamed text."""
        if not self.pending:
            self.at = at
        self.pending.append(delta)
        if self.sender is None or self.sender.done():
            self.sender = asyncio.get_running_loop().create_task(self._send())

    async def flush(self) -> None:
        """Wait until every delta added is sent (before the run's next event, which the
        pages must get after them)."""
        if self.sender is not None:
            await self.sender

    async def _send(self) -> None:
        while self.pending:
            delta, at = "".join(self.pending), self.at
            self.pending = []
            # `publish` never raises, and waits for a layer that does not answer a bounded time.
            await events.publish(
                [
                    events.TextDelta(
                        run_id=self.run_id,
                        conversation_id=self.conversation_id,
                        delta=delta,
                        at=at,
                        segment=self.segment,
                    )
                ]
            )
