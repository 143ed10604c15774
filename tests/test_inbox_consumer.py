"""The inbox socket, through the real websocket stack (origin check, session auth, routing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from agentsite import events, runs
from agentsite.asgi import router
from agentsite.demo.seed import seed_orders
from approvals.models import ApprovalRequest
from tests.factories import make_conversation, make_user
from tests.test_inbox import XSS, make_request, make_reviewer

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture(autouse=True)
async def fresh_layer() -> None:
    """Groups of the in-memory layer outlive a test; start each one with none."""
    await get_channel_layer().flush()


@sync_to_async
def cookie_of(user: Any) -> tuple[bytes, bytes]:
    """The session cookie of `user`, logged in through Django's own session machinery."""
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def open_socket(
    user: Any = None, path: str = "/ws/inbox/?show=pending", origin: tuple[bytes, bytes] = ORIGIN
) -> tuple[WebsocketCommunicator, bool]:
    headers = [origin]
    if user is not None:
        headers.append(await cookie_of(user))
    communicator = WebsocketCommunicator(router, path, headers=headers)
    connected, _ = await communicator.connect(timeout=3)
    return communicator, connected


async def created(request: ApprovalRequest) -> None:
    await events.publish(
        [
            events.ApprovalCreated(
                request_id=request.pk,
                run_id=request.run_id,
                conversation_id=request.run.conversation_id,
                agent_name=request.agent_name,
                tool_name=request.tool_name,
                call=request.call_display(),
                created=request.created,
                expires_at=request.expires_at,
            )
        ]
    )


async def test_it_refuses_visitors_end_users_foreign_origins_and_bad_queries() -> None:
    alice = await sync_to_async(make_user)(username="alice")
    rita = await sync_to_async(make_reviewer)()

    for user, path, origin in [
        (None, "/ws/inbox/", ORIGIN),
        (alice, "/ws/inbox/", ORIGIN),
        (rita, "/ws/inbox/", (b"origin", b"http://evil.example")),
        (rita, "/ws/inbox/?show=everything", ORIGIN),
        (rita, "/ws/inbox/?show=request&request=abc", ORIGIN),
    ]:
        communicator, connected = await open_socket(user, path, origin)
        assert not connected, (user, path, origin)
        await communicator.disconnect()

    communicator, connected = await open_socket(rita, "/ws/inbox/")
    assert connected
    await communicator.disconnect()


async def test_a_reviewer_gets_the_new_row_escaped_with_the_count() -> None:
    rita = await sync_to_async(make_reviewer)()
    request = await sync_to_async(make_request)(tool_name="send_email", arguments={"body": XSS})
    request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
    communicator, connected = await open_socket(rita)
    assert connected

    await created(request)

    frame = await communicator.receive_from(timeout=2)
    assert frame.startswith(
        f'<div hx-swap-oob="afterbegin:#pending-rows"><li id="request-{request.pk}" '
        'class="row row-pending">'
    )
    assert XSS not in frame and "&lt;script&gt;" in frame
    assert 'hx-post="/inbox/' in frame and 'name="csrfmiddlewaretoken"' not in frame
    assert '<span id="pending-count"' in frame and 'data-title-count="1"' in frame
    await communicator.disconnect()


async def test_a_pausing_run_reaches_the_open_inbox(submitted: list) -> None:
    await sync_to_async(seed_orders)()
    rita = await sync_to_async(make_reviewer)()
    alice = await sync_to_async(make_user)(username="alice")
    conversation = await sync_to_async(make_conversation)(owner=alice, agent_name="support")
    communicator, connected = await open_socket(rita)
    assert connected

    run = await runs.astart_run(conversation, "cancel order 42", alice)
    await runs.execute(run.pk)

    frame = await communicator.receive_from(timeout=2)
    request = await ApprovalRequest.objects.aget(run=run)
    assert f'<li id="request-{request.pk}" class="row row-pending">' in frame
    assert ">cancel_order</a>" in frame and "asked by <strong>alice</strong>" in frame
    assert 'data-title-count="1"' in frame
    await communicator.disconnect()


async def test_a_decision_by_another_reviewer_updates_every_open_page() -> None:
    rita = await sync_to_async(make_reviewer)()
    bob = await sync_to_async(make_reviewer)("bob")
    request = await sync_to_async(make_request)()
    other = await sync_to_async(make_request)()
    inbox, _ = await open_socket(rita)
    detail, _ = await open_socket(rita, f"/ws/inbox/?show=request&request={request.pk}")
    other_detail, _ = await open_socket(rita, f"/ws/inbox/?show=request&request={other.pk}")
    history, _ = await open_socket(rita, "/ws/inbox/")

    await runs.adecide(request.pk, bob, True, message="fine")

    row = await inbox.receive_from(timeout=2)
    assert row.startswith(
        f'<li id="request-{request.pk}" class="row row-decided is-approved" hx-swap-oob="true">'
    )
    assert "by bob" in row and 'data-title-count="1"' in row
    panel = await detail.receive_from(timeout=2)
    assert panel.startswith(f'<section id="decision-{request.pk}" class="panel decision"')
    assert 'hx-swap-oob="true"' in panel and "by <strong>bob</strong>" in panel
    assert "fine" in panel and f"/inbox/{other.pk}/" in panel  # the next request
    for socket in (other_detail, history):
        badge = await socket.receive_from(timeout=2)
        assert badge.startswith('<span id="pending-count"') and 'data-title-count="1"' in badge
    for socket in (inbox, detail, other_detail, history):
        assert await socket.receive_nothing(timeout=0.1)
        await socket.disconnect()


async def test_a_filtered_inbox_gets_only_its_rows() -> None:
    rita = await sync_to_async(make_reviewer)()
    refund = await sync_to_async(make_request)(tool_name="issue_refund", arguments={"a": 1})
    cancel = await sync_to_async(make_request)(tool_name="cancel_order")
    communicator, _ = await open_socket(rita, "/ws/inbox/?show=pending&tool=issue_refund")

    for request in (cancel, refund):
        request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
        await created(request)

    only_count = await communicator.receive_from(timeout=2)
    assert only_count.startswith('<span id="pending-count"')
    row = await communicator.receive_from(timeout=2)
    assert f'<li id="request-{refund.pk}"' in row
    await communicator.disconnect()


async def test_a_stale_hint_pushes_only_the_count_and_the_socket_decides_nothing() -> None:
    rita = await sync_to_async(make_reviewer)()
    request = await sync_to_async(make_request)()
    await sync_to_async(runs.decide)(request, rita, True)
    request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
    communicator, _ = await open_socket(rita)

    await created(request)  # arrives after the request was decided
    frame = await communicator.receive_from(timeout=2)
    assert frame.startswith('<span id="pending-count"') and 'data-title-count="0"' in frame

    await communicator.send_to(text_data='{"action": "approve", "request": 1}')
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


async def test_nothing_arrives_after_the_socket_closes() -> None:
    rita = await sync_to_async(make_reviewer)()
    request = await sync_to_async(make_request)()
    request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
    communicator, _ = await open_socket(rita)
    await communicator.disconnect()
    await created(request)
    await asyncio.sleep(0.05)
    layer = get_channel_layer()
    assert not layer.groups.get(events.INBOX_GROUP)
