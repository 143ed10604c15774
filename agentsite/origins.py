"""The websocket Origin check: a socket opens only from a page of this site.

Channels' `AllowedHostsOriginValidator` compares the Origin's host name with ALLOWED_HOSTS and
ignores its scheme and port, so a page of `http://127.0.0.1:1` (any other server on the
machine) or `https://127.0.0.1` could open every socket. Here the whole origin (scheme, host,
port) must be the site's own, as Django's CSRF check has it for a POST: the origin the socket
is served on (its scheme, honouring SECURE_PROXY_SSL_HEADER, and its Host, which must be an
allowed host) or one of CSRF_TRUSTED_ORIGINS (`https://*.example.com` included).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain


class _Handshake(HttpRequest):
    """The handshake as Django sees a request: its scheme and host, read the way a page's are."""

    def __init__(self, scope: dict[str, Any]) -> None:
        super().__init__()
        self._secure = scope.get("scheme") in ("wss", "https")
        server = scope.get("server") or ("unknown", "0")
        self.META = {"SERVER_NAME": str(server[0]), "SERVER_PORT": str(server[1] or "0")}
        for name, value in scope.get("headers", []):
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            self.META[key] = value.decode("latin-1")

    def _get_scheme(self) -> str:
        return "https" if self._secure else "http"


def is_own_origin(scope: dict[str, Any]) -> bool:
    handshake = _Handshake(scope)
    origin = handshake.META.get("HTTP_ORIGIN")
    if not origin:
        return False
    try:
        served = f"{handshake.scheme}://{handshake.get_host()}"
    except DisallowedHost:
        return False
    trusted = list(settings.CSRF_TRUSTED_ORIGINS)
    if origin in (served, *trusted):
        return True
    parsed = urlsplit(origin)
    return any(
        pattern.scheme == parsed.scheme
        and is_same_domain(parsed.netloc, pattern.netloc.lstrip("*"))
        for pattern in (urlsplit(entry) for entry in trusted if "*" in entry)
    )


class SiteOriginValidator:
    """ASGI middleware: a websocket whose origin is not the site's own is refused (403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not is_own_origin(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
