"""Websocket routes of the reviewers' inbox."""

from __future__ import annotations

from typing import Any

from django.urls import path

from approvals.consumers import InboxConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/inbox/", InboxConsumer.as_asgi()),
]
