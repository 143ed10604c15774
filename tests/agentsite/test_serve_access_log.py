"""The access log of every server process the project starts (`agentsite/serve.py`) keeps no
query strings: they hold what people typed (a search for an email, a `next` URL)."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

from agentsite.serve import PrivateLogServer, without_query
from tests.live import LiveSite


def test_it_drops_the_query_string_of_a_path() -> None:
    assert without_query("/traces/?q=alice@example.com") == "/traces/"
    assert without_query("/chats/abc/#end") == "/chats/abc/"
    assert without_query("/inbox/") == "/inbox/"


def test_the_server_logs_actions_without_query_strings() -> None:
    logged: list[tuple[str, str, dict[str, Any]]] = []
    server = PrivateLogServer.__new__(PrivateLogServer)
    server.action_logger = lambda protocol, action, details: logged.append(
        (protocol, action, details)
    )
    server.log_action("http", "complete", {"path": "/traces/?q=bob@example.com", "status": 200})
    server.log_action("websocket", "connecting", {"path": "/ws/inbox/"})
    assert logged == [
        ("http", "complete", {"path": "/traces/", "status": 200}),
        ("websocket", "connecting", {"path": "/ws/inbox/"}),
    ]


def test_the_running_site_writes_no_query_string_to_its_log(live_site: LiveSite) -> None:
    url = f"{live_site.url}/accounts/login/?next=/traces/%3Fq%3Dcarol%40example.com&who=carol"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
    deadline = time.monotonic() + 5
    while "GET /accounts/login/" not in live_site.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = live_site.log()
    assert '"GET /accounts/login/" 200' in log
    assert "carol" not in log
