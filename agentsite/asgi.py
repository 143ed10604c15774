"""ASGI entry point: HTTP through Django, websockets through Channels."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentsite.settings")

# Django must be set up before anything imports models, so this comes first.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agentsite.db import hops  # noqa: E402
from agentsite.db.pool import RequestGate  # noqa: E402
from agentsite.origins import SiteOriginValidator  # noqa: E402
from agentsite.routing import websocket_urlpatterns  # noqa: E402
from common import heap  # noqa: E402
from engine import executor, providers  # noqa: E402

providers.log_active_provider()

router = ProtocolTypeRouter(
    {
        # With a connection pool, at most half of it serves requests at once (see pool.py).
        "http": RequestGate(django_asgi_app),
        "websocket": SiteOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything imported so far lives as long as the process: out of the collector's sight.
heap.freeze_startup_heap()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # In-process runs execute on this loop, where the pages' sockets live too.
    loop = asyncio.get_running_loop()
    executor.bind_server_loop(loop)
    # Threads of this loop's `asyncio.to_thread` give their connections back (hops.py).
    hops.adopt(loop)
    await router(scope, receive, send)
