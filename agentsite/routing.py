"""Websocket routes of every app, gathered in one list for asgi.py."""

from __future__ import annotations

from typing import Any

from approvals.routing import websocket_urlpatterns as approvals_patterns
from conversations.routing import websocket_urlpatterns as conversations_patterns
from tracing.routing import websocket_urlpatterns as tracing_patterns

websocket_urlpatterns: list[Any] = [*conversations_patterns, *approvals_patterns, *tracing_patterns]
