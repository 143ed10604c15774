"""The inbox socket, through the real websocket stack (origin check, session auth, routing)."""

from __future__ import annotations

import asyncio
from html import escape
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from agentsite.asgi import router
from approvals.forms import InboxSocketForm
from approvals.models import ApprovalRequest
from demo.seed import seed_orders
from engine import events, runs
from tests.approvals.test_views import XSS
from tests.factories import make_conversation, make_request, make_reviewer, make_run, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]

ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")  # as a browser sends it: the origin served is http://127.0.0.1


@sync_to_async
def cookie_of(user: Any) -> tuple[bytes, bytes]:
    """The session cookie of `user`, logged in through Django's own session machinery."""
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


async def open_socket(
    user: Any = None, path: str = "/ws/inbox/?show=pending", origin: tuple[bytes, bytes] = ORIGIN
) -> tuple[WebsocketCommunicator, bool]:
    headers = [HOST, origin]
    if user is not None:
        headers.append(await cookie_of(user))
    communicator = WebsocketCommunicator(router, path, headers=headers)
    connected, _ = await communicator.connect(timeout=3)
    return communicator, connected


async def created(request: ApprovalRequest) -> None:
    await events.publish([events.ApprovalCreated.for_request(request)])


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

    await runs.adecide(request.pk, bob, runs.Decision.approve(note="fine"))

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

    # Not its row: the filter's choices (which now offer its tool) and the count.
    no_row = await communicator.receive_from(timeout=2)
    assert no_row.startswith('<div id="filter-fields" class="filter-fields" hx-swap-oob="true">')
    assert '<option value="cancel_order">' in no_row
    assert '<option value="issue_refund" selected>' in no_row
    assert "<li" not in no_row and '<span id="pending-count"' in no_row
    row = await communicator.receive_from(timeout=2)
    assert f'<li id="request-{refund.pk}"' in row
    assert '<div id="filter-fields"' in row
    await communicator.disconnect()


async def test_an_inbox_filtered_by_kind_or_server_gets_only_its_rows() -> None:
    rita = await sync_to_async(make_reviewer)()
    function = await sync_to_async(make_request)(tool_name="restock")
    served = await sync_to_async(make_request)(tool_name="restock", kind="mcp", server="warehouse")
    shell = await sync_to_async(make_request)(
        tool_name="shell", kind="shell", arguments={"commands": ["ls"]}
    )
    by_server, _ = await open_socket(rita, "/ws/inbox/?show=pending&server=warehouse")
    by_kind, _ = await open_socket(rita, "/ws/inbox/?show=pending&kind=shell")

    for request in (function, served, shell):
        request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
        await created(request)

    for socket, wanted in ((by_server, served), (by_kind, shell)):
        frames = [await socket.receive_from(timeout=2) for _ in range(3)]
        rows = [frame for frame in frames if '<li id="request-' in frame]
        assert len(rows) == 1 and f'<li id="request-{wanted.pk}"' in rows[0], frames
        assert 'name="next" value="/inbox/?' in rows[0]
        await socket.disconnect()

    # Its decision reaches the list it is in, and only that one.
    by_server, _ = await open_socket(rita, "/ws/inbox/?show=pending&server=warehouse")
    other, _ = await open_socket(rita, "/ws/inbox/?show=pending&server=deepwiki")
    await runs.adecide(served.pk, rita, runs.Decision.approve())
    assert f'<li id="request-{served.pk}"' in await by_server.receive_from(timeout=2)
    assert (await other.receive_from(timeout=2)).startswith('<span id="pending-count"')
    for socket in (by_server, other):
        await socket.disconnect()


async def test_a_stale_hint_pushes_only_the_count_and_the_socket_decides_nothing() -> None:
    rita = await sync_to_async(make_reviewer)()
    request = await sync_to_async(make_request)()
    await sync_to_async(runs.decide)(request, rita, runs.Decision.approve())
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


# --- one render per event, shared by the sockets that show the same thing -------------------


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Counts the row, filter and panel renders and the pending counts the sockets make."""
    from approvals import consumers, views

    consumers._shared.clear()
    calls: dict[str, list[Any]] = {"row": [], "count": [], "panel": [], "filters": []}
    render_row, pending_count, panel_context, render_filters = (
        views.render_row,
        views.pending_count,
        views.panel_context,
        views.render_filters,
    )

    def counted_row(approval: Any, **context: Any) -> str:
        calls["row"].append(context.get("back"))
        return render_row(approval, **context)

    def counted_count() -> int:
        calls["count"].append(1)
        return pending_count()

    def counted_panel(approval: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls["panel"].append(approval.pk)
        return panel_context(approval, *args, **kwargs)

    def counted_filters(form: Any) -> str:
        calls["filters"].append(form.cleaned_data)
        return render_filters(form)

    monkeypatch.setattr(views, "render_row", counted_row)
    monkeypatch.setattr(views, "render_filters", counted_filters)
    monkeypatch.setattr(views, "pending_count", counted_count)
    monkeypatch.setattr(views, "panel_context", counted_panel)
    return calls


async def open_sockets(user: Any, paths: list[str]) -> list[WebsocketCommunicator]:
    cookie = await cookie_of(user)
    sockets = []
    for path in paths:
        communicator = WebsocketCommunicator(router, path, headers=[HOST, ORIGIN, cookie])
        connected, _ = await communicator.connect(timeout=3)
        assert connected, path
        sockets.append(communicator)
    return sockets


async def test_twenty_inboxes_get_the_same_row_rendered_once(renders: dict) -> None:
    rita = await sync_to_async(make_reviewer)()
    await sync_to_async(make_request)()  # already pending
    request = await sync_to_async(make_request)(tool_name="send_email", arguments={"body": XSS})
    request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
    sockets = await open_sockets(rita, ["/ws/inbox/?show=pending"] * 20)

    await created(request)

    frames = [await socket.receive_from(timeout=3) for socket in sockets]
    assert len(set(frames)) == 1
    frame = frames[0]
    assert frame.startswith(
        f'<div hx-swap-oob="afterbegin:#pending-rows"><li id="request-{request.pk}" '
    )
    assert XSS not in frame and 'name="next" value="/inbox/"' in frame
    assert '<span id="pending-count"' in frame and 'data-title-count="2"' in frame
    assert renders["row"] == ["/inbox/"] and len(renders["count"]) == 1

    # The next event renders afresh: a decision of the same request, seen by the same sockets.
    await runs.adecide(request.pk, rita, runs.Decision.reject())
    frames = [await socket.receive_from(timeout=3) for socket in sockets]
    assert len(set(frames)) == 1
    assert frames[0].startswith(
        f'<li id="request-{request.pk}" class="row row-decided is-rejected"'
    )
    assert 'data-title-count="1"' in frames[0]
    assert len(renders["row"]) == 2 and len(renders["count"]) == 2
    for socket in sockets:
        assert await socket.receive_nothing(timeout=0.05)
        await socket.disconnect()


async def test_each_view_gets_its_own_fragment_rendered_once(renders: dict) -> None:
    rita = await sync_to_async(make_reviewer)()
    request = await sync_to_async(make_request)(tool_name="issue_refund", agent_name="Billing")
    other = await sync_to_async(make_request)()
    request = await ApprovalRequest.objects.select_related("run").aget(pk=request.pk)
    views_ = {
        "all": "/ws/inbox/?show=pending",
        "tool": "/ws/inbox/?show=pending&tool=issue_refund",
        "both": "/ws/inbox/?show=pending&agent=Billing&tool=issue_refund",
        "elsewhere": "/ws/inbox/?show=pending&tool=cancel_order",
        "detail": f"/ws/inbox/?show=request&request={request.pk}",
        "other_detail": f"/ws/inbox/?show=request&request={other.pk}",
        "count": "/ws/inbox/",
    }
    names = [name for name in views_ for _ in range(3)]
    sockets = await open_sockets(rita, [views_[name] for name in names])

    async def frames() -> dict[str, str]:
        got: dict[str, set[str]] = {}
        for name, socket in zip(names, sockets, strict=True):
            got.setdefault(name, set()).add(await socket.receive_from(timeout=3))
        assert all(len(texts) == 1 for texts in got.values()), got  # same view, same text
        return {name: texts.pop() for name, texts in got.items()}

    # A new request: a row for each list it belongs in, with that list's link back.
    await created(request)
    new = await frames()
    backs = {
        "all": "/inbox/",
        "tool": "/inbox/?tool=issue_refund",
        "both": "/inbox/?agent=Billing&tool=issue_refund",
    }
    rows = {name: new[name].split('<div id="filter-fields"')[0] for name in views_}
    for name, back in backs.items():
        assert f'<li id="request-{request.pk}" class="row row-pending">' in rows[name]
        assert f'name="next" value="{escape(back)}"' in rows[name]
        assert rows[name].replace(escape(back), "/inbox/") == rows["all"]  # only the link differs
    badge = new["count"]
    assert badge.startswith('<span id="pending-count"') and 'data-title-count="2"' in badge
    for name in ("detail", "other_detail"):
        assert new[name] == badge
    # Every list gets the filter's choices, with its own chosen; the one it is not in too.
    assert new["elsewhere"].startswith('<div id="filter-fields"')
    assert '<option value="cancel_order" selected>' in new["elsewhere"]
    assert '<option value="issue_refund">' in new["elsewhere"]
    assert '<option value="issue_refund" selected>' in new["tool"]
    for name in (*backs, "elsewhere"):
        assert new[name].endswith(badge)
    # One render per view: three lists with a row, the list without it, and one badge for
    # all the others.
    assert sorted(renders["row"]) == sorted(backs.values())
    assert len(renders["filters"]) == 4 and len(renders["count"]) == 5

    # Its decision: the decided row in the lists it is in, the panel on its own page.
    await runs.adecide(request.pk, rita, runs.Decision.approve(note="fine"))
    decided = await frames()
    badge = decided["count"]
    assert 'data-title-count="1"' in badge
    for name in backs:
        assert decided[name].startswith(
            f'<li id="request-{request.pk}" class="row row-decided is-approved" hx-swap-oob="true">'
        )
        assert decided[name].endswith(badge)
    assert decided["detail"].startswith(f'<section id="decision-{request.pk}"')
    assert "fine" in decided["detail"] and decided["detail"].endswith(badge)
    for name in ("elsewhere", "other_detail"):
        assert decided[name] == badge
    assert len(renders["row"]) == 6 and renders["panel"] == [request.pk]
    # Four lists (which of them a decided row belongs in is read with it), the panel, a badge.
    assert len(renders["count"]) == 5 + 6 and len(renders["filters"]) == 4
    for socket in sockets:
        assert await socket.receive_nothing(timeout=0.05)
        await socket.disconnect()


async def test_a_shared_render_runs_once_and_a_failed_one_is_not_kept() -> None:
    from approvals import consumers

    consumers._shared.clear()
    started: list[int] = []
    release = asyncio.Event()

    async def render() -> str:
        started.append(1)
        await release.wait()
        return "<p>row</p>"

    waiters = [asyncio.create_task(consumers.shared(("event", 1), render)) for _ in range(50)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # a socket that closes while waiting leaves the others their render
    release.set()
    results = await asyncio.gather(*waiters[1:])
    assert results == ["<p>row</p>"] * 49 and started == [1]
    assert await consumers.shared(("event", 1), render) == "<p>row</p>" and started == [1]
    assert await consumers.shared(("event", 2), render) == "<p>row</p>" and started == [1, 1]

    async def broken() -> str:
        started.append(2)
        raise RuntimeError("the database went away")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await consumers.shared(("event", 3), broken)
    assert started.count(2) == 2  # tried again, not served from a failure
    consumers._shared.clear()


def test_a_row_for_a_reviewer_who_asked_herself_asks_her_permissions_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one who asked is most often the conversation's owner: the push's render asks once
    whether that person is a reviewer (each ask is two queries of permissions) when she has
    an inbox open, and renders her own text, with Approve disabled; when she has none, it
    asks nothing and renders the row once."""
    from approvals import consumers

    rita = make_reviewer()
    request = make_request(run=make_run(owner=rita))
    asked: list[int] = []
    real = consumers.is_reviewer

    def counted(user: Any) -> bool:
        asked.append(user.pk)
        return real(user)

    monkeypatch.setattr(consumers, "is_reviewer", counted)
    view = InboxSocketForm({"show": "pending"})
    assert view.is_valid()

    def render(request_id: int, back: str, viewers: frozenset[int]) -> Any:
        return consumers._render_new_row.func(request_id, back, view, viewers)

    frame = render(request.pk, "/inbox/", frozenset({rita.pk, rita.pk + 1}))

    assert asked == [rita.pk]
    assert frame.owners == frozenset({rita.pk})
    assert "needs another reviewer" in frame.own and "needs another reviewer" not in frame.text

    asked.clear()
    unwatched = render(request.pk, "/inbox/", frozenset({rita.pk + 1}))
    assert asked == []
    assert unwatched.text == frame.text and unwatched.own == "" and not unwatched.owners


async def test_a_reviewer_who_asked_herself_gets_her_own_row_on_her_open_inbox() -> None:
    """rita started the conversation; bob did not: over their open inboxes, hers says it
    needs another reviewer (Approve disabled), his does not, from one shared render."""
    from approvals import consumers

    rita = await sync_to_async(make_reviewer)()
    bob = await sync_to_async(make_reviewer)(username="bob")
    hers, _ = await open_socket(rita)
    his, _ = await open_socket(bob)
    assert consumers._viewers[rita.pk] == 1 and consumers._viewers[bob.pk] == 1
    request = await sync_to_async(make_request)(run=await sync_to_async(make_run)(owner=rita))

    await created(request)
    her_row = await hers.receive_from(timeout=3)
    his_row = await his.receive_from(timeout=3)

    assert f'id="request-{request.pk}"' in her_row and f'id="request-{request.pk}"' in his_row
    assert "needs another reviewer" in her_row and "needs another reviewer" not in his_row
    await hers.disconnect()
    await his.disconnect()
    assert rita.pk not in consumers._viewers and bob.pk not in consumers._viewers
