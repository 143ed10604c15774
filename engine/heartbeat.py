"""This process's identity and heartbeat: a `ServerProcess` row per web server, task worker or
management command that runs agents, beating every AGENTSITE_HEARTBEAT_SECONDS.

A run records the identity of the process that claimed it (`AgentRun.process`), so recovery
tells a run whose owner is gone (stopped cleanly, or silent for AGENTSITE_PROCESS_TIMEOUT)
from one that is merely quiet, and fails the first at once. What beats, and when, is
`engine.sweeper`'s: on the server's loop for a web process, on a daemon thread otherwise.

A process that never `begin`s (AGENTSITE_HEARTBEAT_SECONDS=0, a shell, the test process)
owns nothing: its runs name no process, and only the stuck-run timeout recovers them.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from engine.models import ProcessKind, ServerProcess

# Rows of processes dead (stopped or silent) for longer than this are deleted.
PRUNE_AFTER = timedelta(days=1)

_lock = threading.Lock()
_identity = ""
# When this process last beat (monotonic), and until when it does not judge others: after an
# outage that kept its own beats from the database, the others' silence is that outage too,
# so it gives them a beat's time to be heard again.
_last_beat: float | None = None
_judging_from = 0.0


def owner() -> str:
    """This process's identity, or "" when it keeps no heartbeat (then it owns no run)."""
    return _identity


def begin(kind: ProcessKind) -> str:
    """Become a process that beats: choose its identity (no database work; the first `beat`
    writes its row). Idempotent; "" when heartbeats are off."""
    global _identity
    with _lock:
        if not _identity and settings.AGENTSITE_HEARTBEAT_SECONDS > 0:
            host = socket.gethostname()[:100] or "localhost"
            _identity = f"{kind}:{host}:{os.getpid()}:{secrets.token_hex(8)}"
        return _identity


def beat() -> bool:
    """Say this process is alive (its row is written the first time, and again should it have
    gone). False when this process keeps no heartbeat."""
    global _last_beat, _judging_from
    identity = _identity
    if not identity:
        return False
    now = timezone.now()
    if not ServerProcess.objects.filter(identity=identity).update(beat=now):
        kind, host, pid, _ = identity.rsplit(":", 3)
        ServerProcess.objects.get_or_create(
            identity=identity,
            defaults={"kind": kind, "host": host, "pid": int(pid), "started": now, "beat": now},
        )
    beaten = time.monotonic()
    if _last_beat is not None and beaten - _last_beat > settings.AGENTSITE_PROCESS_TIMEOUT:
        _judging_from = beaten + 2 * settings.AGENTSITE_HEARTBEAT_SECONDS
    _last_beat = beaten
    return True


def may_judge() -> bool:
    """Whether this process may take others' silence as their death now: not for two beats
    after its own beats were kept from the database longer than AGENTSITE_PROCESS_TIMEOUT."""
    return time.monotonic() >= _judging_from


def stop() -> None:
    """A clean stop: the row says so, and whatever this process still owns is failed by the
    next process that looks (it can no longer end it). Beats end here."""
    global _identity
    with _lock:
        identity, _identity = _identity, ""
    if identity:
        now = timezone.now()
        ServerProcess.objects.filter(identity=identity).update(stopped=now, beat=now)


def silent_since() -> datetime:
    """A process without a beat since then is taken as gone."""
    return timezone.now() - timedelta(seconds=settings.AGENTSITE_PROCESS_TIMEOUT)


def prune() -> int:
    """Delete the rows of processes dead for over a day (a stopped row beats no more)."""
    deleted, _ = ServerProcess.objects.filter(beat__lt=timezone.now() - PRUNE_AFTER).delete()
    return deleted


def reset() -> None:
    """Forget this process's identity without writing anything (tests)."""
    global _identity, _last_beat, _judging_from
    with _lock:
        _identity, _last_beat, _judging_from = "", None, 0.0
