"""`python -m agentsite.serve`: daphne, as `daphne` itself takes its arguments, with access-log
lines that carry no query string.

A query string holds what people typed (`/traces/?q=<an email>`, `?next=...`), so writing it
to the access log would store personal data that the traces take care to mask. Every server
process the project starts (`make run`, the browser tests' server) is started through here.
"""

from __future__ import annotations

from typing import Any

from daphne.cli import CommandLineInterface
from daphne.server import Server


def without_query(path: str) -> str:
    """`path` without its query string (and fragment)."""
    return path.split("?", 1)[0].split("#", 1)[0]


class PrivateLogServer(Server):
    """daphne's server, but its access log gets paths without their query strings."""

    def log_action(self, protocol: str, action: str, details: dict[str, Any]) -> None:
        if isinstance(details.get("path"), str):
            details = {**details, "path": without_query(details["path"])}
        super().log_action(protocol, action, details)


class PrivateLogCommandLine(CommandLineInterface):
    server_class = PrivateLogServer


if __name__ == "__main__":
    PrivateLogCommandLine.entrypoint()
