"""Helpers of the notifications' tests: a reviewer who opted in, a request announced as the
engine's pause announces it, what an email says and links to, and a minimal SMTP server on
127.0.0.1."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction

from approvals.models import ApprovalDecision, ApprovalRequest
from engine import signals
from engine.models import AgentRun, RunStatus
from notifications.models import EmailMode, NotificationPreference
from tests.factories import make_reviewer

LINK = re.compile(r"https?://\S+/notifications/open/\?t=[\w%:.\-]+")


def opted_in(username: str = "rita", mode: str = EmailMode.IMMEDIATELY, **kwargs: Any) -> Any:
    """A reviewer with an address and these email settings."""
    reviewer = make_reviewer(username)
    reviewer.email = f"{username}@example.com"
    reviewer.save()
    NotificationPreference.objects.create(user=reviewer, mode=mode, **kwargs)
    return reviewer


def announce(request: ApprovalRequest) -> None:
    """What the engine's pause does for a request that waits, in its transaction."""
    with transaction.atomic():
        signals.approval_created.send(sender=ApprovalRequest, request=request)


def link_of(message: Any) -> str:
    found = LINK.findall(message.body)
    assert found, message.body
    return found[0]


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def html_of(message: Any) -> str:
    ((html, kind),) = message.alternatives
    assert kind == "text/html"
    return str(html)


def unchanged(request: ApprovalRequest) -> None:
    request.refresh_from_db()
    assert request.status == "pending"
    assert not ApprovalDecision.objects.filter(request=request).exists()
    assert AgentRun.objects.get(pk=request.run_id).status == RunStatus.WAITING


class SmtpServer:
    """A minimal SMTP server: what it was sent, and how it answers DATA (`codes` in turn, the
    last repeats: 451 is a temporary refusal)."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.codes = [250]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                with conn, conn.makefile("rb") as lines:
                    self.session(conn, lines)

    def session(self, conn: socket.socket, lines: Any) -> None:
        conn.sendall(b"220 test ESMTP\r\n")
        while line := lines.readline():
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 test\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go on\r\n")
                body = b""
                while (chunk := lines.readline()) not in (b".\r\n", b""):
                    body += chunk
                code = self.codes[min(len(self.messages), len(self.codes) - 1)]
                self.messages.append(body)
                conn.sendall(b"250 queued\r\n" if code == 250 else b"451 try later\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"250 ok\r\n")

    def close(self) -> None:
        self.listener.close()
