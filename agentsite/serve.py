"""`python -m agentsite.serve`: daphne, as `daphne` itself takes its arguments, with two
differences. Every server process the project starts (`make run`, the browser tests' server)
is started through here.

- Access-log lines carry no query string: it holds what people typed (`/traces/?q=<an
  email>`, `?next=...`), personal data that the traces take care to mask.
- On SIGTERM (or Ctrl-C) it drains before it stops: no new run starts, runs in flight get
  `AGENTSITE_SHUTDOWN_GRACE` seconds to end, and what is still running then is marked
  interrupted (never retried) instead of being left "running" for recovery to find later.
  Then its process row says it stopped (`engine.heartbeat`), so anything it still owned is
  failed by the next process that looks, without waiting for its beats to go silent.
- Before it listens it runs Django's system checks (the agents' registry and their model
  settings among them): a server whose configuration they refuse stops at once, saying why,
  instead of failing each chat turn later.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from asgiref.sync import sync_to_async
from daphne.cli import CommandLineInterface
from daphne.server import Server
from django.conf import settings
from twisted.internet import defer

logger = logging.getLogger(__name__)


def without_query(path: str) -> str:
    """`path` without its query string (and fragment)."""
    return path.split("?", 1)[0].split("#", 1)[0]


async def drain(grace: float) -> int:
    """Let the in-process runs end within `grace` seconds; fail the ones still running then.
    Returns how many were interrupted. Then this process's row says it stopped."""
    from engine import executor, heartbeat, runs

    jobs = executor.inprocess()
    left = await jobs.drain(grace)
    interrupted = await sync_to_async(runs.interrupt, thread_sensitive=False)(left) if left else 0
    jobs.cancel_pending()
    try:
        await sync_to_async(heartbeat.stop, thread_sensitive=False)()
    except Exception:
        logger.exception("Could not mark this process stopped; it is taken as gone when silent")
    if left:
        logger.warning(
            "Shutting down: %d run(s) did not end within %g s; %d marked interrupted.",
            len(left),
            grace,
            interrupted,
        )
    return interrupted


class PrivateLogServer(Server):
    """daphne's server: its access log gets paths without their query strings, and it drains
    the in-process runs before it stops."""

    def log_action(self, protocol: str, action: str, details: dict[str, Any]) -> None:
        if isinstance(details.get("path"), str):
            details = {**details, "path": without_query(details["path"])}
        super().log_action(protocol, action, details)

    def kill_all_applications(self) -> defer.Deferred[Any]:
        drained = defer.Deferred.fromFuture(
            asyncio.ensure_future(drain(settings.AGENTSITE_SHUTDOWN_GRACE))
        )
        drained.addErrback(lambda failure: logger.error("Draining the runs failed: %s", failure))
        drained.addBoth(lambda _: super(PrivateLogServer, self).kill_all_applications())
        return drained


class PrivateLogCommandLine(CommandLineInterface):
    server_class = PrivateLogServer


def refused_configuration() -> str:
    """What the system checks refuse in this configuration (errors only), or ""."""
    import django
    from django.core import checks

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentsite.settings")
    django.setup()
    errors = [
        message
        for message in checks.run_checks()
        if message.level >= checks.ERROR and not message.is_silenced()
    ]
    return "\n".join(str(message) for message in errors)


if __name__ == "__main__":
    refused = refused_configuration()
    if refused:
        sys.exit(
            f"The server did not start; the system checks refuse its configuration:\n{refused}"
        )
    PrivateLogCommandLine.entrypoint()
