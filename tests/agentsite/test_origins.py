"""The websocket Origin check, through the real router: a socket opens only from a page of this
site, its whole origin (scheme, host and port) being the one the socket is served on, or one of
CSRF_TRUSTED_ORIGINS."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agentsite import origins
from agentsite.asgi import router
from tests.approvals.test_consumers import cookie_of
from tests.factories import make_reviewer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]

HOST = (b"host", b"127.0.0.1")


async def connects(*headers: tuple[bytes, bytes], scheme: str | None = None) -> bool:
    rita = await sync_to_async(make_reviewer)()
    communicator = WebsocketCommunicator(
        router, "/ws/inbox/", headers=[*headers, await cookie_of(rita)]
    )
    if scheme is not None:
        communicator.scope["scheme"] = scheme  # the application has not read its scope yet
    connected, _ = await communicator.connect(timeout=3)
    await communicator.disconnect()
    return connected


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:1",  # another port: another server on the machine
        "https://127.0.0.1",  # another scheme
        "http://evil.example",  # another host
        "http://127.0.0.1.evil.example",
        "null",
    ],
)
async def test_a_foreign_origin_is_refused(origin: str) -> None:
    assert not await connects(HOST, (b"origin", origin.encode()))


async def test_no_origin_is_refused() -> None:
    assert not await connects(HOST)


async def test_the_site_s_own_origin_connects() -> None:
    assert await connects(HOST, (b"origin", b"http://127.0.0.1"))


async def test_the_served_port_and_scheme_are_the_site_s_own() -> None:
    assert await connects((b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000"))
    assert not await connects((b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1"))
    secure = (b"host", b"localhost"), (b"origin", b"https://localhost")
    assert await connects(*secure, scheme="wss")
    assert not await connects(*secure, scheme="ws")


async def test_a_host_that_is_not_allowed_is_refused_even_as_its_own_origin() -> None:
    # A page of evil.example whose name was pointed at this server (DNS rebinding).
    assert not await connects((b"host", b"evil.example"), (b"origin", b"http://evil.example"))


def scope(origin: str | None, host: str = "127.0.0.1", **extra: Any) -> dict[str, Any]:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return {"type": "websocket", "scheme": "ws", "headers": headers, **extra}


def test_trusted_origins_are_accepted_with_their_scheme_and_port(settings: Any) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://agents.example.com", "https://*.example.org"]
    assert origins.is_own_origin(scope("https://agents.example.com"))
    assert not origins.is_own_origin(scope("http://agents.example.com"))
    assert not origins.is_own_origin(scope("https://agents.example.com:8443"))
    assert origins.is_own_origin(scope("https://shop.example.org"))
    assert not origins.is_own_origin(scope("http://shop.example.org"))
    assert not origins.is_own_origin(scope("https://example.org.evil.example"))


def test_the_served_origin_follows_the_server_and_the_proxy_header(settings: Any) -> None:
    served = {"server": ("127.0.0.1", 8000), "headers": [(b"origin", b"http://127.0.0.1:8000")]}
    assert origins.is_own_origin({"type": "websocket", "scheme": "ws", **served})
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = scope("https://127.0.0.1")
    proxied["headers"].append((b"x-forwarded-proto", b"https"))
    assert origins.is_own_origin(proxied)
    assert not origins.is_own_origin(scope("http://127.0.0.1:1"))
