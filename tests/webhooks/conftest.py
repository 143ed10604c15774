"""The webhooks' tests' fixtures: a receiver, the server loop's delivery timer, quick retries,
and what a process remembers of the endpoints forgotten before each test."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import outbox_timer
from tests.webhooks import Handler, Receiver
from webhooks import delivery, outbox


@pytest.fixture(autouse=True)
def fresh_endpoints() -> Iterator[None]:
    """What a process remembers of the endpoints, forgotten: each test's database is new."""
    outbox.forget_subscribed()
    yield
    outbox.forget_subscribed()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    received = Receiver()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.receiver = received  # type: ignore[attr-defined]
    received.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received
    received.gate.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def timer() -> Iterator[asyncio.AbstractEventLoop]:
    """A server loop's delivery timer, as the "inprocess" mode's web server runs it."""
    with outbox_timer(delivery) as loop:
        yield loop


@pytest.fixture
def quick_retries(settings: Any) -> None:
    settings.AGENTSITE_WEBHOOK_BACKOFF_SECONDS = [0.05]
    settings.AGENTSITE_WEBHOOK_MAX_ATTEMPTS = 3
    settings.AGENTSITE_WEBHOOK_TIMEOUT = 5.0
