"""What the run engine tells the pages, through channel-layer groups.

A push is a hint, never the truth: the channel layer delivers at most once, so every page
re-reads the database when its socket (re)connects. Payloads are pydantic models, so what a
consumer receives is validated on both ends.

The channel message `type` is the event's `type` ("approval.created" is handled by a
consumer's `approval_created` method), and the payload sits under "event".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Literal

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from pydantic import BaseModel

logger = logging.getLogger(__name__)

INBOX_GROUP = "inbox"


def conversation_group(conversation_id: int) -> str:
    return f"conversation.{conversation_id}"


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

    def groups(self) -> list[str]:
        return [conversation_group(self.conversation_id)]


async def publish(events: Iterable[Event]) -> None:
    """Send each event to its groups. Never raises: a lost hint costs nothing."""
    layer = get_channel_layer()
    if layer is None:
        return
    for event in events:
        message = {"type": event.type, "event": event.model_dump(mode="json")}
        for group in event.groups():
            try:
                await layer.group_send(group, message)
            except Exception:
                logger.exception("Could not publish %s to %s", event.type, group)


def publish_sync(events: Iterable[Event]) -> None:
    """`publish` from synchronous code; under ASGI it runs on the server's event loop."""
    events = list(events)
    if events:
        async_to_sync(publish)(events)
