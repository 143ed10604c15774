"""The trace socket: tells an open trace page that its trace changed.

Thin on purpose: check the user, join the trace's group (and, for a run's trace, its
conversation's group, where the engine announces the run's status and decisions), and push a
small out-of-band element that makes htmx re-fetch the tree from the database. A push is a
hint; the page re-reads the truth, and re-reads it on every reconnect too.

What makes a page re-read its tree:
- `trace.updated`: the exporter stored spans of this trace (not pushed when it brings
  nothing this page has not read);
- `run.updated` of this trace's run: its status changed (the trace's status follows it, in
  the same transaction, which the exporter's batches know nothing about);
- `approval.decided` in this run: the decision span was written with the decision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from django.template.loader import render_to_string
from django.urls import reverse

from engine import events, permissions
from engine.access import GuardedConsumer
from engine.models import AgentRun
from tracing.models import Span, Trace

if TYPE_CHECKING:
    from engine.permissions import User


class TraceConsumer(GuardedConsumer):
    groups_joined: list[str]

    async def connect(self) -> None:
        self.trace_id = str(self.scope["url_route"]["kwargs"]["trace_id"])
        self.groups_joined = []
        group = events.trace_group(self.trace_id)
        if not await database_sync_to_async(permissions.can_view_traces)(self.scope.get("user")):
            await self.close()  # before accept: the handshake is refused
            return
        if group is None:
            await self.close()
            return
        self.seen, self.status, self.run_id, conversation_id = await self._state()
        joined = [group]
        if conversation_id is not None:
            joined.append(events.conversation_group(conversation_id))
        self.groups_joined = joined
        for name in joined:
            await self.join(name)
        await self.guard()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for name in self.groups_joined:
            await self.leave(name)
        await self.unguard()

    def still_allowed(self, user: User) -> bool:
        return permissions.can_view_traces(user)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Nothing is read from the page."""

    async def dispatch(self, message: dict[str, Any]) -> None:
        # The conversation's group also carries what only the chat page shows (streamed text,
        # new approval requests, events added later): not this page's business.
        if getattr(self, get_handler_name(message), None) is None:
            return
        await super().dispatch(message)

    # --- events (handlers are named after the event type) --------------------------------

    async def trace_updated(self, message: dict[str, Any]) -> None:
        event = events.TraceUpdated.model_validate(message["event"])
        if event.trace_id != self.trace_id:
            return
        new = event.span_count - self.seen
        if new <= 0 and event.status == self.status:
            return
        self.seen, self.status = max(self.seen, event.span_count), event.status
        note = f"{new} new span{'' if new == 1 else 's'}" if new > 0 else f"Now {event.status}"
        await self._refresh(note)

    async def run_updated(self, message: dict[str, Any]) -> None:
        event = events.RunUpdated.model_validate(message["event"])
        if event.run_id == self.run_id:
            await self._refresh(f"Run {event.status}")

    async def approval_decided(self, message: dict[str, Any]) -> None:
        event = events.ApprovalDecided.model_validate(message["event"])
        if event.run_id == self.run_id:
            await self._refresh(f"Decision: {event.status}")

    async def _refresh(self, note: str) -> None:
        context = {
            "note": note,
            "tree_url": reverse("trace_tree", args=[self.trace_id]),
            "oob": True,
        }
        html = render_to_string("tracing/trace_detail.html#live-note", context)
        await self.send(text_data=html)

    # --- the database ----------------------------------------------------------------------

    @database_sync_to_async
    def _state(self) -> tuple[int, str, int | None, int | None]:
        """What the page read (or reads when it re-syncs on connect), so that it is not
        pushed again; and the run of the trace, whose events concern the page too."""
        count = Span.objects.filter(trace_id=self.trace_id).count()
        status = Trace.objects.filter(trace_id=self.trace_id).values_list("status", flat=True)
        run = (
            AgentRun.objects.filter(trace_id=self.trace_id)
            .values_list("pk", "conversation_id")
            .first()
        )
        run_id, conversation_id = run if run is not None else (None, None)
        return count, status.first() or "", run_id, conversation_id
