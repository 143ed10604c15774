"""Access that outlives its grant: what ends an open socket.

A socket's user is checked when it connects, and again while it is open:

- A logout closes the sockets of the session that logged out (`user_logged_out`): each socket
  joins its user's group, `user.<id>`, and hears of it there. The user's other sessions (another
  browser) keep theirs.
- Before a push of data goes out, the socket re-reads from the database whether its session
  still holds (not logged out, not expired, the same user, still active, the password
  unchanged) and whether the user may still see what it shows (`still_allowed`); the check
  runs in a hop thread while the push renders, and the frame waits for it. The answer is
  kept for at most `RECHECK_SECONDS`, so a streamed reply costs one check a second, not one a
  word; a change made through Django's models (a user saved, permissions or groups changed)
  reaches the user's sockets at once and makes them check before their next push.

A socket closed so uses code 4403, which live.js shows as "Log in again".

While the channel layer is down (Redis stopped), a socket cannot join its groups or hear
them. It is then accepted and closed at once with `PAUSED_CODE` (4503) instead of failing its
handshake, and an open socket whose layer breaks is closed so too (`engine.layer` tells of
every break: a Redis that restarted empty forgot its groups). live.js shows "Live updates
paused", re-reads the page's fragments from the database every few seconds, and reconnects
with backoff until a socket joins again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from importlib import import_module
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.db import transaction

from agentsite.db.hops import db_hop
from engine import events, layer, permissions

if TYPE_CHECKING:
    from engine.permissions import User

logger = logging.getLogger(__name__)

CLOSE_CODE = 4403
# Closed because live updates cannot reach the socket now (the channel layer is down): the
# page polls and reconnects with backoff.
PAUSED_CODE = 4503

# How long a socket trusts its last check of its session and permission, in seconds.
RECHECK_SECONDS = 1.0


def current_user(session_key: str | None, user_id: int) -> User | None:
    """The user of the session `session_key`, read afresh from the database, if the session
    still holds and is still `user_id`'s (Django's own checks: expiry, the auth backend, an
    active user, the session hash of her password); otherwise None."""
    return current_users([(session_key, user_id)])[0]


DATABASE_SESSIONS = "django.contrib.sessions.backends.db"


def current_users(checks: list[tuple[str | None, int]]) -> list[User | None]:
    """`current_user` of each (session key, user id), read together: with the database's
    session store, the sessions in one query; and the sessions that carry the same login
    (user, backend, password hash) share one `auth.get_user` of it when it holds. A login
    that does not hold is asked for each of its sessions, as Django's request would be (it
    ends the session: `flush`)."""
    engine = import_module(settings.SESSION_ENGINE)
    stores = {key: engine.SessionStore(key) for key, _ in checks if key}
    if settings.SESSION_ENGINE == DATABASE_SESSIONS and stores:
        from django.contrib.sessions.models import Session
        from django.utils import timezone

        found = dict(
            Session.objects.filter(
                session_key__in=list(stores), expire_date__gt=timezone.now()
            ).values_list("session_key", "session_data")
        )
        for session_key, session in stores.items():
            # What `SessionStore.load` would have read: the data, or nothing (no such
            # session, expired); a session that does not decode reads as empty there too.
            data = found.get(session_key)
            session._session_cache = session.decode(data) if data is not None else {}
    logins: dict[tuple[Any, ...], User] = {}
    users: list[User | None] = []
    for key, user_id in checks:
        if not key:
            users.append(None)
            continue
        store = stores[key]
        login = tuple(
            store.get(name)
            for name in (auth.SESSION_KEY, auth.BACKEND_SESSION_KEY, auth.HASH_SESSION_KEY)
        )
        user = logins.get(login)
        if user is None:
            found_user = auth.get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
            if found_user.is_authenticated:
                user = logins[login] = found_user
        users.append(user if user is not None and user.pk == user_id else None)
    return users


def recheck_all(consumers: list[GuardedConsumer]) -> list[bool]:
    """Whether each consumer's session still holds and its user may still see what it shows
    (`GuardedConsumer.still_allowed`), read together (`current_users`). In a hop thread."""
    users = current_users(
        [(consumer._session_key, consumer._guarded_user_id or 0) for consumer in consumers]
    )
    permissions.read_permissions(list({user.pk: user for user in users if user}.values()))
    return [
        user is not None and consumer.still_allowed(user)
        for consumer, user in zip(consumers, users, strict=True)
    ]


class _Rechecks:
    """The checks a loop's sockets ask for, run together: the first at once, in a hop, and
    those asked while one runs together in the next (a push reaches a process's sockets
    over a few milliseconds: 25 checks become two or three hops and a few queries instead of
    25 hops of four queries)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[GuardedConsumer, asyncio.Future[bool]]] = []
        self.running = False

    def ask(self, consumer: GuardedConsumer) -> asyncio.Future[bool]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        self.waiting.append((consumer, answer))
        if not self.running:
            self.running = True
            _checking_tasks.add(task := loop.create_task(self._run()))
            task.add_done_callback(_checking_tasks.discard)
        return answer

    async def _run(self) -> None:
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                try:
                    allowed = await db_hop(recheck_all)([consumer for consumer, _ in batch])
                except Exception as error:
                    for _, answer in batch:
                        if not answer.done():
                            answer.set_exception(error)
                    continue
                for (_, answer), ok in zip(batch, allowed, strict=True):
                    if not answer.done():
                        answer.set_result(ok)
        finally:
            self.running = False


_rechecks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Rechecks] = (
    weakref.WeakKeyDictionary()
)
_checking_tasks: set[asyncio.Task[None]] = set()


class LayerDown(Exception):
    """The channel layer failed a call that a socket needs (joining a group)."""


class GuardedConsumer(AsyncWebsocketConsumer):
    """A consumer whose access ends when its grant does. A subclass joins its groups with
    `join()` and calls `guard()` in `connect` before accepting, `leave()` and `unguard()` in
    `disconnect`, and says in `still_allowed` what its user must still be allowed (run in the
    database's thread, on a freshly read user)."""

    _guarded_user_id: int | None = None
    _session_key: str | None = None
    _checked_at: float | None = None
    _ended = False
    _accepted = False
    _layer_lost = False
    _loop: asyncio.AbstractEventLoop | None = None
    _checking: asyncio.Future[bool] | None = None  # the check of the message in hand

    # --- the channel layer, which may be down -------------------------------------------

    async def join(self, group: str) -> None:
        try:
            await self.channel_layer.group_add(group, self.channel_name)
        except Exception as error:
            raise LayerDown(group) from error

    async def leave(self, group: str) -> None:
        try:
            await self.channel_layer.group_discard(group, self.channel_name)
        except Exception:
            logger.debug("Could not leave %s (the channel layer is down)", group, exc_info=True)

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        try:
            await super().websocket_connect(message)
        except LayerDown:
            logger.info("A socket's live updates are paused: the channel layer is down.")
            await self.pause()
            return
        if self._layer_lost:
            await self.pause()  # its channel broke while it connected

    async def accept(self, subprotocol: str | None = None, headers: Any = None) -> None:
        self._accepted = True
        self._loop = asyncio.get_running_loop()
        await super().accept(subprotocol, headers)
        if not self._ended:
            _open.add(self)

    async def pause(self) -> None:
        """Tell the page that live updates are paused: accepted (the user was checked before
        any group was joined) and closed with `PAUSED_CODE`, so the page knows to poll."""
        if self._ended:
            return
        self._ended = True
        _open.discard(self)
        if not self._accepted:
            await self.accept()
        await self.close(code=PAUSED_CODE, reason="live updates paused")

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        _open.discard(self)
        await super().websocket_disconnect(message)

    # channels sets `channel_receive` (the layer's receive of this socket's channel) when the
    # consumer starts; what it then reads is `_receive_hint`, which turns a broken layer into
    # one `layer.lost` message instead of an error that would end the consumer with a 1011.
    @property
    def channel_receive(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        return self._receive_hint

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._layer_receive = receive

    async def _receive_hint(self) -> dict[str, Any]:
        if not self._layer_lost:
            try:
                return await self._layer_receive()
            except Exception:
                logger.debug("A socket's channel broke", exc_info=True)
                self._layer_lost = True
                return {"type": "layer.lost"}
        await asyncio.Event().wait()  # nothing more comes: the socket is closing
        raise AssertionError("unreachable")

    async def layer_lost(self, message: dict[str, Any]) -> None:
        if self._accepted:
            await self.pause()
        # else `websocket_connect` pauses once the user has been checked

    def still_allowed(self, user: User) -> bool:
        raise NotImplementedError

    async def guard(self) -> None:
        user = self.scope["user"]
        session = self.scope.get("session")
        self._guarded_user_id = user.pk
        self._session_key = session.session_key if session is not None else None
        self._checked_at = time.monotonic()  # checked by `connect` a moment ago
        await self.join(events.user_group(user.pk))

    async def unguard(self) -> None:
        if self._guarded_user_id is not None:
            await self.leave(events.user_group(self._guarded_user_id))

    def _recheck(self) -> asyncio.Future[bool]:
        """This socket's check, with the loop's other sockets' (`_Rechecks`)."""
        loop = asyncio.get_running_loop()
        rechecks = _rechecks.get(loop)
        if rechecks is None:
            rechecks = _rechecks[loop] = _Rechecks()
        return rechecks.ask(self)

    async def _end(self) -> None:
        self._ended = True
        await self.close(code=CLOSE_CODE)

    async def dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind.startswith("websocket.") or kind == "layer.lost" or self._guarded_user_id is None:
            await super().dispatch(message)
            return
        if self._ended:
            return  # closed: nothing more goes out
        if kind not in _NOTICES:
            now = time.monotonic()
            if self._checked_at is None or now - self._checked_at >= RECHECK_SECONDS:
                await self._dispatch_checked(message, now)
                return
        await super().dispatch(message)

    async def _dispatch_checked(self, message: dict[str, Any], now: float) -> None:
        """Handle `message` while the check runs, in a hop thread: the handler renders
        meanwhile (in the database's thread, one render an event for a process's inbox
        sockets), and whatever it sends waits for the check (`send`). Neither waits behind
        the other, nor behind the checks of the process's other sockets."""
        check = self._checking = self._recheck()
        try:
            await super().dispatch(message)
        finally:
            self._checking = None
            allowed = await check
        if allowed:
            self._checked_at = now
        elif not self._ended:
            await self._end()

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        """A frame goes out only once the check running for this message passed: a socket
        whose check failed sends nothing more (its dispatch then closes it)."""
        if self._checking is not None and not await asyncio.shield(self._checking):
            return
        await super().send(text_data, bytes_data, close)

    # --- what the user's group hears (handlers are named after the event type) -----------

    async def user_logged_out(self, message: dict[str, Any]) -> None:
        event = events.UserLoggedOut.model_validate(message["event"])
        if event.session_key in (None, self._session_key):
            await self._end()

    async def user_changed(self, message: dict[str, Any]) -> None:
        self._checked_at = None  # check again before the next push


_NOTICES = frozenset({"user.logged_out", "user.changed"})

# The accepted sockets of this process, paused together when the channel layer breaks.
_open: weakref.WeakSet[GuardedConsumer] = weakref.WeakSet()


def pause_open_sockets() -> None:
    """The channel layer broke (`engine.layer.on_break`): Redis may have restarted empty and
    forgotten every group, so each open socket closes with `PAUSED_CODE`; its page re-reads
    the database and reconnects, joining its groups again."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    for consumer in list(_open):
        _open.discard(consumer)
        loop = consumer._loop
        if loop is None or loop.is_closed():
            continue
        if loop is running:
            task = asyncio.ensure_future(consumer.pause())
            _pausing.add(task)
            task.add_done_callback(_pausing.discard)
        else:
            asyncio.run_coroutine_threadsafe(consumer.pause(), loop)


_pausing: set[asyncio.Task[None]] = set()


# --- the signals that tell a user's sockets (connected in `engine.apps`) -------------------


def _tell(*notices: events.Event) -> None:
    events.publish_threadsafe(notices)


def _tell_after_commit(*notices: events.Event) -> None:
    """A change is told once it is committed: a socket that checked before would keep the
    old answer for up to `RECHECK_SECONDS`."""
    transaction.on_commit(lambda: _tell(*notices))


def on_logout(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    if user is None or user.pk is None:
        return
    session_key = getattr(getattr(request, "session", None), "session_key", None)
    _tell(events.UserLoggedOut(user_id=user.pk, session_key=session_key))


def on_user_saved(
    sender: Any, instance: Any, created: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    if created or (update_fields is not None and set(update_fields) <= {"last_login"}):
        return  # a new user has no socket; a login changes nothing her sockets depend on
    _tell_after_commit(events.UserChanged(user_id=instance.pk))


def on_relations_changed(
    sender: Any, instance: Any, action: str, model: Any, pk_set: Any = None, **kwargs: Any
) -> None:
    """A user's groups or permissions changed, from either side, or a group's permissions.

    A `clear()` is told from its `pre_clear`: afterwards the rows that name its users are
    gone (`group.user_set.clear()` sends no user ids)."""
    if action not in ("post_add", "post_remove", "pre_clear"):
        return
    from django.contrib.auth.models import Group, Permission

    user_model = auth.get_user_model()
    if isinstance(instance, user_model):
        users = [instance.pk]
    elif model is user_model:
        users = list(pk_set) if pk_set else list(instance.user_set.values_list("pk", flat=True))
    elif isinstance(instance, Group):
        users = list(instance.user_set.values_list("pk", flat=True))
    elif isinstance(instance, Permission) and model is Group:
        groups = Group.objects.filter(pk__in=pk_set) if pk_set else instance.group_set.all()
        users = list(user_model.objects.filter(groups__in=groups).values_list("pk", flat=True))
    else:
        return
    _tell_users_after_commit(users)


def on_group_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Deleting a group removes its members' rows without an `m2m_changed`: told from
    `pre_delete`, while the members are still known."""
    _tell_users_after_commit(list(instance.user_set.values_list("pk", flat=True)))


def _tell_users_after_commit(users: list[int]) -> None:
    if users:
        _tell_after_commit(*(events.UserChanged(user_id=pk) for pk in set(users)))


def connect_signals() -> None:
    from django.contrib.auth.models import Group
    from django.contrib.auth.signals import user_logged_out
    from django.db.models.signals import m2m_changed, post_save, pre_delete

    user_model = auth.get_user_model()
    layer.on_break(pause_open_sockets)
    user_logged_out.connect(on_logout, dispatch_uid="engine.access.on_logout")
    post_save.connect(on_user_saved, sender=user_model, dispatch_uid="engine.access.saved")
    pre_delete.connect(on_group_deleted, sender=Group, dispatch_uid="engine.access.group_deleted")
    relations = [Group.permissions.through]
    for name in ("groups", "user_permissions"):
        field = getattr(user_model, name, None)
        if field is not None:
            relations.append(field.through)
    for through in relations:
        m2m_changed.connect(
            on_relations_changed, sender=through, dispatch_uid=f"engine.access.{through.__name__}"
        )
