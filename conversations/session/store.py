"""The core of the session store: the SDK's `Session` protocol (get, add, pop, clear) on
`SessionItem` rows, the lock every writer of a conversation takes, and the row helpers the
other capabilities share (as the SDK's `memory/sqlite_session.py` is the core its
`AdvancedSQLiteSession` builds on).

Each operation is one hop to a worker thread that does all its queries there, because a hop
costs far more than a query (SDK_NOTES: about 110 µs). Hops are not thread-sensitive, so
several conversations, or several writers to one conversation, really run at once; the
database keeps them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session import SessionABC, _await_mutation
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from agentsite.db import faithful
from agentsite.db.hops import db_thread
from conversations.items import structure
from conversations.models import (
    BRANCH_ID_MAX_LENGTH,
    MAIN_BRANCH,
    Conversation,
    SessionItem,
    TurnUsage,
)
from conversations.sql import (
    INSERT_ROWS_MAX,
    Statements,
    insert_items,
    of_branch,
    statements,
)

# The largest turn number a query may name (PostgreSQL's integer); beyond, no turn exists.
MAX_TURN = 2**31 - 1


class SessionStore(SessionABC):
    """The SDK's `Session` on a conversation's rows: what `DjangoSession` (`django_session.py`)
    is made of first, the capabilities of `branches.py`, `usage.py` and `compaction.py`
    built on it."""

    def __init__(
        self,
        session_id: str,
        *,
        owner: Any = None,
        agent_name: str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        branch: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._owner = owner
        self._agent_name = agent_name
        self._branch = branch
        # How a stored item's content is read (turn listing, content search): as it is, or
        # decrypted, when `AuditedEncryptedSession` wraps this one (None: unreadable).
        self._read_content: Callable[[Any], Any] = _as_stored
        # A cache only: every write re-checks it, so a deleted conversation is recreated.
        self._conversation_pk: int | None = None

    # --- the Session protocol ------------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, branch_id: str | None = None
    ) -> list[TResponseInputItem]:
        """The newest `limit` items of the current branch (or of `branch_id`), oldest first."""
        effective = resolve_session_limit(limit, self.session_settings)
        if effective == 0:
            return []
        branch = branch_id if branch_id is not None else self._branch
        if branch is not None and not _storable_id(branch):
            return []  # no branch can have that id
        return await db_thread(self._get_items_sync)(effective, branch)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        # Copied before the hop, so a caller that mutates its list later changes nothing.
        batch = list(items)
        await _await_mutation(db_thread(self._add_items_sync)(batch))

    async def pop_item(self) -> TResponseInputItem | None:
        return await self._pop_item_with_validation()

    async def clear_session(self) -> None:
        """Every branch's items and usage go, and the conversation is back on "main" (the
        ids its branches had stay used, as in the SDK)."""
        await _await_mutation(db_thread(self._clear_sync)())
        if self._branch is not None:
            self._branch = MAIN_BRANCH

    async def rewrite_items(
        self,
        rewrite: Callable[[TResponseInputItem], TResponseInputItem | None],
        lookback: int,
    ) -> int:
        """Change items in place, in one transaction: each of the newest `lookback` items (of
        the current branch) is given to `rewrite`, and those it returns a new item for are
        replaced by that item, keeping their place (the session protocol has no update; this
        is agentsite's own). Returns how many changed; a `rewrite` that raises changes none."""
        return await _await_mutation(db_thread(self._rewrite_sync)(rewrite, lookback))

    async def _pop_item_with_validation(
        self, validate: Callable[[TResponseInputItem], None] | None = None
    ) -> TResponseInputItem | None:
        """Pop the newest item; if `validate` raises, nothing is removed."""
        return await _await_mutation(db_thread(self._pop_sync)(validate))

    async def _add_items_with_structure(
        self, items: list[TResponseInputItem], structures: list[tuple[str, str | None]]
    ) -> None:
        """`add_items` of items whose structure was read before they were changed (the
        encrypted session's envelopes, classified from the plain items)."""
        if items:
            await _await_mutation(db_thread(self._add_items_sync)(list(items), structures))

    async def get_items_with_turns(self, limit: int) -> list[tuple[int, TResponseInputItem]]:
        """The newest `limit` items of the current branch, oldest first, each with its turn
        (agentsite's own: the chat names the turn a message starts, to edit it)."""
        return await db_thread(self._items_with_turns_sync)(limit)

    # --- the synchronous halves, each run whole in one worker thread -----------------------

    def _get_items_sync(
        self, limit: int | None, branch: str | None = None
    ) -> list[TResponseInputItem]:
        # The hottest path of a turn, so its one query is plain SQL (conversations/sql.py
        # says why).
        where = of_branch(self.session_id, branch)
        if limit is None or limit < 0:
            # SQLite reads a negative LIMIT as "no limit"; SQLiteSession inherits that.
            rows = _fetch(statements().all_items, where)
        else:
            rows = _fetch(statements().last_items, [*where, limit])
            rows.reverse()
        return faithful.decode_texts([value for (value,) in rows])

    def _items_with_turns_sync(self, limit: int) -> list[tuple[int, TResponseInputItem]]:
        where = [*of_branch(self.session_id, self._branch), limit]
        rows = _fetch(statements().last_items_with_turns, where)
        rows.reverse()
        loaded = faithful.decode_texts([value for value, _ in rows])
        return [(turn, item) for (_, turn), item in zip(rows, loaded, strict=True)]

    def _add_items_sync(
        self,
        items: list[TResponseInputItem],
        structures: list[tuple[str, str | None]] | None = None,
    ) -> None:
        # The connection looked up once (Django's per-thread handler costs a few µs a lookup).
        database: Any = connections[DEFAULT_DB_ALIAS]
        sql = statements(database.vendor)
        texts = _texts(items)
        if structures is None:
            structures = [structure(item) for item in items]

        lean = _lean_transaction(database)
        if lean is not None and self._conversation_pk is not None:
            # SQLite, the conversation known: the statements straight on the driver.
            now = database.lean_now()
            pk = self._conversation_pk
            with lean as cursor:
                if cursor.execute(sql.lean_touch, [now, pk, self.session_id]).rowcount == 1:
                    current, newest = cursor.execute(
                        sql.lean_branch_and_turn, [self._branch, pk]
                    ).fetchone()
                    branch = self._branch or current
                    _insert_lean(cursor, _item_rows(texts, structures, pk, branch, newest, now))
                    return
            # Deleted meanwhile (nothing was written): the general path recreates it.
        with transaction.atomic(), database.cursor() as cursor:
            now = database.ops.adapt_datetimefield_value(timezone.now())
            locked = self._lock_conversation(cursor, now, create=True)
            assert locked is not None
            conversation_pk, branch, newest = locked
            # One executemany, as SQLiteSession does; bulk_create's per-field preparation
            # cost more than the inserts themselves.
            cursor.executemany(
                sql.insert_item, _item_rows(texts, structures, conversation_pk, branch, newest, now)
            )

    def _pop_sync(
        self, validate: Callable[[TResponseInputItem], None] | None
    ) -> TResponseInputItem | None:
        database = connections[DEFAULT_DB_ALIAS]
        sql = statements(database.vendor)
        lean = _lean_transaction(database)
        if lean is not None:
            # SQLite: its IMMEDIATE transaction serializes every writer, as SQLiteSession's
            # lock does, so the one statement is the whole pop (and a second when it empties
            # a turn).
            with lean as cursor:
                return self._pop_in(cursor, sql, self._branch, validate)
        with transaction.atomic(), database.cursor() as cursor:
            branch = self._branch
            if database.vendor != "sqlite":
                # Pops and appends of one conversation queue on its row lock.
                now = database.ops.adapt_datetimefield_value(timezone.now())
                locked = self._lock_conversation(cursor, now, create=False)
                if locked is None:
                    return None
                branch = locked[1]
            return self._pop_in(cursor, sql, branch, validate)

    def _pop_in(
        self,
        cursor: Any,
        sql: Statements,
        branch: str | None,
        validate: Callable[[TResponseInputItem], None] | None,
    ) -> TResponseInputItem | None:
        # Deleted and read in one statement; a failed `validate` rolls the deletion back
        # (the exception leaves the transaction).
        row = _fetch_one(cursor, sql.pop_item, of_branch(self.session_id, branch))
        if row is None:
            return None
        value, turn, kind, popped_branch, conversation_pk = row
        item = _validated((value,), validate)
        # The turn's usage goes with its last item, as AdvancedSQLiteSession's pop does: a
        # user message is the first item of its turn, and turn 0 comes before any other.
        if kind == "user":
            cursor.execute(sql.drop_turn_usage, [conversation_pk, popped_branch, turn])
        elif turn == 0:
            cursor.execute(
                sql.drop_usage_of_empty_branch,
                [conversation_pk, popped_branch, conversation_pk, popped_branch],
            )
        return item

    def _rewrite_sync(
        self, rewrite: Callable[[TResponseInputItem], TResponseInputItem | None], lookback: int
    ) -> int:
        with transaction.atomic(), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            locked = self._lock_conversation(cursor, now, create=False)
            if locked is None:
                return 0
            conversation_pk, branch, _ = locked
            rows = SessionItem.objects.filter(conversation_id=conversation_pk, branch=branch)
            rows = rows.order_by("-id")
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
            locked = self._lock_conversation(cursor, now, create=False)
            if locked is not None:
                conversation_pk = locked[0]
                SessionItem.objects.filter(conversation_id=conversation_pk).delete()
                TurnUsage.objects.filter(conversation_id=conversation_pk).delete()
                Conversation.objects.filter(pk=conversation_pk).update(current_branch=MAIN_BRANCH)

    def _lock_conversation(
        self, cursor: Any, now: Any, *, create: bool
    ) -> tuple[int, str, int | None] | None:
        """Lock this conversation's row for the rest of the transaction and return its pk,
        this session's branch (its own, else the conversation's current one) and the turn
        of that branch's newest item (None: it has none).

        Every writer of one conversation takes this lock first (an UPDATE of its `updated`),
        so concurrent `add_items` batches are serialized: each batch gets contiguous, ordered
        primary keys, and branch changes never interleave with writes. (SQLite's IMMEDIATE
        transactions already serialize all writers; on PostgreSQL the row lock of this
        UPDATE does it per conversation.)
        """
        sql, own = statements(), self._branch
        locked: tuple[int, str, int | None] | None = None
        if self._conversation_pk is not None:
            # The cached pk, checked: a conversation deleted meanwhile is looked up again.
            touched = _fetch_one(
                cursor, sql.touch_by_pk, [now, self._conversation_pk, self.session_id, own]
            )
            if touched is not None:
                locked = self._conversation_pk, own or str(touched[0]), touched[1]
        if locked is None:
            row = _fetch_one(cursor, sql.touch_by_session, [now, self.session_id, own])
            if row is None and create:
                conversation, _ = Conversation.objects.get_or_create(
                    session_id=self.session_id,
                    defaults={"owner": self._owner, "agent_name": self._agent_name or ""},
                )
                # Created now, or by a concurrent writer a moment ago: lock it all the same.
                row = _fetch_one(cursor, sql.touch_by_session, [now, self.session_id, own])
                assert row is not None and row[0] == conversation.pk
            self._conversation_pk = row[0] if row is not None else None
            if row is None:
                return None
            locked = row[0], own or str(row[1]), row[2]
        if connection.vendor != "sqlite":
            # The newest turn as committed now that the lock is held (`sql.newest_turn`).
            pk, branch, _ = locked
            newest = _fetch_one(cursor, sql.newest_turn, [pk, branch, branch])
            locked = pk, branch, newest[0] if newest is not None else None
        return locked

    def _locked(self) -> tuple[int, str] | None:
        """The conversation locked for a branch operation (in a transaction), with this
        session's branch."""
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        with connection.cursor() as cursor:
            locked = self._lock_conversation(cursor, now, create=False)
        return (locked[0], locked[1]) if locked is not None else None

    def _where(self, branch_id: str | None = None) -> tuple[int, str] | None:
        """The conversation's pk and the branch to read: `branch_id`, else this session's."""
        found = (
            Conversation.objects.filter(session_id=self.session_id)
            .values_list("pk", "current_branch")
            .first()
        )
        if found is None:
            return None
        if branch_id is not None:
            return found[0], branch_id
        return found[0], self._branch or found[1]


def _as_stored(payload: Any) -> Any:
    return payload


def _loaded(value: Any) -> Any:
    """A payload read by plain SQL (JSON text, or already parsed) as the item it holds;
    ValueError or TypeError when it cannot be read (`faithful.decode_texts`, which reads a
    text as `json.loads` does without its per-call checks: a pop's few µs)."""
    return faithful.decode_texts((value,))[0]


def _turn_in_range(turn: Any) -> bool:
    return isinstance(turn, int) and -MAX_TURN <= turn <= MAX_TURN


def _storable_id(branch: Any) -> bool:
    """Whether a branch id could have been stored: text the database holds, short enough."""
    return (
        isinstance(branch, str)
        and len(branch) <= BRANCH_ID_MAX_LENGTH
        and "\x00" not in branch
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in branch)
    )


def _item_rows(
    texts: list[str],
    structures: list[tuple[str, str | None]],
    pk: int,
    branch: str,
    newest: int | None,
    now: Any,
) -> list[tuple[Any, ...]]:
    """The rows of items to insert (`add_items`, compaction) on a branch whose newest turn
    is `newest`: a user message starts the next turn; anything else belongs to the one
    before."""
    turn = newest or 0
    made = []
    for text, (kind, tool) in zip(texts, structures, strict=True):
        turn += kind == "user"
        made.append((pk, branch, turn, kind, tool, text, now))
    return made


def _insert_lean(cursor: Any, rows: list[tuple[Any, ...]]) -> None:
    """SQLite's append of the rows `_item_rows` made (all of one conversation, branch and
    time), in statements of 64, 32, ..., 1 rows that bind those three once
    (`conversations.sql.insert_items`), in order."""
    done, total = 0, len(rows)
    while done < total:
        count = min(INSERT_ROWS_MAX, 1 << ((total - done).bit_length() - 1))
        pk, branch, _, _, _, _, now = rows[done]
        params: list[Any] = [pk, branch, now]
        for _, _, turn, kind, tool, text, _ in rows[done : done + count]:
            params += (turn, kind, tool, text)
        cursor.execute(insert_items(count), params)
        done += count


def _texts(items: list[TResponseInputItem]) -> list[str]:
    """Each item as the JSON text to store, any text in it kept (`agentsite.db.faithful`);
    NaN or Infinity, which JSON cannot hold, refuse the whole batch before anything is
    written, naming the item."""
    texts, encode = [], faithful.TextEncoder()
    for n, item in enumerate(items, start=1):
        try:
            texts.append(encode(item))
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
    payload = _loaded(value)
    if validate is not None:
        validate(payload)
    return payload


def _lean_transaction(database: Any) -> AbstractContextManager[Any] | None:
    """agentsite's SQLite backend's lean write transaction (agentsite/db/sqlite/base.py), where
    it can be used: not inside a caller's `atomic()`. None elsewhere (PostgreSQL)."""
    lean = getattr(database, "lean_transaction", None)
    if lean is None or database.in_atomic_block:
        return None
    return cast(AbstractContextManager[Any], lean())


def _fetch_one(cursor: Any, sql: str, params: list[Any]) -> Any:
    """One row of a statement, on Django's cursor or the lean path's (whose `execute`
    returns the driver's cursor)."""
    result = cursor.execute(sql, params)
    return (result if result is not None else cursor).fetchone()


def _fetch(sql: str, params: list[Any]) -> list[Any]:
    database = connections[DEFAULT_DB_ALIAS]
    lean_fetch = getattr(database, "lean_fetch", None)
    if lean_fetch is not None:  # agentsite's SQLite backend: the read of every turn
        return cast(list[Any], lean_fetch(sql, params))
    with database.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
