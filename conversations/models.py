"""Conversations, stored so that the SDK can use them as sessions.

A `Conversation` is what a person sees as one chat; its `SessionItem` rows are exactly the
Responses-API items the SDK hands to `Session.add_items`, oldest first by primary key.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.db import models

from agentsite.db.faithful import FaithfulJSONField


def new_session_id() -> str:
    return f"conv_{secrets.token_urlsafe(16)}"


class ConversationQuerySet(models.QuerySet["Conversation"]):
    def owned_by(self, user: Any) -> ConversationQuerySet:
        return self.filter(owner=user)

    def started_since(self, user: Any, since: Any) -> ConversationQuerySet:
        """The conversations `user` opened from `since` on: what the rate limit counts."""
        return self.filter(owner=user, created__gte=since)


class Conversation(models.Model):
    session_id = models.CharField(
        max_length=255,
        unique=True,
        default=new_session_id,
        help_text="Public id, used as the SDK session id and in URLs.",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="conversations",
    )
    agent_name = models.CharField(max_length=100, blank=True)
    current_agent = models.CharField(
        max_length=100,
        blank=True,
        help_text=(
            "The registry name of the agent that answered last (a handoff target is "
            "'<agent_name>/<its name>'); the next turn starts with it. Empty: agent_name."
        ),
    )
    title = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "-updated"], name="conv_owner_updated")]

    def __str__(self) -> str:
        return self.title or self.session_id


class SessionItem(models.Model):
    # No index of its own: the (conversation, id) index below serves every lookup by
    # conversation, and also gives "newest first" without a sort on PostgreSQL.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="items", db_index=False
    )
    payload = FaithfulJSONField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        # "The last N items of one conversation" walks this index backwards and stops after N,
        # so its cost does not grow with the conversation's length.
        indexes = [models.Index(fields=["conversation", "id"], name="item_conv_id")]

    def __str__(self) -> str:
        return f"{self.conversation_id}#{self.pk}"

    @property
    def kind(self) -> str:
        """A short label for admin: the item's role or type."""
        payload = self.payload
        if isinstance(payload, dict):
            if "__enc__" in payload:
                return "encrypted"
            return str(payload.get("role") or payload.get("type") or "item")
        return type(payload).__name__
