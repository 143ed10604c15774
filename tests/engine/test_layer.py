"""A Redis outage under a real daphne (`engine/layer.py`, the consumers, publishing): stopped,
the site keeps working from the database and its sockets say that live updates are paused;
started again, new sockets are live at once, without restarting daphne."""

from __future__ import annotations

import asyncio
import http.cookiejar
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from conversations.models import Conversation
from engine import events
from engine.access import PAUSED_CODE
from engine.models import AgentRun, RunStatus
from tests.agentsite.test_serve import send, signed_in
from tests.factories import make_conversation, make_user
from tests.live import LiveSite, start_site, stop_site
from tests.live import test_database_url as live_database_url
from tests.services import RedisServer, running_redis

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

REPLY_WORDS = "Here is what I found"  # the demo model's answer to "where is order N"


@dataclass
class Chat:
    """alice, signed in to a real site, and one of her conversations."""

    site: LiveSite
    redis: RedisServer
    opener: urllib.request.OpenerDirector
    conversation: Conversation

    @property
    def socket_url(self) -> str:
        return self.site.url.replace("http://", "ws://") + f"/ws/chats/{self.session_id}/"

    @property
    def session_id(self) -> str:
        return self.conversation.session_id

    def cookie(self) -> str:
        handlers = getattr(self.opener, "handlers", [])
        jars = [h.cookiejar for h in handlers if isinstance(h, urllib.request.HTTPCookieProcessor)]
        jar: http.cookiejar.CookieJar = jars[0]
        return "; ".join(f"{cookie.name}={cookie.value}" for cookie in jar)

    async def socket(self) -> ClientConnection:
        return await connect(
            self.socket_url,
            additional_headers={"Cookie": self.cookie(), "Origin": self.site.url},
            open_timeout=5,
        )

    async def say(self, text: str) -> None:
        await asyncio.to_thread(send, self.site, self.opener, self.session_id, text)

    def page(self) -> str:
        url = f"{self.site.url}/chats/{self.session_id}/"
        with self.opener.open(url, timeout=10) as response:
            assert response.status == 200
            return str(response.read().decode())


@pytest.fixture
def chat(tmp_path: Path) -> Iterator[Chat]:
    alice = make_user()
    conversation = make_conversation(owner=alice, agent_name="support")
    with running_redis(tmp_path / "redis") as redis:
        site = start_site(
            live_database_url(), tmp_path / "site.log", extra_env={"REDIS_URL": redis.url}
        )
        try:
            yield Chat(site, redis, signed_in(site, alice.username), conversation)
        finally:
            stop_site(site)


async def read_until(socket: ClientConnection, text: str, within: float = 10) -> str:
    """What the socket receives until a frame holds `text`."""
    frames: list[str] = []
    try:
        async with asyncio.timeout(within):
            while not any(text in frame for frame in frames):
                frames.append(str(await socket.recv()))
    except TimeoutError:
        raise AssertionError(f"no {text!r} within {within} s; got {frames}") from None
    return "".join(frames)


async def close_code(socket: ClientConnection, within: float = 5) -> int | None:
    """The code the server closes the socket with (frames before it are skipped)."""
    try:
        async with asyncio.timeout(within):
            while True:
                await socket.recv()
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd else None


def run_statuses(conversation: Conversation) -> list[str]:
    return list(
        AgentRun.objects.filter(conversation=conversation)
        .order_by("pk")
        .values_list("status", flat=True)
    )


async def wait_for_runs(conversation: Conversation, count: int, within: float = 15) -> list[str]:
    deadline = time.monotonic() + within
    while True:
        statuses = await asyncio.to_thread(run_statuses, conversation)
        done = [s for s in statuses if s not in (RunStatus.QUEUED, RunStatus.RUNNING)]
        if len(done) >= count or time.monotonic() > deadline:
            return statuses
        await asyncio.sleep(0.1)


def test_after_redis_comes_back_a_new_socket_is_live_at_once(chat: Chat) -> None:
    async def scenario() -> None:
        # Several sockets at once, as several open pages make: the server's pool holds
        # several connections to Redis, and each of them breaks with the outage.
        sockets = await asyncio.gather(*(chat.socket() for _ in range(4)))
        await chat.say("where is order 7")
        for socket in sockets:
            await read_until(socket, REPLY_WORDS)
        await asyncio.to_thread(chat.redis.stop)
        for socket in sockets:
            await close_code(socket)  # told, or broken: either way its page reconnects
        await asyncio.to_thread(chat.redis.start)

        # The first socket after the restart, and the next ones, are live: no daphne restart.
        for attempt in range(3):
            try:
                socket = await chat.socket()
            except InvalidStatus as refused:
                raise AssertionError(f"socket {attempt} after the restart: {refused}") from None
            await chat.say(f"where is order {attempt + 1}")
            assert REPLY_WORDS in await read_until(socket, REPLY_WORDS)
            await socket.close()
            await wait_for_runs(chat.conversation, attempt + 2)

    asyncio.run(scenario())
    assert "Traceback" not in chat.site.log(), chat.site.log()


def test_while_redis_is_down_pages_work_messages_run_and_sockets_say_paused(chat: Chat) -> None:
    async def scenario() -> None:
        socket = await chat.socket()
        await asyncio.to_thread(chat.redis.stop)
        # An open socket is told, with the code that makes its page poll.
        assert await close_code(socket) == PAUSED_CODE
        # A new one gets a valid handshake, and the same answer.
        started = time.monotonic()
        socket = await chat.socket()
        assert await close_code(socket) == PAUSED_CODE
        assert time.monotonic() - started < 3

        # The page loads, a message is sent and its run completes, from the database alone.
        await asyncio.to_thread(chat.page)
        started = time.monotonic()
        await chat.say("where is order 7")
        assert time.monotonic() - started < 3
        assert await wait_for_runs(chat.conversation, 1) == [RunStatus.COMPLETED]
        assert REPLY_WORDS in await asyncio.to_thread(chat.page)

    asyncio.run(scenario())
    log = chat.site.log()
    # Each dropped event is not an error of its own: the outage is logged once.
    assert log.count("Could not publish") == 1, log
    assert "Traceback" not in log, log


def test_a_redis_that_does_not_answer_holds_no_handshake_request_or_run(chat: Chat) -> None:
    # Stopped with SIGSTOP: its port still accepts connections, but nothing is answered.
    assert chat.redis.process is not None
    pid = chat.redis.process.pid

    async def scenario() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            socket = await chat.socket()
            assert await close_code(socket, within=8) == PAUSED_CODE
            assert time.monotonic() - started < 6
            started = time.monotonic()
            await chat.say("where is order 7")
            assert time.monotonic() - started < 5
            assert await wait_for_runs(chat.conversation, 1) == [RunStatus.COMPLETED]
        finally:
            os.kill(pid, signal.SIGCONT)

    asyncio.run(scenario())


async def test_publish_waits_on_a_silent_layer_once_then_drops_events(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    class SilentLayer:
        async def group_send(self, group: str, message: dict[str, object]) -> None:
            calls.append(group)
            await asyncio.sleep(3600)

    monkeypatch.setattr(events, "get_channel_layer", SilentLayer)
    monkeypatch.setattr(events, "PUBLISH_SECONDS", 0.2, raising=False)
    monkeypatch.setattr(events, "_outage", events._Outage())
    started = time.monotonic()
    async with asyncio.timeout(5):
        for word in range(50):  # a streamed reply
            delta = events.TextDelta(run_id=1, conversation_id=1, delta=f"{word} ")
            await events.publish([delta])
    assert time.monotonic() - started < 1
    assert calls == ["conversation.1"]
    assert len([r for r in caplog.records if "Could not publish" in r.getMessage()]) == 1
