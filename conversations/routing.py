"""Websocket routes of the chat pages."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from conversations.consumers import ConversationConsumer

websocket_urlpatterns: list[Any] = [
    re_path(r"^ws/chats/(?P<session_id>[\w-]+)/$", ConversationConsumer.as_asgi()),
]
