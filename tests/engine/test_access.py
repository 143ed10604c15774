"""Access that ends while a socket is open ends the socket: a logout closes the sockets of that
session, and a push goes out only while its user may still see it (re-read from the database,
at most `engine.access.RECHECK_SECONDS` old; a change through Django's models re-checks at
once). Such a socket is closed with 4403, which live.js shows as "Log in again"."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from agentsite.asgi import router
from approvals.models import ApprovalRequest
from conversations.models import Conversation
from engine import access, events
from tests.approvals.test_consumers import HOST, ORIGIN
from tests.factories import (
    make_conversation,
    make_request,
    make_reviewer,
    make_span,
    make_trace,
    make_user,
    make_viewer,
)
from tracing.models import Trace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]

CLOSED = {"type": "websocket.close", "code": 4403}


@sync_to_async
def logged_in(user: Any) -> tuple[Client, tuple[bytes, bytes]]:
    client = Client()
    client.force_login(user)
    return client, (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def open_socket(path: str, cookie: tuple[bytes, bytes]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(router, path, headers=[HOST, ORIGIN, cookie])
    connected, _ = await communicator.connect(timeout=3)
    assert connected, path
    return communicator


# --- each socket: where it is, who may see it, and a push of data -------------------------


class Socket:
    """One of the three sockets, with a user allowed to see it and an event it pushes."""

    path: str

    async def setup(self) -> Any:
        raise NotImplementedError

    async def push(self) -> None:
        raise NotImplementedError

    async def revoke(self, user: Any) -> None:
        """Take the user's access away through Django's models (their signals fire)."""
        raise NotImplementedError

    async def revoke_quietly(self, user: Any) -> None:
        """Take it away behind Django's back: no signal, only the next push's check sees it."""
        raise NotImplementedError


class Chat(Socket):
    async def setup(self) -> Any:
        alice = await sync_to_async(make_user)(username="alice")
        self.conversation = await sync_to_async(make_conversation)(owner=alice)
        self.path = f"/ws/chats/{self.conversation.session_id}/"
        return alice

    async def push(self) -> None:
        delta = events.TextDelta(run_id=1, conversation_id=self.conversation.pk, delta="secret")
        await events.publish([delta])

    @sync_to_async
    def revoke_quietly(self, user: Any) -> None:
        bob = make_user(username="bob")
        Conversation.objects.filter(pk=self.conversation.pk).update(owner=bob)

    @sync_to_async
    def revoke(self, user: Any) -> None:
        user.is_active = False
        user.save()


class Inbox(Socket):
    path = "/ws/inbox/?show=pending"

    async def setup(self) -> Any:
        return await sync_to_async(make_reviewer)("rita")

    async def push(self) -> None:
        request = await sync_to_async(make_request)(arguments={"card": "secret"})
        request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
        await events.publish([events.ApprovalCreated.for_request(request)])

    @sync_to_async
    def revoke_quietly(self, user: Any) -> None:
        get_user_model().user_permissions.through.objects.filter(user_id=user.pk).delete()

    @sync_to_async
    def revoke(self, user: Any) -> None:
        user.user_permissions.clear()  # removed from the reviewers


class Traces(Socket):
    async def setup(self) -> Any:
        trace = await sync_to_async(make_trace)()
        self.trace_id = trace.trace_id
        self.path = f"/ws/traces/{trace.trace_id}/"
        self.spans = 0
        return await sync_to_async(make_viewer)("olga")

    async def push(self) -> None:
        trace = await Trace.objects.aget(trace_id=self.trace_id)
        await sync_to_async(make_span(trace, "custom", "more").save)()
        self.spans += 1
        await events.publish(
            [events.TraceUpdated(trace_id=self.trace_id, span_count=self.spans, status="running")]
        )

    @sync_to_async
    def revoke_quietly(self, user: Any) -> None:
        get_user_model().user_permissions.through.objects.filter(user_id=user.pk).delete()

    @sync_to_async
    def revoke(self, user: Any) -> None:
        user.user_permissions.clear()


SOCKETS = [Chat, Inbox, Traces]


async def pushes_data(socket: Socket, communicator: WebsocketCommunicator) -> None:
    await socket.push()
    assert (await communicator.receive_output(timeout=3))["type"] == "websocket.send"


async def closed_for_good(
    socket: Socket, communicator: WebsocketCommunicator, cause: Callable[[], Awaitable[Any]]
) -> None:
    await cause()
    await socket.push()
    assert await communicator.receive_output(timeout=3) == CLOSED
    await socket.push()
    assert await communicator.receive_nothing(timeout=0.2)
    await communicator.disconnect()


@pytest.mark.parametrize("kind", SOCKETS)
async def test_logging_out_closes_the_socket_of_that_session(kind: type[Socket]) -> None:
    socket = kind()
    user = await socket.setup()
    client, cookie = await logged_in(user)
    _, other_cookie = await logged_in(user)  # the same user in another browser
    communicator = await open_socket(socket.path, cookie)
    other = await open_socket(socket.path, other_cookie)
    await pushes_data(socket, communicator)
    assert (await other.receive_output(timeout=3))["type"] == "websocket.send"

    response = await sync_to_async(client.post)("/accounts/logout/")
    assert response.status_code == 302
    assert await communicator.receive_output(timeout=3) == CLOSED
    await socket.push()
    assert await communicator.receive_nothing(timeout=0.2)
    # The other browser's session still holds: its socket goes on.
    assert (await other.receive_output(timeout=3))["type"] == "websocket.send"
    await communicator.disconnect()
    await other.disconnect()


@pytest.mark.parametrize("kind", SOCKETS)
async def test_an_ended_session_closes_the_socket_at_its_next_push(
    kind: type[Socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = kind()
    user = await socket.setup()
    client, cookie = await logged_in(user)
    communicator = await open_socket(socket.path, cookie)
    await pushes_data(socket, communicator)

    # The session expires or is deleted without a logout (no signal): the next push re-checks.
    monkeypatch.setattr(access, "RECHECK_SECONDS", 0.0)
    await closed_for_good(socket, communicator, sync_to_async(client.session.delete))


@pytest.mark.parametrize("kind", SOCKETS)
async def test_a_revoked_permission_closes_the_socket_before_the_next_push(
    kind: type[Socket],
) -> None:
    socket = kind()
    user = await socket.setup()
    _, cookie = await logged_in(user)
    communicator = await open_socket(socket.path, cookie)
    await pushes_data(socket, communicator)

    await closed_for_good(socket, communicator, lambda: socket.revoke(user))


@pytest.mark.parametrize("kind", SOCKETS)
async def test_a_permission_revoked_behind_django_s_back_is_seen_at_the_next_push(
    kind: type[Socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    socket = kind()
    user = await socket.setup()
    _, cookie = await logged_in(user)
    communicator = await open_socket(socket.path, cookie)
    await pushes_data(socket, communicator)

    monkeypatch.setattr(access, "RECHECK_SECONDS", 0.0)  # no waiting for the check to age
    await closed_for_good(socket, communicator, lambda: socket.revoke_quietly(user))


@sync_to_async
def reviewer_by_group() -> tuple[Any, Any]:
    from django.contrib.auth.models import Group, Permission

    reviewers = Group.objects.create(name="Reviewers")
    reviewers.permissions.add(
        Permission.objects.get(
            content_type__app_label="approvals", codename="decide_approvalrequest"
        )
    )
    rita = make_user(username="rita")
    rita.groups.add(reviewers)
    return rita, reviewers


@pytest.mark.parametrize(
    "remove",
    [
        lambda rita, group: rita.groups.remove(group),
        lambda rita, group: group.user_set.remove(rita),
        lambda rita, group: group.permissions.clear(),
        lambda rita, group: group.user_set.clear(),
        lambda rita, group: group.delete(),
        lambda rita, group: group.permissions.get().group_set.clear(),
    ],
    ids=[
        "her-groups",
        "the-group-s-users",
        "the-group-s-permissions",
        "all-the-group-s-users",
        "the-group-deleted",
        "the-permission-s-groups",
    ],
)
async def test_a_reviewer_removed_from_reviewers_gets_no_further_rows(remove: Any) -> None:
    rita, reviewers = await reviewer_by_group()
    socket = Inbox()
    _, cookie = await logged_in(rita)
    communicator = await open_socket(socket.path, cookie)
    await pushes_data(socket, communicator)

    await closed_for_good(socket, communicator, sync_to_async(lambda: remove(rita, reviewers)))
