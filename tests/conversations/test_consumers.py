"""The chat page's socket, through the real ASGI application: origin check, session-cookie
authentication, ownership, and the fragments it pushes."""

from __future__ import annotations

import asyncio
import html
import re
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from agentsite.asgi import application
from conversations.models import Conversation
from demo.seed import seed_orders
from engine import events, runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_request, make_run, make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("quiet_server", "fresh_registry"),
]

ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")


def session_cookie(user: Any) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


def setup_alice() -> tuple[Any, Conversation, tuple[bytes, bytes]]:
    seed_orders()
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice, agent_name="support")
    return alice, conversation, session_cookie(alice)


def socket(conversation: Conversation, *headers: tuple[bytes, bytes]) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, f"/ws/chats/{conversation.session_id}/", headers=[HOST, *headers]
    )


async def receive_until(communicator: WebsocketCommunicator, needle: str) -> list[str]:
    """Every frame up to and including the first that contains `needle`."""
    frames: list[str] = []
    while True:
        frame = await communicator.receive_from(timeout=5)
        frames.append(frame)
        if needle in frame:
            return frames


async def test_the_owner_connects() -> None:
    _, conversation, cookie = await sync_to_async(setup_alice)()
    communicator = socket(conversation, cookie, ORIGIN)
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_nothing(timeout=0.1)
    await communicator.disconnect()


async def test_anyone_else_is_refused_before_the_socket_opens() -> None:
    _, conversation, alice_cookie = await sync_to_async(setup_alice)()
    bob = await sync_to_async(make_user)(username="bob")
    bob_cookie = await sync_to_async(session_cookie)(bob)

    for headers in (
        [bob_cookie, ORIGIN],  # another user
        [ORIGIN],  # nobody logged in
        [alice_cookie, (b"origin", b"http://evil.example")],  # another site's page
        [alice_cookie],  # no Origin at all
    ):
        communicator = socket(conversation, *headers)
        connected, _ = await communicator.connect()
        assert not connected, headers
        await communicator.disconnect()

    missing = WebsocketCommunicator(
        application, "/ws/chats/conv_nobody_has_this/", headers=[HOST, alice_cookie, ORIGIN]
    )
    connected, _ = await missing.connect()
    assert not connected


async def test_a_text_delta_arrives_as_escaped_text_for_the_run_s_block() -> None:
    _, conversation, cookie = await sync_to_async(setup_alice)()
    communicator = socket(conversation, cookie, ORIGIN)
    await communicator.connect()

    await events.publish(
        [events.TextDelta(run_id=5, conversation_id=conversation.pk, delta="<b>Hi</b> & ")]
    )

    frame = await communicator.receive_from(timeout=2)
    assert frame == (
        '<span hx-swap-oob="beforeend:#run-5-text" data-delta data-run="5" data-segment="0" '
        'data-at="0" data-end="12">&lt;b&gt;Hi&lt;/b&gt; &amp; </span>'
    )
    await communicator.disconnect()


async def test_events_of_other_conversations_never_arrive() -> None:
    alice, conversation, cookie = await sync_to_async(setup_alice)()
    other = await sync_to_async(make_conversation)(owner=alice)
    communicator = socket(conversation, cookie, ORIGIN)
    await communicator.connect()

    await events.publish([events.TextDelta(run_id=1, conversation_id=other.pk, delta="x")])

    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


def make_waiting_run(conversation: Conversation) -> AgentRun:
    run = make_run(conversation=conversation, input="cancel <order> 42")
    make_request(
        run=run,
        call_id="call_1",
        expires_at=timezone.now() + timedelta(hours=1),
    )
    return run


async def test_run_updated_pushes_the_run_s_block_as_the_database_has_it() -> None:
    _, conversation, cookie = await sync_to_async(setup_alice)()
    run = await sync_to_async(make_waiting_run)(conversation)
    communicator = socket(conversation, cookie, ORIGIN)
    await communicator.connect()

    # The event's own status is only a hint: the block says what the database says.
    await events.publish(
        [
            events.RunUpdated(
                run_id=run.pk, conversation_id=conversation.pk, status=RunStatus.COMPLETED
            )
        ]
    )

    frame = await communicator.receive_from(timeout=2)
    assert frame.startswith(f'<div id="run-{run.pk}" class="turn" data-status="waiting"')
    assert (
        "A person will confirm: cancel an order that has not been delivered yet (order 42)" in frame
    )
    assert "cancel &lt;order&gt; 42" in frame  # her message, escaped
    assert "<order>" not in frame
    block, header = frame.split('<h1 id="chat-title"', 1)
    assert "hx-swap-oob" not in block  # replaced by id, as the ws extension does by default
    assert 'hx-swap-oob="true">cancel &lt;order&gt; 42</h1>' in header  # the title it gives
    await communicator.disconnect()


async def test_a_failed_run_s_block_says_why() -> None:
    _, conversation, cookie = await sync_to_async(setup_alice)()
    run = await AgentRun.objects.acreate(
        conversation=conversation,
        agent_name="support",
        input="hello",
        status=RunStatus.FAILED,
        error="The agent failed: <RateLimitError>",
        finished=timezone.now() + timedelta(seconds=1),
    )
    communicator = socket(conversation, cookie, ORIGIN)
    await communicator.connect()

    await events.publish(
        [events.RunUpdated(run_id=run.pk, conversation_id=conversation.pk, status="failed")]
    )

    frame = await communicator.receive_from(timeout=2)
    assert "The agent couldn't finish this reply." in frame
    assert "The agent failed: &lt;RateLimitError&gt;" in frame
    await communicator.disconnect()


async def test_a_whole_turn_streams_word_by_word_then_shows_the_reply(
    submitted: list, settings: Any
) -> None:
    settings.AGENTSITE_DEMO_STREAM_DELAY = 0.02  # a word every 20 ms, as a model writes
    alice, conversation, cookie = await sync_to_async(setup_alice)()
    communicator = socket(conversation, cookie, ORIGIN)
    await communicator.connect()

    run = await sync_to_async(runs.start_run)(conversation, "where is order 7", alice)
    queued = await communicator.receive_from(timeout=2)
    # A new run goes into the slot after the previous one (none here), before any word.
    assert queued.startswith('<div id="after-run-0" class="slot" hx-swap-oob="outerHTML">')
    assert f'<div id="run-{run.pk}" class="turn" data-status="queued" data-active>' in queued
    assert f'<div id="after-run-{run.pk}" class="slot"></div>' in queued

    await runs.execute(run.pk)
    frames = await receive_until(communicator, 'data-status="completed"')

    deltas = [
        f for f in frames if f.startswith(f'<span hx-swap-oob="beforeend:#run-{run.pk}-text"')
    ]
    # A piece per word as they came (a few together when they came while the one before was
    # still being sent: `streaming.Deltas`), each piece where the one before it ended.
    assert len(deltas) > 5
    ats = [int(re.findall(r'data-at="(\d+)"', delta)[0]) for delta in deltas]
    texts = [html.unescape(re.sub(r"<[^>]+>", "", delta)) for delta in deltas]
    assert ats == [len("".join(texts[:i])) for i in range(len(texts))]
    words = "".join(texts)
    assert words.startswith("Here is what I found:")
    running = frames[0]
    assert 'data-status="running"' in running and f'id="run-{run.pk}-text"' in running
    completed = frames[-1]
    # Her call in plain words (the call itself is for operators).
    assert "what was refunded (order 7)</span>" in completed
    assert "lookup_order(" not in completed
    assert "Here is what I found:" in completed
    assert f'id="run-{run.pk}-text"' not in completed  # the reply, not the stream
    await communicator.disconnect()


async def test_a_paused_turn_says_what_it_waits_for(submitted: list) -> None:
    alice, conversation, cookie = await sync_to_async(setup_alice)()
    communicator = socket(conversation, cookie, ORIGIN)
    await communicator.connect()

    run = await sync_to_async(runs.start_run)(conversation, "cancel order 42", alice)
    await runs.execute(run.pk)
    frames = await receive_until(communicator, "A person will confirm:")

    assert (
        "A person will confirm: cancel an order that has not been delivered yet (order 42)"
        in frames[-1]
    )
    await asyncio.sleep(0)
    await communicator.disconnect()


async def test_a_change_made_in_another_window_makes_the_page_re_read() -> None:
    _, conversation, cookie = await sync_to_async(setup_alice)()
    communicator = socket(conversation, cookie, ORIGIN)
    connected, _ = await communicator.connect()
    assert connected
    other = await sync_to_async(make_conversation)(owner=conversation.owner)

    await events.publish([events.ConversationChanged(conversation_id=other.pk)])
    assert await communicator.receive_nothing(timeout=0.1)  # another conversation's
    await events.publish([events.ConversationChanged(conversation_id=conversation.pk)])
    assert await communicator.receive_from(timeout=2) == "<template data-resync-now></template>"
    await communicator.disconnect()
