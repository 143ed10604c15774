"""The inbox socket: pushes server-rendered fragments to reviewers' open inbox pages.

Thin on purpose: check the user, join the inbox group, turn each event into the same
fragments the pages render. A push is a hint; every fragment is rendered from the database,
not from the event, and a page re-reads its list whenever its socket (re)connects.

What a socket shows comes from its query string (validated with `InboxSocketForm`):
`?show=pending&agent=..&tool=..` (the pending list; with each new request, matching or not,
the filter's choices, which it may add to), `?show=request&request=<pk>` (one request's
decision panel), anything else only the pending count.

One event reaches every open inbox of this process at once, and most of them show the same
thing. So a socket's frame is rendered once per event and per what it depends on besides the
event (a pending list's filter; a request page's request; nothing for the count alone), and
every socket of that view sends the same text (see `shared`). What differs by reviewer is only
whether she started the request's conversation (separation of duties: "needs another
reviewer", Approve disabled): a frame holds both texts, rendered once, and each socket sends
the one for its user (`Frame.for_user`). The second text is rendered only when she has an
inbox open in this process (`_viewers`): most requests are asked by end users, who have none,
and then neither her permissions are read nor a second row rendered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from django.http import QueryDict
from django.template.loader import render_to_string

from approvals import views
from approvals.forms import InboxSocketForm
from approvals.models import ApprovalRequest
from engine import events, runs
from engine.access import GuardedConsumer
from engine.permissions import is_reviewer

if TYPE_CHECKING:
    from engine.permissions import User

# --- fragments rendered once per event, shared by this process's sockets -------------------

# How long a finished render is kept for sockets whose handler starts late. Every socket in
# the group receives the event at the same moment, so this only has to cover the spread of
# their handlers; a later event (its own key) always renders afresh.
SHARE_SECONDS = 2.0
SHARE_MAX = 1024

_Key = tuple[Hashable, ...]

# The users with an inbox socket open in this process (how many each): who a frame's second
# text could be for. Counted from before a socket joins the group until it leaves it.
_viewers: Counter[int] = Counter()


@dataclass(frozen=True)
class Frame:
    """What a socket sends for an event: `text`, or `own` to the reviewers in `owners` (who
    started the request's conversation or asked for its run, and so may not approve it)."""

    text: str
    own: str = ""
    owners: frozenset[int] = frozenset()

    def for_user(self, user: Any) -> str:
        pk = getattr(user, "pk", None)
        return self.own if pk is not None and pk in self.owners else self.text


class _Shared:
    """One render for one key: its task, and when it finished (None while it runs)."""

    __slots__ = ("done_at", "key", "loop", "task")

    def __init__(self, key: _Key, render: Coroutine[Any, Any, Frame]) -> None:
        self.key = key
        self.loop = asyncio.get_running_loop()
        self.task = self.loop.create_task(render)
        self.done_at: float | None = None
        self.task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Frame]) -> None:
        if task.cancelled() or task.exception() is not None:
            if _shared.get(self.key) is self:
                _shared.pop(self.key, None)
        else:
            self.done_at = self.loop.time()


_shared: dict[_Key, _Shared] = {}


def _forget_stale(now: float) -> None:
    for key, entry in list(_shared.items()):
        if entry.loop.is_closed() or (
            entry.done_at is not None and now - entry.done_at > SHARE_SECONDS
        ):
            _shared.pop(key, None)
    if len(_shared) >= SHARE_MAX:  # a burst of events: drop the oldest finished renders
        for key in [key for key, entry in _shared.items() if entry.done_at is not None]:
            _shared.pop(key, None)
            if len(_shared) < SHARE_MAX // 2:
                break


async def shared(key: _Key, render: Callable[[], Coroutine[Any, Any, Frame]]) -> Frame:
    """`render()`'s text for `key`, rendered at most once while it is fresh: sockets asking
    while it renders await the same render, sockets asking shortly after get its text.

    The render runs in its own task, so a socket that closes while waiting cancels only its
    own wait. A render that fails is not kept: each of its waiters gets the error, and the
    next socket renders again.
    """
    loop = asyncio.get_running_loop()
    entry = _shared.get(key)
    if (
        entry is None
        or entry.loop is not loop
        or (entry.done_at is not None and loop.time() - entry.done_at > SHARE_SECONDS)
    ):
        _forget_stale(loop.time())
        entry = _shared[key] = _Shared(key, render())
    return await asyncio.shield(entry.task)


def event_key(event: events.Event) -> _Key:
    """What tells one event from another: its whole payload. Two sockets handling the same
    published event share its renders; any other event, even about the same request, does not.
    """
    return (event.type, event.model_dump_json())


# --- the renders, in the database's thread ------------------------------------------------
# Each returns a socket's whole frame, the pending badge last: one trip to the database's
# thread per event and per view.


def _load(pk: int) -> ApprovalRequest | None:
    return views.with_people(ApprovalRequest.objects.all()).filter(pk=pk).first()


def _badge() -> str:
    context = {"pending_count": views.pending_count(), "oob": True}
    return render_to_string("approvals/_badge.html", context)


def _for_everyone(
    approval: ApprovalRequest,
    render: Callable[[Any], str],
    after: str,
    viewers: frozenset[int],
) -> Frame:
    """`render(viewer)` as reviewers see it, and, when the one who started its conversation
    (or asked for its run) is a reviewer with an inbox open here (one of `viewers`), as she
    sees it: "needs another reviewer"."""
    text = render(None) + after
    run = approval.run
    # Most often the one who asked is the conversation's owner: one person, asked once
    # whether she is a reviewer (two queries of permissions), and only when she is watching.
    people = {
        user.pk: user
        for user in (run.conversation.owner, run.requested_by)
        if user is not None and user.pk in viewers
    }
    starters = [
        user
        for user in people.values()
        if runs.needs_another_reviewer(approval, user) and is_reviewer(user)
    ]
    if not starters:
        return Frame(text)
    owners = frozenset(user.pk for user in starters)
    return Frame(text, own=render(starters[0]) + after, owners=owners)


@database_sync_to_async
def _render_badge() -> Frame:
    return Frame(_badge())


@database_sync_to_async
def _render_new_row(
    request_id: int, back: str, view: InboxSocketForm, viewers: frozenset[int]
) -> Frame:
    approval = views.with_people(views.open_requests()).filter(pk=request_id).first()
    if approval is None:
        return Frame(_badge())

    def row(viewer: Any) -> str:
        html = views.render_row(approval, back=back, user=viewer)
        return f'<div hx-swap-oob="afterbegin:#pending-rows">{html}</div>'

    return _for_everyone(approval, row, views.render_filters(view) + _badge(), viewers)


@database_sync_to_async
def _render_filters(view: InboxSocketForm) -> Frame:
    """A list that does not show the new request still offers its agent and tool."""
    return Frame(views.render_filters(view) + _badge())


@database_sync_to_async
def _render_decided_row(
    request_id: int,
    matches: Callable[[Any], bool],
    back: str,
    viewers: frozenset[int],
) -> Frame:
    approval = _load(request_id)
    if approval is None or not matches(approval):
        return Frame(_badge())
    return _for_everyone(
        approval,
        lambda viewer: views.render_row(approval, oob="true", back=back, user=viewer),
        _badge(),
        viewers,
    )


def _removed_row(request_id: int) -> str:
    """A withdrawn request leaves the pending list: nobody is to decide it any more."""
    return f'<li id="request-{request_id}" hx-swap-oob="delete"></li>'


@database_sync_to_async
def _render_panel(request_id: int, viewers: frozenset[int]) -> Frame:
    approval = _load(request_id)
    if approval is None:
        return Frame(_badge())
    context = {**views.panel_context(approval), "oob": True}
    # The transcript's line of the call stops saying "waiting for you"; after an edit, the
    # call shows the arguments it ran with.
    state = render_to_string(
        "approvals/request_detail.html#call-state", {**context, "state_oob": True}
    ) + render_to_string("approvals/request_detail.html#edited", context)

    def panel(viewer: Any) -> str:
        return render_to_string(
            "approvals/request_detail.html#decision-panel", {**context, "user": viewer}
        )

    return _for_everyone(approval, panel, state + _badge(), viewers)


class InboxConsumer(GuardedConsumer):
    async def connect(self) -> None:
        query = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        self.view = InboxSocketForm(query)
        if not await database_sync_to_async(is_reviewer)(self.scope.get("user")):
            await self.close()  # before accept: the handshake is refused
            return
        if not self.view.is_valid():
            await self.close()
            return
        self.show = self.view.cleaned_data.get("show") or "count"
        self.request_id = self.view.cleaned_data.get("request")
        # What this socket's rows depend on besides the event: its filter, which decides
        # the rows it gets and the link back to its list in each of them.
        self.filter = tuple(
            self.view.cleaned_data.get(field) or "" for field in InboxSocketForm.COLUMNS
        )
        self.back = views.inbox_url(views.filter_query(self.view))
        self.viewer = self.scope["user"].pk
        _viewers[self.viewer] += 1
        await self.join(events.INBOX_GROUP)
        await self.guard()
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.leave(events.INBOX_GROUP)
        await self.unguard()
        viewer = getattr(self, "viewer", None)
        if viewer is not None:
            del self.viewer  # counted once, however often it is told it disconnected
            _viewers[viewer] -= 1
            if _viewers[viewer] <= 0:
                del _viewers[viewer]

    def still_allowed(self, user: User) -> bool:
        return is_reviewer(user)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Nothing is decided over the socket: decisions are CSRF-protected POSTs."""

    # --- events (handlers are named after the event type) --------------------------------

    async def approval_created(self, message: dict[str, Any]) -> None:
        event = events.ApprovalCreated.model_validate(message["event"])
        await self._send(await self._created(event))

    async def approval_decided(self, message: dict[str, Any]) -> None:
        event = events.ApprovalDecided.model_validate(message["event"])
        await self._send(await self._decided(event))

    async def approval_withdrawn(self, message: dict[str, Any]) -> None:
        event = events.ApprovalWithdrawn.model_validate(message["event"])
        if self.show == "pending":
            key = event_key(event)
            badge = await shared((*key, "badge"), _render_badge)
            await self._send(_removed_row(event.request_id) + badge.text)
        else:
            await self._send(await self._decided(event))

    async def _send(self, frame: Frame | str) -> None:
        html = frame if isinstance(frame, str) else frame.for_user(self.scope.get("user"))
        if html.strip():
            await self.send(text_data=html)

    # --- this socket's frame, rendered once per event and view (see `shared`) -------------

    async def _created(self, event: events.ApprovalCreated) -> Frame:
        # A pending list gets the filter's choices too: the request may bring new ones.
        key = event_key(event)
        view = self.view
        if self.show == "pending" and view.matches(event):
            back = self.back
            viewers = frozenset(_viewers)
            return await shared(
                (*key, "pending", self.filter),
                lambda: _render_new_row(event.request_id, back, view, viewers),
            )
        if self.show == "pending":
            return await shared((*key, "filters", self.filter), lambda: _render_filters(view))
        return await shared((*key, "badge"), _render_badge)

    async def _decided(self, event: events.ApprovalDecided) -> Frame:
        key = event_key(event)
        if self.show == "pending":
            matches, back, viewers = self.view.matches, self.back, frozenset(_viewers)
            return await shared(
                (*key, "pending", self.filter),
                lambda: _render_decided_row(event.request_id, matches, back, viewers),
            )
        if self.show == "request" and event.request_id == self.request_id:
            viewers = frozenset(_viewers)
            return await shared((*key, "panel"), lambda: _render_panel(event.request_id, viewers))
        return await shared((*key, "badge"), _render_badge)
