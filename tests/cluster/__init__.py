"""A cluster for tests: `make cluster`'s own (agentsite/cluster.py: PostgreSQL, Redis, web
processes and workers behind nginx, from deploy/), in a folder of its own under /tmp, with a
fast heartbeat, no rate limits and no model credentials; and the people who use it.

    with running_cluster(AGENTSITE_DEMO_STREAM_DELAY="0.2") as cluster:
        alice = Person.signed_in(cluster.url, "alice")
        socket = await alice.socket(f"/ws/chats/{session_id}/", via=cluster.web[0])
        cluster.worker[0].kill()    # SIGKILL; .start() brings it back

The test process's own database is not the cluster's: tests read the cluster's rows with
`cluster_rows` (plain SQL on its PostgreSQL), and run on whatever database pytest set up.

This folder's modules are the tests that start one (marked `cluster`); the benchmarks start
theirs with the same helpers.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from websockets.asyncio.client import ClientConnection, connect

from agentsite.cluster import Cluster, Service, free_port

# What the cluster's processes must not inherit from the test run.
NOT_INHERITED = (
    "DJANGO_SETTINGS_MODULE",
    "AGENTSITE_LIVE_TEST_SERVER",
    "DATABASE_URL",
    "REDIS_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "DEBUG",
    "SECRET_KEY",
)
# A dead process is noticed within seconds (a beat a second, gone after five silent ones: a
# live process on a busy machine is never taken for dead);
# nobody is rate-limited; a stopping web process drains for 2 s, not 10.
TEST_ENV = {
    "AGENTSITE_HEARTBEAT_SECONDS": "1",
    "AGENTSITE_PROCESS_TIMEOUT": "5",
    "AGENTSITE_MESSAGES_PER_MINUTE": "0",
    "AGENTSITE_CONVERSATIONS_PER_HOUR": "0",
    "AGENTSITE_SHUTDOWN_GRACE": "2",
}
# seed_demo's passwords (the cluster seeds the demo with DEBUG on, as `make run` does).
PASSWORDS = {"alice": "alice-demo-pass", "rita": "rita-demo-pass"}


@contextmanager
def running_cluster(
    web_processes: int = 2,
    workers: int = 2,
    env: Mapping[str, str] | None = None,
    **settings: str,
) -> Iterator[Cluster]:
    """A cluster whose processes get `env` and `settings` on top of the tests' environment."""
    # A folder of its own under /tmp, as tests/postgres.py's: pytest's temporary folders are
    # private to root, and PostgreSQL and nginx's workers run as other users.
    folder = Path(tempfile.mkdtemp(prefix="agentsite-cluster."))
    folder.chmod(0o755)
    base = {key: value for key, value in os.environ.items() if key not in NOT_INHERITED}
    cluster = Cluster(
        folder,
        port=free_port(),
        web_processes=web_processes,
        workers=workers,
        env={**TEST_ENV, **(env or {}), **settings},
        base_env=base,
        fast_postgres=True,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)


def cluster_rows(cluster: Cluster, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """Rows of the cluster's database (plain SQL: this process's ORM is on the test database)."""
    with psycopg.connect(cluster.database_url, autocommit=True) as connection:
        return list(connection.execute(sql, params).fetchall())


def wait_for[T](what: str, read: Callable[[], T | None], within: float = 15.0) -> T:
    """`read()` once it returns something (not None, not False), polled; fails saying `what`."""
    deadline = time.monotonic() + within
    while True:
        value = read()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within:g} s")
        time.sleep(0.05)


def pid_of(identity: str) -> int:
    """The pid in a process identity (`kind:host:pid:token`, engine/heartbeat.py)."""
    return int(identity.split(":")[2])


def service_of(cluster: Cluster, identity: str) -> Service:
    """The cluster's service whose process an identity names."""
    pid = pid_of(identity)
    return next(s for s in cluster.services if s.running() and s.pid == pid)


@dataclass
class Person:
    """Someone signed in to the cluster through nginx: plain HTTP with their cookies, and
    their sockets (through nginx, or straight to one web process)."""

    url: str
    username: str
    opener: urllib.request.OpenerDirector
    jar: http.cookiejar.CookieJar

    @classmethod
    def signed_in(cls, url: str, username: str) -> Person:
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        person = cls(url, username, opener, jar)
        person.get("/accounts/login/")
        status, page, _ = person.post(
            "/accounts/login/", {"username": username, "password": PASSWORDS[username]}
        )
        assert status == 200 and "Log out" in page, f"{username} could not log in: {status}"
        return person

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
        return self._open(urllib.request.Request(self.url + path, headers=headers or {}))

    def post(
        self, path: str, data: dict[str, str], headers: dict[str, str] | None = None
    ) -> tuple[int, str, str]:
        """POST `data` as the page's form would, with the CSRF cookie's token."""
        token = next((c.value or "" for c in self.jar if c.name == "csrftoken"), "")
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": token}).encode()
        return self._open(urllib.request.Request(self.url + path, body, headers=headers or {}))

    def _open(self, request: urllib.request.Request) -> tuple[int, str, str]:
        try:
            with self.opener.open(request, timeout=20) as response:
                return response.status, response.read().decode(), response.url
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace"), error.url

    def new_conversation(self) -> str:
        """A new conversation with the default agent; its session id."""
        status, _, url = self.post("/chats/new/", {"agent": ""})
        assert status == 200, status
        return urllib.parse.urlsplit(url).path.strip("/").split("/")[-1]

    def say(self, session_id: str, text: str, *, htmx: bool = False) -> None:
        """Send `text` in the conversation: as a form without script (answered with a
        redirect to the whole chat page, which is read), or with `htmx` as the chat page
        sends it (answered with the composer alone)."""
        headers = {"HX-Request": "true"} if htmx else None
        status, page, _ = self.post(f"/chats/{session_id}/messages/", {"text": text}, headers)
        assert status == 200, (status, page[:500])
        assert htmx == ('id="composer"' in page and "<html" not in page), page[:500]

    def decide(self, request_id: int, action: str = "approve") -> None:
        _, page, _ = self.get(f"/inbox/{request_id}/")
        seen = re.search(r'name="seen_hash" value="([0-9a-f]{64})"', page)
        assert seen, page[:500]
        status, answer, _ = self.post(
            f"/inbox/{request_id}/decide/", {"action": action, "seen_hash": seen[1]}
        )
        assert status == 200 and "Already" not in answer, (status, answer[:500])

    async def socket(self, path: str, via: Service | None = None) -> ClientConnection:
        """A websocket to `path`, through nginx, or straight to the web process `via`; its
        origin is the page's, as a browser's would be."""
        base = f"http://127.0.0.1:{via.port}" if via is not None else self.url
        cookies = "; ".join(f"{cookie.name}={cookie.value}" for cookie in self.jar)
        return await connect(
            base.replace("http://", "ws://") + path,
            additional_headers={"Cookie": cookies, "Origin": base},
            open_timeout=10,
        )


async def read_until(socket: ClientConnection, *texts: str, within: float = 15) -> str:
    """The first frame the socket receives that holds every one of `texts`."""
    frames: list[str] = []
    try:
        async with asyncio.timeout(within):
            while True:
                frames.append(str(await socket.recv()))
                if all(text in frames[-1] for text in texts):
                    return frames[-1]
    except TimeoutError:
        raise AssertionError(f"no frame with {texts} within {within} s; got {frames}") from None


def served_sockets(service: Service, path: str) -> int:
    """How many websockets to `path` this web process accepted (its access log says)."""
    return service.log().count(f"WSCONNECT {path}")


def give_password(cluster: Cluster, username: str, password: str) -> None:
    """Let `Person.signed_in` sign in as the cluster's user `username`: its password set
    through the cluster's database (the demo's customers have none usable). The hash is made
    in this process, so Django's settings must be set up here."""
    from django.contrib.auth.hashers import make_password

    changed = cluster_rows(
        cluster,
        "UPDATE auth_user SET password = %s WHERE username = %s RETURNING id",
        make_password(password),
        username,
    )
    assert changed, f"the cluster has no user {username}"
    PASSWORDS[username] = password


def process_memory(pid: int) -> tuple[int, int]:
    """(resident memory in bytes, open file descriptors) of the process `pid`, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert kib, f"no VmRSS in /proc/{pid}/status"
    return int(kib[1]) * 1024, len(os.listdir(f"/proc/{pid}/fd"))
