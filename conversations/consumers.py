"""The chat page's socket: the run engine's events for one conversation, as htmx fragments.

- `run.text_delta`: the words, escaped, appended to `#run-<id>-text`.
- `run.updated`, `approval.created`, `approval.decided`: the run's block `#run-<id>`, rendered
  from the database with the template the page uses. A new run (queued) is put into the
  page's slot after the previous run, so it arrives before its first word does.

Pushes are hints: the page re-fetches its message list on every (re)connect, and whenever a
push names a block that it does not have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from django.template.loader import render_to_string
from django.utils.html import format_html

from conversations import feedback
from conversations.models import Conversation
from conversations.rendering import (
    HISTORY_ITEMS_SHOWN,
    answering,
    display_title,
    previous_run_pk,
    run_for_event,
    run_view,
    shows_calls,
)
from conversations.session import open_session
from engine import events
from engine.access import GuardedConsumer
from engine.models import AgentRun, RunStatus

if TYPE_CHECKING:
    from engine.permissions import User


def _owned_conversation(user: User, session_id: str) -> tuple[int, str] | None:
    found = (
        Conversation.objects.owned_by(user)
        .filter(session_id=session_id)
        .values_list("pk", "session_id")
        .first()
    )
    return (found[0], found[1]) if found else None


def _latest_run_pk(conversation_pk: int) -> int:
    runs = AgentRun.objects.filter(conversation_id=conversation_pk).order_by("-pk")
    return runs.values_list("pk", flat=True).first() or 0


def _render_run(
    conversation_pk: int,
    run_id: int,
    items: list[Any],
    show_calls: bool,
    user_pk: int | None = None,
    turns: list[int] | None = None,
    insert: bool = False,
) -> str:
    conversation = Conversation.objects.filter(pk=conversation_pk).first()
    if conversation is None:
        return ""
    loaded = run_for_event(conversation, run_id)
    if loaded is None:
        return ""  # gone, or of a version of the conversation the page does not show
    _, view = run_view(conversation, items, loaded, turns)
    if view is None:
        return ""  # undone or cleared meanwhile: nothing of it is shown
    # A reply that arrives live gets its rating buttons as a reloaded one does.
    view.rating = feedback.for_pushed_run(view.run, user_pk)
    # The header too: the first message titles the conversation, a handoff changes who answers.
    header = render_to_string(
        "conversations/chat.html#run-header",
        {
            "title": display_title(conversation, items, view.run),
            "answering": answering(conversation),
        },
    )
    context = {"view": view, "show_calls": show_calls}
    if insert or view.run.status == RunStatus.QUEUED:
        context["after"] = previous_run_pk(view.run)
        return render_to_string("conversations/chat.html#run-inserted", context) + header
    return render_to_string("conversations/chat.html#run", context) + header


class ConversationConsumer(GuardedConsumer):
    group: str | None = None
    user_pk: int | None = None
    shown_up_to: int = 0

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        found = await database_sync_to_async(_owned_conversation)(user, session_id)
        if found is None:
            # Refused before accepting: someone else's conversation looks like no conversation.
            await self.close()
            return
        self.conversation_pk, self.session_id = found
        self.user_pk = user.pk
        # The runs the page may lack a block of: those started after this socket opened (the
        # re-read the page makes on connecting shows the ones before), until one is sent as
        # a new block. A run is often running, not queued, when its first event is rendered:
        # sent as an update of a block the page lacks, it went nowhere (oobErrorNoTarget).
        self.shown_up_to = await database_sync_to_async(_latest_run_pk)(self.conversation_pk)
        self.inserted: set[int] = set()
        self.show_calls = await database_sync_to_async(shows_calls)(user)
        self.group = events.conversation_group(self.conversation_pk)
        await self.join(self.group)
        await self.guard()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group is not None:
            await self.leave(self.group)
        await self.unguard()

    def still_allowed(self, user: User) -> bool:
        return Conversation.objects.owned_by(user).filter(pk=self.conversation_pk).exists()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page sends nothing that matters: messages go through the CSRF-checked form."""

    # --- events, named after their `type` ---------------------------------------------------

    async def run_text_delta(self, message: dict[str, Any]) -> None:
        event = events.TextDelta.model_validate(message["event"])
        # Where the words go in what was streamed: chat.js appends only what the page lacks
        # (it may have rendered the stored prefix), and without it htmx appends them all.
        await self.send(
            text_data=format_html(
                '<span hx-swap-oob="beforeend:#run-{}-text" data-delta data-run="{}" '
                'data-segment="{}" data-at="{}" data-end="{}">{}</span>',
                event.run_id,
                event.run_id,
                event.segment,
                event.at,
                event.at + len(event.delta),
                event.delta,
            )
        )

    async def run_updated(self, message: dict[str, Any]) -> None:
        await self._send_run(events.RunUpdated.model_validate(message["event"]).run_id)

    async def approval_created(self, message: dict[str, Any]) -> None:
        await self._send_run(events.ApprovalCreated.model_validate(message["event"]).run_id)

    async def approval_decided(self, message: dict[str, Any]) -> None:
        await self._send_run(events.ApprovalDecided.model_validate(message["event"]).run_id)

    async def approval_withdrawn(self, message: dict[str, Any]) -> None:
        await self._send_run(events.ApprovalWithdrawn.model_validate(message["event"]).run_id)

    async def conversation_changed(self, message: dict[str, Any]) -> None:
        # Another window showed another version, undid or cleared: the page re-reads (chat.js).
        await self.send(text_data="<template data-resync-now></template>")

    async def _send_run(self, run_id: int) -> None:
        session: Any = open_session(self.session_id)
        # Each item with its turn: a finished run's message gets its Edit control.
        rows = await session.get_items_with_turns(HISTORY_ITEMS_SHOWN)
        insert = run_id > self.shown_up_to and run_id not in self.inserted
        html = await database_sync_to_async(_render_run)(
            self.conversation_pk,
            run_id,
            [item for _, item in rows],
            self.show_calls,
            self.user_pk,
            [turn for turn, _ in rows],
            insert,
        )
        if html:
            if insert:
                self.inserted.add(run_id)
            await self.send(text_data=html)
