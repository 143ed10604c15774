"""Websocket routes of every app, gathered in one list for asgi.py."""

from __future__ import annotations

from typing import Any

# Each app adds its `routing.websocket_urlpatterns` here as its consumers land.
websocket_urlpatterns: list[Any] = []
