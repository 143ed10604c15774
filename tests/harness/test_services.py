"""The test harness's own Redis: started, answering, stopped by its process id, started again."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.services import RedisServer, running_redis


def test_redis_starts_stops_and_starts_again_on_its_port(tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as server:
        assert server.answers()
        port = server.port
        server.stop()
        assert not server.answers()
        server.start()
        assert server.answers() and server.port == port
    assert not server.answers()


def test_the_session_server_answers(redis_server: RedisServer) -> None:
    assert redis_server.answers()
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"


@pytest.mark.django_db(transaction=True)
def test_the_sessions_live_site_leaves_the_other_tests_rows_alone(live_site: Any) -> None:
    """The browser tests' server lives through the whole session on the test database: it
    neither sweeps (expiry, recovery) nor beats (its beat fails runs of gone processes), or
    it would act on whatever rows a later test made, as a foreign process."""
    from engine.models import ServerProcess

    environ = Path(f"/proc/{live_site.process.pid}/environ").read_bytes().split(b"\0")
    assert b"AGENTSITE_SWEEP_SECONDS=0" in environ
    assert b"AGENTSITE_HEARTBEAT_SECONDS=0" in environ
    with urllib.request.urlopen(live_site.url + "/accounts/login/", timeout=10) as page:
        assert page.status == 200
    assert not ServerProcess.objects.filter(pid=live_site.process.pid).exists()
