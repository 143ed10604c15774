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
- The links in the emails it sends lead to it: unless the site's address is configured
  (`AGENTSITE_EMAIL_SITE_URL`, or `AGENTSITE_WEBHOOK_SITE_URL`), it is the address this
  server listens on (`make run PORT=21080`: `http://127.0.0.1:21080`), set before the
  settings are read. Where that cannot be told (a worker or cron's `send_notifications`,
  which serve nothing; a server behind a proxy) the links lead to `make run`'s default,
  `http://127.0.0.1:8000`: a deployment configures the site's address (`deploy/.env.example`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

from asgiref.sync import sync_to_async
from daphne.cli import DEFAULT_HOST, DEFAULT_PORT, CommandLineInterface
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


# What a browser reaches a server on every interface at: this machine's own address.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def served_url(argv: list[str]) -> str | None:
    """The address a server started with `argv` (daphne's arguments) answers at, with
    daphne's defaults for what they leave out: `http://127.0.0.1:21080`. None when that is not
    the site's address or is not known before it listens: behind a proxy (`--proxy-headers`:
    the proxy's address is the site's), on a UNIX socket, a file descriptor, endpoints of
    twisted's own (`-e`), any free port (`-p 0`), or arguments daphne will refuse."""
    parser = CommandLineInterface().parser
    # Arguments it refuses are daphne's to report, once, when it reads them itself.
    parser.exit_on_error = False
    try:
        args, _ = parser.parse_known_args(argv)
    except argparse.ArgumentError:
        return None
    if args.proxy_headers or args.unix_socket or args.file_descriptor is not None:
        return None
    if args.socket_strings or args.port == 0:
        return None
    host = args.host or DEFAULT_HOST
    host = WILDCARDS.get(host, host)
    port = DEFAULT_PORT if args.port is None else args.port
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def default_site_url(argv: list[str], environ: MutableMapping[str, str] = os.environ) -> None:
    """Make the address this server answers at (`served_url`) the emails' links' default:
    AGENTSITE_EMAIL_SITE_URL, when neither it nor AGENTSITE_WEBHOOK_SITE_URL (which the
    settings fall back to) is set. Before the settings are read, so that they read it."""
    configured = ("AGENTSITE_EMAIL_SITE_URL", "AGENTSITE_WEBHOOK_SITE_URL")
    if any(environ.get(name) for name in configured):
        return
    url = served_url(argv)
    if url is not None:
        environ["AGENTSITE_EMAIL_SITE_URL"] = url


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
    default_site_url(sys.argv[1:])
    refused = refused_configuration()
    if refused:
        sys.exit(
            f"The server did not start; the system checks refuse its configuration:\n{refused}"
        )
    PrivateLogCommandLine.entrypoint()
