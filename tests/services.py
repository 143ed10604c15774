"""Real services for tests, from Debian's packages, on 127.0.0.1 only: a Redis server in a
temporary folder of its own, stopped by its process id (never `redis-cli shutdown` on a port
someone else might own).

    with running_redis(tmp_path) as redis:   # or the `redis_server` fixture (one per session)
        settings.CHANNEL_LAYERS = redis.channel_layers()
        redis.stop()      # an outage: the process is gone, its port refuses connections
        redis.start()     # back, on the same port, empty
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (a connection to it is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    folder: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def channel_layers(self) -> dict[str, Any]:
        """A `CHANNEL_LAYERS` setting on this server, as settings.py builds it from REDIS_URL."""
        return {
            "default": {
                "BACKEND": "engine.layer.ChannelLayer",
                "CONFIG": {"hosts": [self.url]},
            }
        }

    def start(self, within: float = 10.0) -> None:
        """Start the server (again, after `stop`, on the same port) and wait until it answers."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.folder.mkdir(parents=True, exist_ok=True)
        log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                str(self.folder),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start:\n{self.log()}")
            if self.answers():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {within} s:\n{self.log()}")

    def stop(self) -> None:
        """Stop the server by its process id; its port refuses connections afterwards."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def log(self) -> str:
        path = self.folder / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    server = RedisServer(folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One Redis server for the session's tests that only need one to be there. A test that
    stops it (an outage) starts its own with `running_redis`."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@contextmanager
def outbox_timer(sender: Any) -> Iterator[asyncio.AbstractEventLoop]:
    """A server loop running an outbox's sending timer (`sender`: webhooks.delivery or
    notifications.sending), as the "inprocess" mode's web server runs it; stopped after."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> None:
        assert sender.start_timer(loop) is not None

    asyncio.run_coroutine_threadsafe(start(), loop).result(5)
    try:
        yield loop
    finally:

        async def stop() -> None:
            task = sender.stop_timer(loop)
            assert task is not None
            with contextlib.suppress(asyncio.CancelledError):
                await task

        asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until `check()` holds, as a sender working on its own thread or timer gets there;
    fails when it still does not after `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    assert check()
