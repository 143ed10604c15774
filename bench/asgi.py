"""The ASGI server for production, chosen on measurement: daphne against uvicorn.

Each server runs the site as one process, at the same settings (production's: DEBUG off,
static files collected, the Redis channel layer, an access log each, the bench's SQLite
file), on
127.0.0.1; both are started once and measured in turn (daphne, uvicorn, daphne, ...).

- HTTP: alice's chat page (`GET /chats/<id>/`, a conversation of a few turns), from
  `CONNECTIONS` keep-alive connections sending one request after another for a few seconds:
  requests per second and the p99 of a request's time.
- Websocket push: `SOCKETS` chat sockets of that conversation on the server; the bench
  publishes text deltas to the conversation's group through Redis, as a run does, and times
  each socket's frame from the publish: p50/p99 one event at a time, then frames per second
  for a burst of events sent back to back.

granian is not installed (it is not a dependency), so it is not measured.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from websockets.asyncio.client import ClientConnection, connect

from bench import site
from bench.harness import Config, Row, Samples, arun, compared, note, percentile, ratio
from conversations.models import Conversation
from engine import events, runs
from engine.layer import ChannelLayer
from tests.services import free_port, running_redis

BENCHMARK = "asgi server"
ROOT = Path(__file__).resolve().parent.parent
CONNECTIONS = 8
SOCKETS = 20
TURNS = 5  # of the conversation the chat page shows


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def command(name: str, port: int) -> list[str]:
    if name == "daphne":
        # As production starts it: agentsite's daphne (query strings kept out of the access
        # log, a drain on SIGTERM), its access log on stdout (daphne's default).
        return [sys.executable, "-m", "agentsite.serve", "-b", "127.0.0.1", "-p", str(port)] + [
            "agentsite.asgi:application"
        ]
    # uvicorn's own choices here: h11 for HTTP and the websockets package for sockets
    # (httptools and uvloop are not installed); agentsite's ASGI app has no lifespan.
    return [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)] + [
        "--lifespan",
        "off",
        "--access-log",  # on stdout, as daphne's
        "--log-level",
        "info",
        "agentsite.asgi:application",
    ]


def environment(secret_key: str, redis_url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "agentsite.settings",
        "DEBUG": "0",
        "SECRET_KEY": secret_key,
        "ALLOWED_HOSTS": "127.0.0.1",
        "REDIS_URL": redis_url,
        "AGENTSITE_EXECUTOR": "inprocess",
        "AGENTSITE_SWEEP_SECONDS": "0",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    return env


@contextmanager
def servers(env: dict[str, str], workdir: Path) -> Iterator[dict[str, Server]]:
    # DEBUG off serves static files from the collected manifest, as production does.
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    started: dict[str, Server] = {}
    try:
        for name in ("daphne", "uvicorn"):
            port = free_port()
            log = workdir / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    command(name, port), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                )
            started[name] = Server(name, port, process, log)
        for server in started.values():
            wait_until_up(server)
        yield started
    finally:
        for server in started.values():
            server.process.terminate()
        for server in started.values():
            try:
                server.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait()


def wait_until_up(server: Server) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited at start:\n{server.log.read_text()}")
        try:
            with urllib.request.urlopen(server.url + "/accounts/login/", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{server.name} did not answer within 30 s:\n{server.log.read_text()}")


def alice_chat(secret_key: str) -> tuple[Conversation, str]:
    """alice's conversation of a few turns, and a session cookie the servers accept (signed
    with their key)."""
    alice = get_user_model().objects.create_user(username=f"alice-{secrets.token_hex(4)}")
    conversation = Conversation.objects.create(agent_name="bench_tool", owner=alice)

    async def turns() -> None:
        with site.served_here():
            for _ in range(TURNS):
                run = await runs.astart_run(conversation, "Where is my order 7?")
                await runs.execute(run.pk)

    with site.jobs_recorded():
        arun(turns())
    with override_settings(SECRET_KEY=secret_key):
        client = Client()
        client.force_login(alice)
    return conversation, client.cookies["sessionid"].value


# --- HTTP -----------------------------------------------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def http_load(server: Server, path: str, cookie: str, seconds: float) -> list[float]:
    """`CONNECTIONS` keep-alive connections GET `path` one request after another for
    `seconds`; the time of each request."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Cookie: sessionid={cookie}\r\nConnection: keep-alive\r\n\r\n"
    ).encode()
    times: list[float] = []
    deadline = time.perf_counter() + seconds

    async def one_connection() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                writer.write(request)
                await writer.drain()
                status = await _read_response(reader)
                assert status == 200, f"{server.name}: {path} answered {status}"
                times.append(time.perf_counter() - began)
        finally:
            writer.close()

    await asyncio.gather(*(one_connection() for _ in range(CONNECTIONS)))
    return times


# --- websocket push -------------------------------------------------------------------------


@dataclass
class Pushes:
    latencies: list[float] = field(default_factory=list)  # publish → frame, every socket
    burst_frames_per_second: float = 0.0


async def push_load(
    server: Server, conversation: Conversation, cookie: str, layer: ChannelLayer, events_sent: int
) -> Pushes:
    url = f"ws://127.0.0.1:{server.port}/ws/chats/{conversation.session_id}/"
    sockets: list[ClientConnection] = [
        await connect(
            url,
            origin=server.url,  # type: ignore[arg-type]
            additional_headers={"Cookie": f"sessionid={cookie}"},
        )
        for _ in range(SOCKETS)
    ]
    group = events.conversation_group(conversation.pk)
    pushes = Pushes()

    async def publish(n: int) -> None:
        event = events.TextDelta(
            run_id=0, conversation_id=conversation.pk, delta=f"w{n} ", at=n, segment=0
        )
        await layer.group_send(group, {"type": event.type, "event": event.model_dump(mode="json")})

    async def receive(socket: ClientConnection, count: int) -> list[float]:
        arrived = []
        for _ in range(count):
            await asyncio.wait_for(socket.recv(), timeout=10)
            arrived.append(time.perf_counter())
        return arrived

    try:
        await asyncio.sleep(0.2)  # every socket has joined the group
        for n in range(events_sent):  # one at a time: latency
            receivers = [asyncio.create_task(receive(s, 1)) for s in sockets]
            sent = time.perf_counter()
            await publish(n)
            for arrived in await asyncio.gather(*receivers):
                pushes.latencies.append(arrived[0] - sent)
        receivers = [asyncio.create_task(receive(s, events_sent)) for s in sockets]
        began = time.perf_counter()
        for n in range(events_sent):  # back to back: throughput
            await publish(n)
        last = max(arrived[-1] for arrived in await asyncio.gather(*receivers))
        pushes.burst_frames_per_second = SOCKETS * events_sent / (last - began)
    finally:
        for socket in sockets:
            await socket.close()
    return pushes


# --- the rows -------------------------------------------------------------------------------


def run(config: Config) -> list[Row]:
    repeats = config.pick(1, 3)
    seconds = config.pick(1.5, 5.0)
    events_sent = config.pick(20, 100)
    secret_key = secrets.token_urlsafe(50)
    conversation, cookie = alice_chat(secret_key)
    path = f"/chats/{conversation.session_id}/"
    http = {name: Samples() for name in ("daphne", "uvicorn")}
    per_request = {name: Samples() for name in ("daphne", "uvicorn")}
    push = {name: Samples() for name in ("daphne", "uvicorn")}
    burst = {name: Samples() for name in ("daphne", "uvicorn")}
    with (
        running_redis(config.workdir / "redis") as redis,
        servers(environment(secret_key, redis.url), config.workdir) as started,
    ):
        layer = ChannelLayer(hosts=[redis.url])
        for server in started.values():  # warm-up, unrecorded
            arun(http_load(server, path, cookie, 0.5))
            arun(push_load(server, conversation, cookie, layer, 5))
        for _ in range(repeats):
            for name, server in started.items():
                times = arun(http_load(server, path, cookie, seconds))
                http[name].repeats.append(times)
                per_request[name].repeats.append([seconds / len(times)])
                pushes = arun(push_load(server, conversation, cookie, layer, events_sent))
                push[name].repeats.append(pushes.latencies)
                burst[name].repeats.append([1 / pushes.burst_frames_per_second])

    def throughput(name: str) -> str:
        rates = [1 / times[0] for times in per_request[name].repeats]
        return (
            f"{statistics.median(rates):,.0f} req/s, p99 {http[name].percentile(99) * 1000:.1f} ms"
        )

    def latency(name: str) -> str:
        return (
            f"p50 {push[name].percentile(50) * 1000:.2f} ms, "
            f"p99 {push[name].percentile(99) * 1000:.2f} ms"
        )

    def frames(name: str) -> str:
        rates = [1 / times[0] for times in burst[name].repeats]
        return f"{statistics.median(rates):,.0f} frames/s"

    def p99(times: list[float]) -> float:
        return percentile(times, 99)

    return [
        compared(
            BENCHMARK,
            f"GET chat page, {CONNECTIONS} keep-alive connections: time per request",
            throughput("daphne"),
            throughput("uvicorn"),
            ratio(per_request["daphne"], per_request["uvicorn"]),
            f"agentsite = daphne (python -m agentsite.serve), peer = uvicorn (h11, asyncio "
            f"loop), one process each, DEBUG off, Redis layer, access logs on: alice's chat page "
            f"({TURNS} turns) requested back to back for {seconds:g} s; ratio of the time per "
            "request (1 / requests per second), daphne ÷ uvicorn",
        ),
        compared(
            BENCHMARK,
            f"GET chat page, {CONNECTIONS} keep-alive connections: p99",
            throughput("daphne"),
            throughput("uvicorn"),
            ratio(http["daphne"], http["uvicorn"], p99),
            "the same requests: p99 of a request's time, daphne ÷ uvicorn",
        ),
        compared(
            BENCHMARK,
            f"websocket push to {SOCKETS} chat sockets, one event at a time",
            latency("daphne"),
            latency("uvicorn"),
            ratio(push["daphne"], push["uvicorn"], p99),
            f"{events_sent} text deltas published to the conversation's group through Redis, "
            f"each timed from the publish to its frame on each of {SOCKETS} sockets; ratio of "
            "the p99, daphne ÷ uvicorn",
        ),
        compared(
            BENCHMARK,
            f"websocket push to {SOCKETS} chat sockets, a burst",
            frames("daphne"),
            frames("uvicorn"),
            ratio(burst["daphne"], burst["uvicorn"]),
            f"{events_sent} text deltas published back to back, until every socket had every "
            "frame; ratio of the time per frame (1 / frames per second), daphne ÷ uvicorn",
        ),
        note(
            BENCHMARK,
            "granian",
            "not measured: granian is not installed (not a dependency; this session installs "
            "no package)",
        ),
    ]
