"""The trace socket through the real websocket stack (origin check, session auth, routing), and
the path of a live update: the exporter stores a batch on its own thread, announces it on the
server's event loop, and the open trace page is told to re-read its tree."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from agents.tracing import CustomSpanData, get_trace_provider
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator

from agentsite.db.hops import db_hop
from demo.seed import seed_orders
from engine import events, executor, runs, serverloop
from tests.approvals.test_consumers import HOST, ORIGIN, cookie_of
from tests.conftest import Traces
from tests.factories import (
    make_conversation,
    make_reviewer,
    make_run,
    make_span,
    make_staff,
    make_trace,
    make_user,
    make_viewer,
)
from tracing.exporter import DatabaseExporter
from tracing.models import Span, Trace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]


@pytest.fixture
def server_loop(settings: Any) -> Iterator[None]:
    """This test's event loop stands for the server's: `publish_threadsafe` sends from it.
    (Binding also starts the sweeper, unless it is off.) Bound by the test itself, on its loop."""
    settings.AGENTSITE_SWEEP_SECONDS = 0
    yield
    serverloop.bind(None)


async def open_socket(
    user: Any, trace_id: str, origin: tuple[bytes, bytes] = ORIGIN
) -> tuple[WebsocketCommunicator, bool]:
    from agentsite.asgi import router

    headers = [HOST, origin]
    if user is not None:
        headers.append(await cookie_of(user))
    communicator = WebsocketCommunicator(router, f"/ws/traces/{trace_id}/", headers=headers)
    connected, _ = await communicator.connect(timeout=3)
    return communicator, connected


def updated(trace_id: str, span_count: int, status: str = "running") -> events.TraceUpdated:
    return events.TraceUpdated(trace_id=trace_id, span_count=span_count, status=status)


@sync_to_async
def trace_with_spans(count: int, **kwargs: Any) -> Trace:
    trace = make_trace(**kwargs)
    Span.objects.bulk_create([make_span(trace, "custom", f"step {n}") for n in range(count)])
    return trace


@sync_to_async
def add_spans(trace: Trace, count: int) -> None:
    Span.objects.bulk_create([make_span(trace, "custom", "more") for _ in range(count)])


async def test_it_refuses_visitors_end_users_reviewers_and_foreign_origins() -> None:
    trace = await trace_with_spans(1)
    alice = await sync_to_async(make_user)(username="alice")
    rita = await sync_to_async(make_reviewer)("rita")
    sam = await sync_to_async(make_staff)()
    olga = await sync_to_async(make_viewer)()

    for user, trace_id, origin in [
        (None, trace.trace_id, ORIGIN),
        (alice, trace.trace_id, ORIGIN),
        (rita, trace.trace_id, ORIGIN),
        (sam, trace.trace_id, (b"origin", b"http://evil.example")),
        (sam, "trace_" + "f" * 100, ORIGIN),  # too long to name a channel group
    ]:
        communicator, connected = await open_socket(user, trace_id, origin)
        assert not connected, (user, trace_id, origin)
        await communicator.disconnect()

    for user in (sam, olga):
        communicator, connected = await open_socket(user, trace.trace_id)
        assert connected
        await communicator.disconnect()


async def test_an_open_trace_page_is_told_to_refresh_when_its_trace_grows() -> None:
    trace = await trace_with_spans(2, status="running")
    other = await trace_with_spans(1)
    sam = await sync_to_async(make_staff)()
    communicator, connected = await open_socket(sam, trace.trace_id)
    assert connected

    await add_spans(trace, 3)
    await events.publish([updated(trace.trace_id, 5)])
    frame = await communicator.receive_from(timeout=2)
    assert frame.startswith('<span id="trace-live" class="live-note is-active"')
    assert 'hx-swap-oob="true"' in frame
    assert f'hx-get="/traces/{trace.trace_id}/tree/" hx-trigger="load"' in frame
    assert 'hx-target="#trace-tree"' in frame
    assert "3 new spans — refreshing…" in frame

    # Nothing new for this page: nothing pushed. Another trace: not this page's business.
    await events.publish([updated(trace.trace_id, 5), updated(other.trace_id, 9)])
    assert await communicator.receive_nothing(timeout=0.1)
    # The same spans, but the run finished: the badge must change.
    await events.publish([updated(trace.trace_id, 5, "ok")])
    assert "Now ok — refreshing…" in await communicator.receive_from(timeout=2)

    await communicator.send_to(text_data="anything")
    assert await communicator.receive_nothing(timeout=0.1)
    await communicator.disconnect()
    await events.publish([updated(trace.trace_id, 6)])
    assert not get_channel_layer().groups.get(f"trace.{trace.trace_id}")


async def test_publish_threadsafe_from_a_plain_thread_reaches_the_servers_loop(
    server_loop: None,
) -> None:
    executor.bind_server_loop(asyncio.get_running_loop())
    trace = await trace_with_spans(1)
    olga = await sync_to_async(make_viewer)()
    communicator, connected = await open_socket(olga, trace.trace_id)
    assert connected

    thread = threading.Thread(
        target=events.publish_threadsafe, args=([updated(trace.trace_id, 4)],)
    )
    thread.start()
    await asyncio.to_thread(thread.join, 5)

    frame = await communicator.receive_from(timeout=2)
    assert "3 new spans" in frame
    await communicator.disconnect()


async def test_publish_threadsafe_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Any:
        raise RuntimeError("no layer")

    monkeypatch.setattr(events, "_publishing_loop", broken)
    # From a thread with no event loop and no server loop: through the (broken) publishing loop.
    await asyncio.to_thread(events.publish_threadsafe, [updated("trace_x", 1)])
    monkeypatch.setattr(events, "get_channel_layer", broken)
    # From this loop's thread: scheduled on it, and `publish` itself never raises.
    events.publish_threadsafe([updated("trace_x", 1)])
    events.publish_threadsafe(iter(()))
    await asyncio.sleep(0.01)


async def test_the_exporter_announces_each_batch_it_stored(server_loop: None) -> None:
    executor.bind_server_loop(asyncio.get_running_loop())
    sdk_trace = get_trace_provider().create_trace(name="live", trace_id=None)
    first = get_trace_provider().create_span(CustomSpanData("first", {}), parent=sdk_trace)
    first.start()
    first.finish()
    exporter = DatabaseExporter()
    # The trace page is open before the first batch arrives.
    await sync_to_async(make_trace)(trace_id=sdk_trace.trace_id, started_at=None)
    sam = await sync_to_async(make_staff)()
    communicator, connected = await open_socket(sam, sdk_trace.trace_id)
    assert connected

    # As the SDK's processor does: on a thread of its own.
    await asyncio.to_thread(exporter.export, [sdk_trace, first])
    assert "1 new span — refreshing…" in await communicator.receive_from(timeout=2)

    second = get_trace_provider().create_span(CustomSpanData("second", {}), parent=first)
    second.start()
    second.finish()
    await asyncio.to_thread(exporter.export, [second])
    assert "1 new span — refreshing…" in await communicator.receive_from(timeout=2)
    assert await Span.objects.filter(trace_id=sdk_trace.trace_id).acount() == 2
    await communicator.disconnect()


async def test_a_running_agent_grows_its_open_trace_page(
    server_loop: None, traces: Traces, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run, its spans stored by the processor's thread, the announcement on the server's
    loop, the page told: the whole path, in one process."""
    executor.bind_server_loop(asyncio.get_running_loop())
    monkeypatch.setattr("engine.executor.submit", lambda job, run_id: None)
    await sync_to_async(seed_orders)()
    alice = await sync_to_async(make_user)(username="alice")
    conversation = await sync_to_async(make_conversation)(owner=alice, agent_name="support")
    run = await runs.astart_run(conversation, "where is order 7", alice)
    sam = await sync_to_async(make_staff)()
    communicator, connected = await open_socket(sam, run.trace_id)
    assert connected

    await runs.execute(run.pk)
    await asyncio.to_thread(traces.flush)

    notes = []
    while not await communicator.receive_nothing(timeout=0.2):
        notes.append(re.sub(r"<[^>]+>", "", await communicator.receive_from()).strip())
    # The engine's status changes come first (the run's own events), then the spans.
    assert notes == [
        "Run running — refreshing…",
        "Run completed — refreshing…",
        "8 new spans — refreshing…",  # with the demo's input guardrail
    ]
    await communicator.disconnect()


async def test_the_runs_status_and_decisions_refresh_the_page_its_chat_does_not() -> None:
    run = await sync_to_async(make_run)(trace_id="trace_" + "a" * 32)
    other = await sync_to_async(make_run)(conversation=run.conversation)
    sam = await sync_to_async(make_staff)()
    communicator, connected = await open_socket(sam, run.trace_id)  # no span stored yet
    assert connected
    conversation = run.conversation_id

    def run_updated(run_id: int, status: str) -> events.RunUpdated:
        return events.RunUpdated(run_id=run_id, conversation_id=conversation, status=status)

    await events.publish(
        [
            events.TextDelta(run_id=run.pk, conversation_id=conversation, delta="Hel"),
            run_updated(other.pk, "completed"),
            run_updated(run.pk, "resuming"),
        ]
    )
    assert "Run resuming — refreshing…" in await communicator.receive_from(timeout=2)
    assert await communicator.receive_nothing(timeout=0.1)

    await events.publish(
        [
            events.ApprovalDecided(
                request_id=1,
                run_id=run.pk,
                conversation_id=conversation,
                status="rejected",
                decided_by="rita",
                decided_at=None,
            )
        ]
    )
    assert "Decision: rejected — refreshing…" in await communicator.receive_from(timeout=2)
    await communicator.disconnect()
    layer = get_channel_layer()
    assert not layer.groups.get(f"conversation.{conversation}")


def test_threads_without_a_loop_publish_on_one_loop_kept_for_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trace exporter's thread in a worker: each publish used to run on a new loop (so with
    Redis, a new connection each time). Now one loop serves them all, and the caller returns
    once its events are sent."""
    sent: list[tuple[asyncio.AbstractEventLoop, list[str]]] = []

    async def publish(items: Any) -> None:
        await asyncio.sleep(0.05)
        sent.append((asyncio.get_running_loop(), [item.trace_id for item in items]))

    monkeypatch.setattr(events, "publish", publish)
    for name, call in (
        ("trace_a", events.publish_threadsafe),
        ("trace_b", events.publish_threadsafe),
        ("trace_c", events.publish_sync),  # the heartbeat's and the recovery's way
    ):
        thread = threading.Thread(target=call, args=([updated(name, 1)],))
        thread.start()
        thread.join(5)
        assert sent and sent[-1][1] == [name]  # sent before the call returned
    assert len(sent) == 3
    assert sent[0][0] is sent[1][0] is sent[2][0]
    assert sent[0][0].is_running()


async def test_a_hops_work_publishes_from_the_loop_that_awaits_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit hook's publish in a `db_hop` (the run engine's writes) goes out from the
    caller's loop, whose channel-layer connections it shares (the in-memory layer is only
    safe there), not from the publishing loop."""
    sent: list[asyncio.AbstractEventLoop] = []

    async def publish(items: Any) -> None:
        sent.append(asyncio.get_running_loop())

    monkeypatch.setattr(events, "publish", publish)
    await db_hop(events.publish_threadsafe)([updated("trace_a", 1)])
    assert sent == [asyncio.get_running_loop()]
