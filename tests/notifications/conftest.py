"""The notifications' tests' fixtures: the server loop's sending timer, and a real SMTP server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from notifications import sending
from tests.notifications import SmtpServer
from tests.services import outbox_timer


@pytest.fixture
def timer() -> Iterator[asyncio.AbstractEventLoop]:
    """A server loop's sending timer, as the "inprocess" mode's web server runs it."""
    with outbox_timer(sending) as loop:
        yield loop


@pytest.fixture
def smtp(settings: Any) -> Iterator[SmtpServer]:
    server = SmtpServer()
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": server.port, "timeout": 5.0},
        }
    }
    yield server
    server.close()
