"""The inbox socket: pushes server-rendered fragments to reviewers' open inbox pages.

Thin on purpose: check the user, join the inbox group, turn each event into the same
fragments the pages render. A push is a hint; every fragment is rendered from the database,
not from the event, and a page re-reads its list whenever its socket (re)connects.

What a socket shows comes from its query string (validated with `InboxSocketForm`):
`?show=pending&agent=..&tool=..` (the pending list), `?show=request&request=<pk>` (one
request's decision panel), anything else only the pending count.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict
from django.template.loader import render_to_string

from agentsite import events
from agentsite.permissions import is_reviewer
from approvals import views
from approvals.forms import InboxSocketForm
from approvals.models import ApprovalRequest


class InboxConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        self.view = InboxSocketForm(query)
        if not await database_sync_to_async(is_reviewer)(self.scope.get("user")):
            await self.close()  # before accept: the handshake is refused
            return
        if not self.view.is_valid():
            await self.close()
            return
        self.show = self.view.cleaned_data.get("show") or "count"
        self.request_id = self.view.cleaned_data.get("request")
        await self.channel_layer.group_add(events.INBOX_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(events.INBOX_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Nothing is decided over the socket: decisions are CSRF-protected POSTs."""

    # --- events (handlers are named after the event type) --------------------------------

    async def approval_created(self, message: dict[str, Any]) -> None:
        event = events.ApprovalCreated.model_validate(message["event"])
        await self._send(await self._created(event))

    async def approval_decided(self, message: dict[str, Any]) -> None:
        event = events.ApprovalDecided.model_validate(message["event"])
        await self._send(await self._decided(event))

    async def _send(self, html: str) -> None:
        if html.strip():
            await self.send(text_data=html)

    # --- rendering, in the database's thread ----------------------------------------------

    @database_sync_to_async
    def _created(self, event: events.ApprovalCreated) -> str:
        parts = []
        if self.show == "pending" and self.view.matches(event.agent_name, event.tool_name):
            approval = views.with_people(views.open_requests()).filter(pk=event.request_id).first()
            if approval is not None:
                row = views.render_row(approval, back=self._back())
                parts.append(f'<div hx-swap-oob="afterbegin:#pending-rows">{row}</div>')
        parts.append(self._badge())
        return "".join(parts)

    @database_sync_to_async
    def _decided(self, event: events.ApprovalDecided) -> str:
        parts = []
        if self.show == "pending":
            approval = self._load(event.request_id)
            if approval is not None and self.view.matches(approval.agent_name, approval.tool_name):
                parts.append(views.render_row(approval, oob="true", back=self._back()))
        elif self.show == "request" and event.request_id == self.request_id:
            approval = self._load(event.request_id)
            if approval is not None:
                context = {**views.panel_context(approval), "oob": True}
                parts.append(render_to_string("approvals/_decision_panel.html", context))
        parts.append(self._badge())
        return "".join(parts)

    def _load(self, pk: int) -> ApprovalRequest | None:
        return views.with_people(ApprovalRequest.objects.all()).filter(pk=pk).first()

    def _badge(self) -> str:
        context = {"pending_count": views.pending_count(), "oob": True}
        return render_to_string("approvals/_badge.html", context)

    def _back(self) -> str:
        return views.inbox_url(views.filter_query(self.view))
