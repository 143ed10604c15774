"""Under ASGI, a request's middleware chain runs in one thread (`agentsite/onethread.py`): no
middleware runs in async mode, where each of Django's would cost two thread hops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.utils.deprecation import MiddlewareMixin

pytestmark = pytest.mark.django_db(transaction=True)


async def get(handler: ASGIHandler, path: str) -> list[dict[str, Any]]:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"localhost")],
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
        "asgi": {"version": "3.0"},
    }
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if body:
            return body.pop()
        await never.wait()
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await handler(scope, receive, send)
    return sent


async def test_no_middleware_of_the_site_runs_in_async_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_async: list[str] = []
    in_sync: list[str] = []
    acall, call = MiddlewareMixin.__acall__, MiddlewareMixin.__call__

    async def async_mode(self: MiddlewareMixin, request: Any) -> Any:
        in_async.append(type(self).__name__)
        return await acall(self, request)

    def sync_mode(self: MiddlewareMixin, request: Any) -> Any:
        in_sync.append(type(self).__name__)
        return call(self, request)

    monkeypatch.setattr(MiddlewareMixin, "__acall__", async_mode)
    monkeypatch.setattr(MiddlewareMixin, "__call__", sync_mode)
    sent = await get(ASGIHandler(), "/accounts/login/")

    assert sent[0]["status"] == 200
    assert "SessionMiddleware" in in_sync and "CsrfViewMiddleware" in in_sync
    assert in_async == []
