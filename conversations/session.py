"""The SDK's `Session` protocol on Django models.

`DjangoSession` answers exactly as the SDK's `SQLiteSession` does (a differential test holds
it to that), but stores items in `SessionItem` rows so that conversations live in the site's
own database, show up in admin, and can be owned by a user.

Each operation is one hop to a worker thread that does all its queries there, because a hop
costs far more than a query (SDK_NOTES: about 110 µs). Hops are not thread-sensitive, so
several conversations, or several writers to one conversation, really run at once; the
database keeps them apart.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

from agents.extensions.memory.encrypt_session import EncryptedSession, _is_encrypted_envelope
from agents.items import TResponseInputItem
from agents.memory.session import SessionABC, _await_mutation, _CompactionSnapshot
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from cryptography.fernet import InvalidToken
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from agentsite.db import faithful
from agentsite.db.hops import db_thread
from conversations.models import Conversation, SessionItem
from conversations.sql import statements

logger = logging.getLogger(__name__)

# Fernet needs a number; a century is "no practical expiry" for a chat history.
NO_EXPIRY_SECONDS = 100 * 365 * 24 * 3600


class DjangoSession(SessionABC):
    """A conversation's history, for `Runner.run(..., session=DjangoSession(id))`.

    The `Conversation` row is created on the first `add_items`; `owner` and `agent_name` are
    used only then. `clear_session` empties the history but keeps the conversation itself
    (its owner, title and runs), unlike `SQLiteSession`, which forgets the session row.
    """

    def __init__(
        self,
        session_id: str,
        *,
        owner: Any = None,
        agent_name: str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._owner = owner
        self._agent_name = agent_name
        # A cache only: every write re-checks it, so a deleted conversation is recreated.
        self._conversation_pk: int | None = None

    @classmethod
    def for_conversation(
        cls,
        conversation: Conversation,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> DjangoSession:
        session = cls(conversation.session_id, session_settings=session_settings)
        session._conversation_pk = conversation.pk
        return session

    def __repr__(self) -> str:
        return f"DjangoSession({self.session_id!r})"

    # --- the Session protocol ------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        effective = resolve_session_limit(limit, self.session_settings)
        if effective == 0:
            return []
        return await db_thread(self._get_items_sync)(effective)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        # Copied before the hop, so a caller that mutates its list later changes nothing.
        batch = list(items)
        await _await_mutation(db_thread(self._add_items_sync)(batch))

    async def pop_item(self) -> TResponseInputItem | None:
        return await self._pop_item_with_validation()

    async def clear_session(self) -> None:
        await _await_mutation(db_thread(self._clear_sync)())

    async def rewrite_items(
        self,
        rewrite: Callable[[TResponseInputItem], TResponseInputItem | None],
        lookback: int,
    ) -> int:
        """Change items in place, in one transaction: each of the newest `lookback` items is
        given to `rewrite`, and those it returns a new item for are replaced by that item,
        keeping their place (the session protocol has no update; this is agentsite's own).
        Returns how many changed; a `rewrite` that raises changes none."""
        return await _await_mutation(db_thread(self._rewrite_sync)(rewrite, lookback))

    async def _pop_item_with_validation(
        self, validate: Callable[[TResponseInputItem], None] | None = None
    ) -> TResponseInputItem | None:
        """Pop the newest item; if `validate` raises, nothing is removed."""
        return await _await_mutation(db_thread(self._pop_sync)(validate))

    # --- the synchronous halves, each run whole in one worker thread -----------------------

    def _get_items_sync(self, limit: int | None) -> list[TResponseInputItem]:
        # The hottest path of a turn, so its one query is plain SQL (conversations/sql.py
        # says why).
        if limit is None or limit < 0:
            # SQLite reads a negative LIMIT as "no limit"; SQLiteSession inherits that.
            rows = _fetch(statements().all_items, [self.session_id])
        else:
            rows = _fetch(statements().last_items, [self.session_id, limit])
            rows.reverse()
        return [
            faithful.decode(json.loads(value) if isinstance(value, (str, bytes)) else value)
            for (value,) in rows
        ]

    def _add_items_sync(self, items: list[TResponseInputItem]) -> None:
        sql = statements()
        lean = _lean_transaction()
        if lean is not None and self._conversation_pk is not None:
            # SQLite, the conversation known: the two statements straight on the driver.
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            with lean as cursor:
                touched = cursor.execute(
                    sql.touch_by_pk, [now, self._conversation_pk, self.session_id]
                )
                if touched.rowcount == 1:
                    _insert_items(cursor, self._conversation_pk, items, now)
                    return
            # Deleted meanwhile (nothing was written): the general path recreates it.
        with transaction.atomic(), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            conversation_pk = self._lock_conversation(cursor, now, create=True)
            assert conversation_pk is not None
            _insert_items(cursor, conversation_pk, items, now)

    def _pop_sync(
        self, validate: Callable[[TResponseInputItem], None] | None
    ) -> TResponseInputItem | None:
        pop = statements().pop_item
        lean = _lean_transaction()
        if lean is not None:
            # SQLite: its IMMEDIATE transaction serializes every writer, as SQLiteSession's
            # lock does, so the one statement is the whole pop.
            with lean as cursor:
                return _validated(cursor.execute(pop, [self.session_id]).fetchone(), validate)
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor != "sqlite":
                # Pops and appends of one conversation queue on its row lock.
                now = connection.ops.adapt_datetimefield_value(timezone.now())
                if self._lock_conversation(cursor, now, create=False) is None:
                    return None
            # Deleted and read in one statement; a failed `validate` rolls the deletion back
            # (the exception leaves the transaction).
            cursor.execute(pop, [self.session_id])
            return _validated(cursor.fetchone(), validate)

    def _rewrite_sync(
        self, rewrite: Callable[[TResponseInputItem], TResponseInputItem | None], lookback: int
    ) -> int:
        with transaction.atomic(), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            conversation_pk = self._lock_conversation(cursor, now, create=False)
            if conversation_pk is None:
                return 0
            rows = SessionItem.objects.filter(conversation_id=conversation_pk).order_by("-id")
            changed = [
                (pk, new)
                for pk, payload in rows.values_list("pk", "payload")[:lookback]
                if (new := rewrite(payload)) is not None
            ]
            for pk, new in changed:
                SessionItem.objects.filter(pk=pk).update(payload=new)
            return len(changed)

    def _clear_sync(self) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            conversation_pk = self._lock_conversation(cursor, now, create=False)
            if conversation_pk is not None:
                SessionItem.objects.filter(conversation_id=conversation_pk).delete()

    # --- compaction: the SDK's hook for OpenAIResponsesCompactionSession --------------------

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The SDK's hook for atomic compaction, answered as its `SQLiteSession` answers it:
        the newest `limit` items, whether nothing older exists, and `replace_suffix(start,
        output)`, which replaces the items from `start` on with `output` in one transaction,
        or changes nothing and returns False when the newest rows are no longer those read
        (an append, a pop or a rewrite came in between). Without it the SDK clears the
        history and writes it again, losing whatever was written meanwhile.

        A row that cannot be decoded is never in the snapshot, so never replaced: the snapshot
        starts after the newest such row, and is then incomplete (the SDK compacts that suffix
        in input mode only, from a user message on). `prune_prefix` (the SDK's
        `EncryptedSession` passes "expired") deletes the oldest rows in the same transaction
        for as long as it holds for them; an unreadable row stops it too.
        """
        if type(self) is not DjangoSession or limit < 1:
            # A subclass that changes items on their way must bring its own, as in the SDK.
            return None
        rows, items, complete = await db_thread(self._compaction_read_sync)(limit)

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            expected = rows[start:]
            if not expected:
                return False
            replace = db_thread(self._compaction_replace_sync)
            return await _await_mutation(replace(expected, list(output), limit, prune_prefix))

        return _CompactionSnapshot(items, complete, replace_suffix)

    def _compaction_read_sync(
        self, limit: int
    ) -> tuple[list[tuple[Any, ...]], list[TResponseInputItem], bool]:
        # One row more than asked tells whether anything older exists.
        fetched = self._session_rows(statements().compaction_rows, limit + 1)
        complete = len(fetched) <= limit
        rows: list[tuple[Any, ...]] = []
        items: list[TResponseInputItem] = []
        unreadable = []
        for row in reversed(fetched[:limit]):
            try:
                item = _decoded(row[1])
            except (ValueError, TypeError):
                # It and everything older stay out of the replacement's reach.
                unreadable.append(row[0])
                rows.clear()
                items.clear()
                complete = False
                continue
            rows.append(row)
            items.append(item)
        if unreadable:
            logger.warning(
                "Session %s: compaction leaves alone %d row(s) it cannot read (ids %s) and "
                "everything older.",
                self.session_id,
                len(unreadable),
                ", ".join(map(str, unreadable)),
            )
        return rows, items, complete

    def _compaction_replace_sync(
        self,
        expected: list[tuple[Any, ...]],
        output: list[TResponseInputItem],
        batch: int,
        prune_prefix: Callable[[TResponseInputItem], bool] | None,
    ) -> bool:
        sql = statements()
        with transaction.atomic(), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            # Under the conversation's lock no append, pop or rewrite can come in between.
            conversation_pk = self._lock_conversation(cursor, now, create=False)
            current = (
                self._session_rows(sql.compaction_rows, len(expected), cursor=cursor)
                if conversation_pk is not None
                else []
            )
            if current[::-1] != expected:
                transaction.set_rollback(True)  # not even the touch of `updated`
                return False
            assert conversation_pk is not None
            first = expected[0][0]
            if prune_prefix is not None:
                self._prune_prefix_sync(cursor, first, batch, prune_prefix)
            self._session_rows(sql.compaction_delete_from, first, cursor=cursor)
            _insert_items(cursor, conversation_pk, output, now)
            return True

    def _prune_prefix_sync(
        self, cursor: Any, before: int, batch: int, prune: Callable[[TResponseInputItem], bool]
    ) -> None:
        """Delete the oldest rows (older than `before`) for as long as `prune` holds for them,
        `batch` at a time, as the SDK's stores do; a row that cannot be read stops it."""
        sql = statements()
        while True:
            prefix = self._session_rows(sql.compaction_prefix, before, batch, cursor=cursor)
            last = None
            for row_id, value in prefix:
                try:
                    item = _decoded(value)
                except (ValueError, TypeError):
                    break
                if not prune(item):
                    break
                last = row_id
            if last is None:
                return
            self._session_rows(sql.compaction_delete_through, last, cursor=cursor)
            if last != prefix[-1][0] or len(prefix) < batch:
                return

    def _session_rows(self, sql: str, *params: Any, cursor: Any = None) -> list[tuple[Any, ...]]:
        """Run one of the statements on this session's rows (those `of_session` picks, in
        conversations/sql.py), the parameters that pick them first; the rows it returns (none
        for a DELETE). Without `cursor`, a read on its own."""
        picked = [self.session_id, *params]
        if cursor is None:
            return [tuple(row) for row in _fetch(sql, picked)]
        cursor.execute(sql, picked)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

    def _lock_conversation(self, cursor: Any, now: Any, *, create: bool) -> int | None:
        """Lock this conversation's row for the rest of the transaction and return its pk.

        Every writer of one conversation takes this lock first (an UPDATE of its `updated`),
        so concurrent `add_items` batches are serialized: each batch gets contiguous, ordered
        primary keys. (SQLite's IMMEDIATE transactions already serialize all writers; on
        PostgreSQL the row lock of this UPDATE does it per conversation.)
        """
        if self._conversation_pk is not None:
            # The cached pk, checked: a conversation deleted meanwhile is looked up again.
            cursor.execute(statements().touch_by_pk, [now, self._conversation_pk, self.session_id])
            if cursor.rowcount == 1:
                return self._conversation_pk
        cursor.execute(statements().touch_by_session, [now, self.session_id])
        row = cursor.fetchone()
        if row is None and create:
            conversation, _ = Conversation.objects.get_or_create(
                session_id=self.session_id,
                defaults={"owner": self._owner, "agent_name": self._agent_name or ""},
            )
            # Created now, or by a concurrent writer a moment ago: lock it all the same.
            cursor.execute(statements().touch_by_session, [now, self.session_id])
            row = cursor.fetchone()
            assert row is not None and row[0] == conversation.pk
        self._conversation_pk = row[0] if row is not None else None
        return self._conversation_pk


def _insert_items(
    cursor: Any, conversation_pk: int, items: list[TResponseInputItem], now: Any
) -> None:
    """The one way items become rows (`add_items`, compaction): one executemany, as
    SQLiteSession does (bulk_create's per-field preparation cost more than the inserts),
    of faithful JSON text, a batch holding NaN refused whole before anything is written."""
    cursor.executemany(
        statements().insert_item, [(conversation_pk, text, now) for text in _texts(items)]
    )


def _decoded(value: Any) -> TResponseInputItem:
    """A payload read by plain SQL (JSON text, or already parsed) as the item it holds;
    ValueError or TypeError when it cannot be read."""
    return cast(
        TResponseInputItem,
        faithful.decode(json.loads(value) if isinstance(value, (str, bytes)) else value),
    )


def _texts(items: list[TResponseInputItem]) -> list[str]:
    """Each item as the JSON text to store, any text in it kept (`agentsite.db.faithful`);
    NaN or Infinity, which JSON cannot hold, refuse the whole batch before anything is
    written, naming the item."""
    texts = []
    for n, item in enumerate(items, start=1):
        try:
            texts.append(faithful.encode_text(item))
        except ValueError as exc:
            raise ValueError(
                f"Session item {n} of {len(items)} cannot be stored: it holds NaN or Infinity, "
                f"which JSON cannot hold ({exc})."
            ) from exc
    return texts


def _validated(
    row: tuple[Any, ...] | None, validate: Callable[[TResponseInputItem], None] | None
) -> TResponseInputItem | None:
    """A popped row's item; `validate` raising undoes the pop (it leaves the transaction)."""
    if row is None:
        return None
    (value,) = row
    payload = faithful.decode(json.loads(value) if isinstance(value, (str, bytes)) else value)
    if validate is not None:
        validate(payload)
    return payload


def _lean_transaction() -> AbstractContextManager[Any] | None:
    """agentsite's SQLite backend's lean write transaction (agentsite/db/sqlite/base.py), where
    it can be used: not inside a caller's `atomic()`. None elsewhere (PostgreSQL)."""
    database = connections[DEFAULT_DB_ALIAS]
    lean = getattr(database, "lean_transaction", None)
    if lean is None or database.in_atomic_block:
        return None
    return cast(AbstractContextManager[Any], lean())


def _fetch(sql: str, params: list[Any]) -> list[Any]:
    database = connections[DEFAULT_DB_ALIAS]
    lean_fetch = getattr(database, "lean_fetch", None)
    if lean_fetch is not None:  # agentsite's SQLite backend: the read of every turn
        return cast(list[Any], lean_fetch(sql, params))
    with database.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


class UnreadableSessionItem(InvalidToken):
    """The newest item of an encrypted session cannot be decrypted, so it was not popped.

    A `cryptography.fernet.InvalidToken`, as the SDK's `EncryptedSession` raises for the same
    item over its `SQLiteSession`: code written for the SDK's catches it unchanged."""


_unreadable_lock = threading.Lock()
_unreadable_counts: Counter[str] = Counter()


def unreadable_item_counts() -> dict[str, int]:
    """How many unreadable items each session id has met in this process, for operators."""
    with _unreadable_lock:
        return dict(_unreadable_counts)


def _fingerprint(item: Any) -> str:
    raw = json.dumps(item, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:12]


class AuditedEncryptedSession(EncryptedSession):
    """The SDK's `EncryptedSession`, minus its silent data loss.

    The SDK skips an item that fails to decrypt (wrong key, corruption, a plaintext row
    written before encryption was turned on) without a word, and its `pop_item` on any
    backend but `SQLiteSession` deletes such items on the way. Here every such item is
    logged and counted, and `pop_item` refuses to remove one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unreadable_seen = 0

    def _unwrap(self, item: Any) -> TResponseInputItem | None:
        plain = super()._unwrap(item)
        if plain is None and not self._is_expired(item):
            self._report_unreadable(item)
        return plain

    def _is_expired(self, item: Any) -> bool:
        """An authentic envelope older than the TTL: hidden on purpose, not lost."""
        if not _is_encrypted_envelope(item):
            return False
        try:
            self.cipher.extract_timestamp(item["payload"].encode("utf-8"))
        except (InvalidToken, TypeError, AttributeError):
            return False
        return True

    def _report_unreadable(self, item: Any) -> None:
        reason = (
            "it does not decrypt with the configured key (wrong key or corrupted)"
            if _is_encrypted_envelope(item)
            else "it is not encrypted (written before encryption was turned on?)"
        )
        self.unreadable_seen += 1
        with _unreadable_lock:
            _unreadable_counts[self.session_id] += 1
        logger.warning(
            "Session %s: skipped an item (fingerprint %s) because %s.",
            self.session_id,
            _fingerprint(item),
            reason,
        )

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        underlying = self.underlying_session
        if not isinstance(underlying, DjangoSession):
            return await super().pop_item(wrapper=wrapper)

        def authenticate(item: TResponseInputItem) -> None:
            if not _is_encrypted_envelope(item):
                raise InvalidToken
            # Without the TTL, so authentic but expired items still drain, as in the SDK.
            self.cipher.extract_timestamp(item["payload"].encode("utf-8"))

        while True:
            try:
                envelope = await underlying._pop_item_with_validation(authenticate)
            except InvalidToken as exc:
                raise UnreadableSessionItem(
                    f"The newest item of session {self.session_id} cannot be decrypted; "
                    "it was left in place."
                ) from exc
            if envelope is None:
                return None
            item = self._unwrap(envelope)
            if item is not None:
                return item


async def rewrite_items(
    session: SessionABC,
    rewrite: Callable[[TResponseInputItem], TResponseInputItem | None],
    lookback: int,
) -> int:
    """`DjangoSession.rewrite_items` through the session `open_session` gave: an encrypted
    one gives `rewrite` each item decrypted (an unreadable one is left as it is) and stores
    what it returns encrypted."""
    if isinstance(session, DjangoSession):
        return await session.rewrite_items(rewrite, lookback)
    if isinstance(session, AuditedEncryptedSession) and isinstance(
        session.underlying_session, DjangoSession
    ):
        encrypted = session

        def through_the_cipher(envelope: TResponseInputItem) -> TResponseInputItem | None:
            plain = EncryptedSession._unwrap(encrypted, envelope)  # quietly: not counted here
            new = rewrite(plain) if plain is not None else None
            return cast("TResponseInputItem", encrypted._wrap(new)) if new is not None else None

        return await session.underlying_session.rewrite_items(through_the_cipher, lookback)
    raise TypeError(f"{type(session).__name__} cannot rewrite items in place")


def open_session(
    session_id: str,
    *,
    owner: Any = None,
    agent_name: str | None = None,
    session_settings: SessionSettings | dict[str, Any] | None = None,
    conversation_pk: int | None = None,
) -> SessionABC:
    """The session the site uses for a conversation: encrypted at rest when a key is set.

    `conversation_pk`, when the caller has the conversation at hand, spares the first write
    looking it up (every write still checks it)."""
    session = DjangoSession(
        session_id, owner=owner, agent_name=agent_name, session_settings=session_settings
    )
    session._conversation_pk = conversation_pk
    key = settings.AGENTSITE_SESSION_ENCRYPTION_KEY
    if not key:
        return session
    return AuditedEncryptedSession(
        session_id=session_id,
        underlying_session=session,
        encryption_key=key,
        ttl=settings.AGENTSITE_SESSION_TTL or NO_EXPIRY_SECONDS,
    )
