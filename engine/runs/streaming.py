"""The text a run has streamed so far: each delta says where it starts, and the run's row holds a
prefix of it at most every STREAMED_SAVE_SECONDS, so a reload shows what was said."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

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
