"""Websocket routes of the trace viewer."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from tracing.consumers import TraceConsumer

websocket_urlpatterns: list[Any] = [
    re_path(r"^ws/traces/(?P<trace_id>[^/\x00]+)/$", TraceConsumer.as_asgi()),
]
