"""Helpers of the webhooks' tests: a receiver, as an operator's system would run one (a real HTTP
server on 127.0.0.1 that records what it was sent and answers as told), the endpoints that
point at it, and the receiver's own check of a signature (the Standard Webhooks library's)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import threading
import time
from typing import Any

from django.db import transaction
from django.utils.datastructures import CaseInsensitiveMapping
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from webhooks import outbox
from webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent

ALL_EVENTS = [choice.value for choice in WebhookEvent]


class Receiver:
    """What a local HTTP server was sent, and what it answers: `codes` in turn (the last one
    repeats), each answer held until `gate` is set."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[Any, bytes, float]] = []
        self.codes = [200]
        self.gate = threading.Event()
        self.gate.set()
        self.arrived = threading.Event()
        self.server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def take(self, headers: Any, body: bytes) -> int:
        with self.lock:
            self.requests.append((headers, body, time.monotonic()))
            code = self.codes[min(len(self.requests), len(self.codes)) - 1]
        self.arrived.set()
        self.gate.wait(10)
        return code

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, body, _ in self.requests]

    def delivery_ids(self) -> list[str]:
        with self.lock:
            return [headers["Agentsite-Delivery"] for headers, _, _ in self.requests]


class Handler(http.server.BaseHTTPRequestHandler):
    server: Any

    def handle(self) -> None:
        # A sender that stopped waiting (the timeout tests hold the answer past it) has
        # closed its end: the late answer goes nowhere, as it would to any receiver.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        # Header names in any case, as HTTP has them (urllib sends "Webhook-id").
        code = self.server.receiver.take(CaseInsensitiveMapping(self.headers.items()), body)
        self.send_response(code)
        self.send_header("Content-Length", "7")
        self.end_headers()
        self.wfile.write(b"answer.")

    def log_message(self, format: str, *args: Any) -> None:
        pass


def make_endpoint(url: str, events: list[str] | None = None, **kwargs: Any) -> WebhookEndpoint:
    kwargs.setdefault("name", f"receiver {WebhookEndpoint.objects.count() + 1}")
    return WebhookEndpoint.objects.create(url=url, events=events or ALL_EVENTS, **kwargs)


def verified(secret: str | bytes, body: bytes, headers: Any) -> bool:
    """The receiver's check, with the Standard Webhooks library as published (an older
    secret's key is its text: `secret.encode()`)."""
    try:
        Webhook(secret).verify(body, dict(headers.items()))
    except WebhookVerificationError:
        return False
    return True


def legacy_verified(secret: str, body: bytes, header: str) -> bool:
    """An older receiver's check of Agentsite-Signature, as docs/webhooks.md wrote it
    (standard library only)."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    signed = parts["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(parts["t"])) <= 300
    return fresh and hmac.compare_digest(expected, parts["v1"])


def statuses() -> list[str]:
    return list(WebhookDelivery.objects.order_by("pk").values_list("status", flat=True))


def queued(endpoints: list[WebhookEndpoint], each: int) -> list[WebhookDelivery]:
    rows = []
    for _ in range(each):
        with transaction.atomic():
            rows += outbox.queue(WebhookEvent.RUN_COMPLETED, lambda: {"run": {"id": 1}})
    assert len(rows) == len(endpoints) * each
    return rows
