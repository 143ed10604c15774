"""The test harness's own Redis: started, answering, stopped by its process id, started again."""

from __future__ import annotations

from pathlib import Path

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
