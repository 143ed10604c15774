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
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, cast

from agents.extensions.memory.advanced_sqlite_session import _content_preview
from agents.extensions.memory.encrypt_session import EncryptedSession, _is_encrypted_envelope
from agents.items import TResponseInputItem
from agents.memory.session import SessionABC, _await_mutation, _CompactionSnapshot
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from agents.usage import Usage
from cryptography.fernet import InvalidToken
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from agentsite.db import faithful
from agentsite.db.hops import db_thread
from conversations.items import structure
from conversations.models import (
    BRANCH_ID_MAX_LENGTH,
    MAIN_BRANCH,
    Branch,
    Conversation,
    SessionItem,
    TurnUsage,
)
from conversations.sql import of_branch, statements

logger = logging.getLogger(__name__)

# Fernet needs a number; a century is "no practical expiry" for a chat history.
NO_EXPIRY_SECONDS = 100 * 365 * 24 * 3600


class DjangoSession(SessionABC):
    """A conversation's history, for `Runner.run(..., session=DjangoSession(id))`.

    The `Conversation` row is created on the first `add_items`; `owner` and `agent_name` are
    used only then. `clear_session` empties the history but keeps the conversation itself
    (its owner, title and runs), unlike `SQLiteSession`, which forgets the session row.

    Branches, turns and usage as the SDK's `AdvancedSQLiteSession` has them, with the same
    answers (`tests/test_session_branches_differential.py`), but its current branch is the
    conversation's (`Conversation.current_branch`): a session object lives for one request
    or one run, and the next one reads and writes where the last one switched. With
    `branch`, the object keeps a branch of its own instead (a run's session, on the branch
    its run was started on); switching moves both.
    """

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

    # --- branches, as AdvancedSQLiteSession -------------------------------------------------

    async def current_branch_id(self) -> str:
        """The branch this session reads and writes now (`AdvancedSQLiteSession` keeps it in
        `_current_branch_id`; here it is the conversation's, or this object's own)."""
        return await db_thread(self._branch_sync)()

    async def create_branch_from_turn(
        self, turn_number: int, branch_name: str | None = None
    ) -> str:
        """A new branch with the current branch's items of the turns before `turn_number`,
        which becomes the current one; its id (`branch_name`, else
        "branch_from_turn_<n>_<unix time>", with "_2", "_3"... when taken).

        Raises:
            ValueError: the turn has no user message on the current branch, or
                `branch_name` is blank, was used before in this conversation, or cannot be
                stored (longer than 100 characters, or holding U+0000 or a lone surrogate).
        """
        if branch_name is not None and not branch_name.strip():
            raise ValueError("Branch name cannot be empty")
        if branch_name is not None:
            _check_storable_id(branch_name)
        created = await _await_mutation(
            db_thread(self._create_branch_sync)(turn_number, branch_name)
        )
        if self._branch is not None:
            self._branch = created
        return created

    async def create_branch_from_content(
        self, search_term: str, branch_name: str | None = None
    ) -> str:
        """A branch from the first user turn of the current branch whose text holds
        `search_term` (ASCII letters in any case), as `create_branch_from_turn` makes one.

        Raises:
            ValueError: no user turn holds it, or `branch_name` is refused.
        """
        matching = await self.find_turns_by_content(search_term)
        if not matching:
            raise ValueError(f"No user turns found containing '{search_term}'")
        return await self.create_branch_from_turn(matching[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        """Make `branch_id` the current branch (of the conversation, and of this object).

        Raises:
            ValueError: the branch has no items (it does not exist).
        """
        await _await_mutation(db_thread(self._switch_sync)(branch_id))
        if self._branch is not None:
            self._branch = branch_id

    async def delete_branch(self, branch_id: str, force: bool = False) -> None:
        """Delete a branch's items and usage; its id stays used.

        Raises:
            ValueError: `branch_id` is blank, "main", the current branch (without `force`,
                which switches to "main" first), or does not exist.
        """
        if not branch_id or not branch_id.strip():
            raise ValueError("Branch ID cannot be empty")
        if branch_id == MAIN_BRANCH:
            raise ValueError("Cannot delete the 'main' branch")
        switched = await _await_mutation(db_thread(self._delete_branch_sync)(branch_id, force))
        if switched and self._branch is not None:
            self._branch = MAIN_BRANCH

    async def list_branches(self) -> list[dict[str, Any]]:
        """Each branch that has items, oldest first: `branch_id`, `message_count`,
        `user_turns`, `is_current`, `created_at` (UTC, "YYYY-MM-DD HH:MM:SS", as SQLite's
        CURRENT_TIMESTAMP writes it)."""
        return await db_thread(self._list_branches_sync)()

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of the current branch (or `branch_id`): `turn`, `content` (cut to
        100 characters), `full_content`, `timestamp`, `can_branch`."""
        return await db_thread(self._turns_sync)(branch_id, None)

    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The user turns whose text holds `search_term` (ASCII letters in any case), as
        `get_conversation_turns` gives them but with `content` uncut. Searched in Python over
        the branch's user messages, read (decrypted, when the session is encrypted) one by
        one: what SQLite's LIKE plus the SDK's own check find."""
        pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)
        return await db_thread(self._turns_sync)(branch_id, pattern)

    async def get_conversation_by_turns(
        self, branch_id: str | None = None
    ) -> dict[int, list[dict[str, str | None]]]:
        """Each turn's items as `{"type": message type, "tool_name": ...}`, in order."""
        return await db_thread(self._by_turns_sync)(branch_id)

    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str, int, int]]:
        """(tool name, calls, turn) for each tool called in each turn, by turn."""
        return await db_thread(self._tool_usage_sync)(branch_id)

    async def store_run_usage(self, result: Any) -> None:
        """Store what `result` (a `RunResult`) used as the current turn's usage of the
        current branch, replacing what the turn had; nothing when the branch is empty.
        Never raises: a failure is logged, as the SDK does."""
        try:
            usage = result.context_wrapper.usage
            if usage is not None:
                await _await_mutation(db_thread(self._store_usage_sync)(usage))
        except Exception:
            logger.exception("Session %s: failed to store session usage", self.session_id)

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """Usage summed over every branch (or `branch_id`'s turns): `requests`,
        `input_tokens`, `output_tokens`, `total_tokens`, `total_turns`; None when none was
        stored."""
        return await db_thread(self._session_usage_sync)(branch_id)

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """One turn's usage (`{}` when none), or every turn's of the branch, by turn."""
        return await db_thread(self._turn_usage_sync)(user_turn_number, branch_id)

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
        return [_loaded(value) for (value,) in rows]

    def _items_with_turns_sync(self, limit: int) -> list[tuple[int, TResponseInputItem]]:
        where = [*of_branch(self.session_id, self._branch), limit]
        rows = _fetch(statements().last_items_with_turns, where)
        rows.reverse()
        return [(turn, _loaded(value)) for value, turn in rows]

    def _add_items_sync(
        self,
        items: list[TResponseInputItem],
        structures: list[tuple[str, str | None]] | None = None,
    ) -> None:
        sql = statements()
        texts = _texts(items)
        if structures is None:
            structures = [structure(item) for item in items]

        def rows(pk: int, branch: str, newest: int | None, now: Any) -> list[tuple[Any, ...]]:
            return _item_rows(texts, structures, pk, branch, newest, now)

        lean = _lean_transaction()
        if lean is not None and self._conversation_pk is not None:
            # SQLite, the conversation known: the statements straight on the driver.
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            with lean as cursor:
                touched = cursor.execute(
                    sql.touch_by_pk, [now, self._conversation_pk, self.session_id, self._branch]
                ).fetchone()
                if touched is not None:
                    current, newest = touched
                    branch = self._branch or current
                    cursor.executemany(
                        sql.insert_item, rows(self._conversation_pk, branch, newest, now)
                    )
                    return
            # Deleted meanwhile (nothing was written): the general path recreates it.
        with transaction.atomic(), connection.cursor() as cursor:
            now = connection.ops.adapt_datetimefield_value(timezone.now())
            locked = self._lock_conversation(cursor, now, create=True)
            assert locked is not None
            conversation_pk, branch, newest = locked
            # One executemany, as SQLiteSession does; bulk_create's per-field preparation
            # cost more than the inserts themselves.
            cursor.executemany(sql.insert_item, rows(conversation_pk, branch, newest, now))

    def _pop_sync(
        self, validate: Callable[[TResponseInputItem], None] | None
    ) -> TResponseInputItem | None:
        lean = _lean_transaction()
        if lean is not None:
            # SQLite: its IMMEDIATE transaction serializes every writer, as SQLiteSession's
            # lock does, so the one statement is the whole pop (and a second when it empties
            # a turn).
            with lean as cursor:
                return self._pop_in(cursor, self._branch, validate)
        with transaction.atomic(), connection.cursor() as cursor:
            branch = self._branch
            if connection.vendor != "sqlite":
                # Pops and appends of one conversation queue on its row lock.
                now = connection.ops.adapt_datetimefield_value(timezone.now())
                locked = self._lock_conversation(cursor, now, create=False)
                if locked is None:
                    return None
                branch = locked[1]
            return self._pop_in(cursor, branch, validate)

    def _pop_in(
        self,
        cursor: Any,
        branch: str | None,
        validate: Callable[[TResponseInputItem], None] | None,
    ) -> TResponseInputItem | None:
        sql = statements()
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
                item = _loaded(row[1])
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
            locked = self._lock_conversation(cursor, now, create=False)
            branch = locked[1] if locked is not None else None
            current = (
                self._session_rows(sql.compaction_rows, len(expected), cursor=cursor, branch=branch)
                if locked is not None
                else []
            )
            if current[::-1] != expected:
                transaction.set_rollback(True)  # not even the touch of `updated`
                return False
            assert locked is not None
            first = expected[0][0]
            if prune_prefix is not None:
                self._prune_prefix_sync(cursor, first, batch, prune_prefix, branch)
            self._session_rows(sql.compaction_delete_from, first, cursor=cursor, branch=branch)
            # Numbered on from what is left of the branch (a second touch, in this lock).
            relocked = self._lock_conversation(cursor, now, create=False)
            assert relocked is not None
            texts = _texts(output)
            structures = [structure(item) for item in output]
            cursor.executemany(
                sql.insert_item,
                _item_rows(texts, structures, relocked[0], relocked[1], relocked[2], now),
            )
            return True

    def _prune_prefix_sync(
        self,
        cursor: Any,
        before: int,
        batch: int,
        prune: Callable[[TResponseInputItem], bool],
        branch: str | None,
    ) -> None:
        """Delete the oldest rows (older than `before`) for as long as `prune` holds for them,
        `batch` at a time, as the SDK's stores do; a row that cannot be read stops it."""
        sql = statements()
        while True:
            prefix = self._session_rows(
                sql.compaction_prefix, before, batch, cursor=cursor, branch=branch
            )
            last = None
            for row_id, value in prefix:
                try:
                    item = _loaded(value)
                except (ValueError, TypeError):
                    break
                if not prune(item):
                    break
                last = row_id
            if last is None:
                return
            self._session_rows(sql.compaction_delete_through, last, cursor=cursor, branch=branch)
            if last != prefix[-1][0] or len(prefix) < batch:
                return

    def _session_rows(
        self, sql: str, *params: Any, cursor: Any = None, branch: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one of the statements on this session's rows of a branch (`branch`, else its
        own, else the conversation's current one: those `of_branch` picks, in
        conversations/sql.py), the parameters that pick them first; the rows it returns (none
        for a DELETE). Without `cursor`, a read on its own."""
        picked = [*of_branch(self.session_id, branch or self._branch), *params]
        if cursor is None:
            return [tuple(row) for row in _fetch(sql, picked)]
        cursor.execute(sql, picked)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else []

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

    def _branch_sync(self) -> str:
        if self._branch is not None:
            return self._branch
        where = self._where()
        return where[1] if where is not None else MAIN_BRANCH

    def _create_branch_sync(self, turn_number: int, branch_name: str | None) -> str:
        with transaction.atomic():
            locked = self._locked()
            source = locked[1] if locked is not None else (self._branch or MAIN_BRANCH)
            if locked is None or not _has_user_turn(locked[0], source, turn_number):
                raise ValueError(
                    f"Turn {turn_number} does not contain a user message in branch '{source}'"
                )
            conversation_pk = locked[0]
            branch_id = _reserve(conversation_pk, branch_name, turn_number, source)
            copied = (
                SessionItem.objects.filter(
                    conversation_id=conversation_pk, branch=source, turn__lt=turn_number
                )
                .order_by("id")
                .values_list("turn", "message_type", "tool_name", "payload")
            )
            # In their order: the copies' ids keep the branch's order, as the SDK's
            # sequence numbers do.
            SessionItem.objects.bulk_create(
                (
                    SessionItem(
                        conversation_id=conversation_pk,
                        branch=branch_id,
                        turn=turn,
                        message_type=kind,
                        tool_name=tool,
                        payload=payload,
                    )
                    for turn, kind, tool, payload in copied.iterator()
                ),
                batch_size=500,
            )
            Conversation.objects.filter(pk=conversation_pk).update(current_branch=branch_id)
            return branch_id

    def _switch_sync(self, branch_id: str) -> None:
        with transaction.atomic():
            locked = self._locked()
            if locked is None or not _branch_exists(locked[0], branch_id):
                raise ValueError(f"Branch '{branch_id}' does not exist")
            Conversation.objects.filter(pk=locked[0]).update(current_branch=branch_id)

    def _delete_branch_sync(self, branch_id: str, force: bool) -> bool:
        """Delete the branch; True when the session was on it and went back to "main"."""
        with transaction.atomic():
            locked = self._locked()
            current = locked[1] if locked is not None else (self._branch or MAIN_BRANCH)
            exists = locked is not None and _branch_exists(locked[0], branch_id)
            switched = False
            if branch_id == current:
                if not force:
                    raise ValueError(
                        f"Cannot delete current branch '{branch_id}'. Use force=True or switch "
                        "branches first"
                    )
                if not exists:
                    raise ValueError(f"Branch '{branch_id}' does not exist")
                assert locked is not None
                if not _branch_exists(locked[0], MAIN_BRANCH):
                    raise ValueError(f"Branch '{MAIN_BRANCH}' does not exist")
                Conversation.objects.filter(pk=locked[0]).update(current_branch=MAIN_BRANCH)
                switched = True
            if not exists:
                raise ValueError(f"Branch '{branch_id}' does not exist")
            assert locked is not None
            TurnUsage.objects.filter(conversation_id=locked[0], branch=branch_id).delete()
            SessionItem.objects.filter(conversation_id=locked[0], branch=branch_id).delete()
            return switched

    def _list_branches_sync(self) -> list[dict[str, Any]]:
        where = self._where()
        if where is None:
            return []
        conversation_pk, current = where
        rows = (
            SessionItem.objects.filter(conversation_id=conversation_pk)
            .values("branch")
            .annotate(
                message_count=Count("id"),
                user_turns=Count("id", filter=Q(message_type="user")),
                created_at=Min("created"),
                first=Min("id"),
            )
            .order_by("created_at", "first")
        )
        return [
            {
                "branch_id": row["branch"],
                "message_count": row["message_count"],
                "user_turns": row["user_turns"],
                "is_current": row["branch"] == current,
                "created_at": _sqlite_timestamp(row["created_at"]),
            }
            for row in rows
        ]

    def _turns_sync(
        self, branch_id: str | None, pattern: re.Pattern[str] | None
    ) -> list[dict[str, Any]]:
        where = self._where(branch_id)
        if where is None or not _storable_id(where[1]):
            return []
        rows = (
            SessionItem.objects.filter(
                conversation_id=where[0], branch=where[1], message_type="user"
            )
            .order_by("turn", "id")
            .values_list("turn", "payload", "created")
        )
        turns = []
        for turn, payload, created in rows:
            item = self._read_content(payload)
            if not isinstance(item, dict):
                continue  # unreadable (a key that does not decrypt it)
            content = item.get("content", "")
            if pattern is not None:
                try:
                    texts = (
                        [content]
                        if isinstance(content, str)
                        else [part.get("text", "") for part in content]
                    )
                except AttributeError:
                    continue
                if not any(pattern.search(text) for text in texts):
                    continue
            turns.append(
                {
                    "turn": turn,
                    "content": _content_preview(content, None if pattern else 100),
                    "full_content": content,
                    "timestamp": _sqlite_timestamp(created),
                    "can_branch": True,
                }
            )
        return turns

    def _by_turns_sync(self, branch_id: str | None) -> dict[int, list[dict[str, str | None]]]:
        where = self._where(branch_id)
        turns: dict[int, list[dict[str, str | None]]] = {}
        if where is None or not _storable_id(where[1]):
            return turns
        rows = SessionItem.objects.filter(conversation_id=where[0], branch=where[1]).order_by("id")
        for turn, kind, tool in rows.values_list("turn", "message_type", "tool_name"):
            turns.setdefault(turn, []).append({"type": kind, "tool_name": tool})
        return turns

    def _tool_usage_sync(self, branch_id: str | None) -> list[tuple[str, int, int]]:
        where = self._where(branch_id)
        if where is None or not _storable_id(where[1]):
            return []
        rows = list(
            SessionItem.objects.filter(conversation_id=where[0], branch=where[1])
            .order_by("id")
            .values_list("turn", "message_type", "tool_name")
        )
        # AdvancedSQLiteSession.get_tool_usage's query, in Python: each tool call counts,
        # and a tool search's output counts when its turn has no call of the same search.
        searched = {(turn, tool) for turn, kind, tool in rows if kind == "tool_search_call"}
        counts: Counter[tuple[str | None, int]] = Counter()
        for turn, kind, tool in rows:
            if kind in TOOL_CALL_TYPES:
                name = tool if tool is not None else (kind if kind in NAMED_BY_TYPE else None)
                counts[(name, turn)] += 1
            elif kind == "tool_search_output" and (tool is None or (turn, tool) not in searched):
                counts[(tool, turn)] += 1
        ordered = sorted(counts.items(), key=lambda entry: (entry[0][1], entry[0][0] or ""))
        return [(cast(str, name), count, turn) for (name, turn), count in ordered]

    def _store_usage_sync(self, usage: Usage) -> None:
        with transaction.atomic():
            locked = self._locked()
            if locked is not None:
                record_turn_usage(locked[0], locked[1], usage)

    def _session_usage_sync(self, branch_id: str | None) -> dict[str, int] | None:
        rows = TurnUsage.objects.filter(conversation__session_id=self.session_id)
        if branch_id:
            rows = rows.filter(branch=branch_id)
        totals = rows.aggregate(
            requests=Sum("requests"),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            total_tokens=Sum("total_tokens"),
            total_turns=Count("id"),
        )
        if totals["requests"] is None:
            return None
        return {name: int(value or 0) for name, value in totals.items()}

    def _turn_usage_sync(
        self, user_turn_number: int | None, branch_id: str | None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        where = self._where(branch_id)
        fields = USAGE_FIELDS
        if user_turn_number is not None:
            if where is None or not _storable_id(where[1]) or not _turn_in_range(user_turn_number):
                return {}
            found = (
                TurnUsage.objects.filter(
                    conversation_id=where[0], branch=where[1], turn=user_turn_number
                )
                .values(*fields)
                .first()
            )
            return dict(found) if found is not None else {}
        if where is None or not _storable_id(where[1]):
            return []
        rows = TurnUsage.objects.filter(conversation_id=where[0], branch=where[1]).order_by("turn")
        return [
            {"user_turn_number": row.pop("turn"), **row} for row in rows.values("turn", *fields)
        ]


# What `get_tool_usage` counts, as AdvancedSQLiteSession's query names them.
TOOL_CALL_TYPES = frozenset(
    {
        "tool_call",
        "function_call",
        "computer_call",
        "file_search_call",
        "web_search_call",
        "code_interpreter_call",
        "tool_search_call",
        "custom_tool_call",
        "mcp_call",
        "mcp_approval_request",
        "shell_call",
        "apply_patch_call",
    }
)
NAMED_BY_TYPE = frozenset({"shell_call", "apply_patch_call"})
USAGE_FIELDS = (
    "requests",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "input_tokens_details",
    "output_tokens_details",
)
# The largest turn number a query may name (PostgreSQL's integer); beyond, no turn exists.
MAX_TURN = 2**31 - 1


def _as_stored(payload: Any) -> Any:
    return payload


def _loaded(value: Any) -> Any:
    """A payload read by plain SQL (JSON text, or already parsed) as the item it holds;
    ValueError or TypeError when it cannot be read."""
    return faithful.decode(json.loads(value) if isinstance(value, (str, bytes)) else value)


def _turn_in_range(turn: Any) -> bool:
    return isinstance(turn, int) and -MAX_TURN <= turn <= MAX_TURN


def _has_user_turn(conversation_pk: int, branch: str, turn: Any) -> bool:
    if not _storable_id(branch) or not _turn_in_range(turn):
        return False
    return SessionItem.objects.filter(
        conversation_id=conversation_pk, branch=branch, turn=turn, message_type="user"
    ).exists()


def _branch_exists(conversation_pk: int, branch: Any) -> bool:
    if not _storable_id(branch):
        return False
    return SessionItem.objects.filter(conversation_id=conversation_pk, branch=branch).exists()


def _storable_id(branch: Any) -> bool:
    """Whether a branch id could have been stored: text the database holds, short enough."""
    return (
        isinstance(branch, str)
        and len(branch) <= BRANCH_ID_MAX_LENGTH
        and "\x00" not in branch
        and not any(0xD800 <= ord(c) <= 0xDFFF for c in branch)
    )


def _check_storable_id(branch: str) -> None:
    if not _storable_id(branch):
        raise ValueError(
            f"Branch name {branch[:40]!r} cannot be used: at most {BRANCH_ID_MAX_LENGTH} "
            "characters, without U+0000 or a lone surrogate."
        )


def _reserve(conversation_pk: int, name: str | None, from_turn: int, source: str) -> str:
    """Take a new branch id for good (under the conversation's lock): `name`, or the SDK's
    generated one, "branch_from_turn_<n>_<unix time>" with "_2", "_3"... when taken."""
    if name is None:
        base = f"branch_from_turn_{from_turn}_{int(time.time())}"
        taken = set(
            Branch.objects.filter(
                conversation_id=conversation_pk, branch_id__startswith=base
            ).values_list("branch_id", flat=True)
        )
        name, suffix = base, 1
        while name in taken:
            suffix += 1
            name = f"{base}_{suffix}"
    elif (
        name == MAIN_BRANCH
        or Branch.objects.filter(conversation_id=conversation_pk, branch_id=name).exists()
    ):
        raise ValueError(f"Branch ID '{name}' has already been used. Choose a new branch ID.")
    Branch.objects.create(
        conversation_id=conversation_pk, branch_id=name, source=source, from_turn=from_turn
    )
    return name


def _sqlite_timestamp(moment: datetime | None) -> str | None:
    """A time as SQLite's CURRENT_TIMESTAMP writes it (UTC), which the SDK's answers hold."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if moment is not None else None


def _details(details: Any) -> Any:
    """Token details as the SDK stores them: the object's fields, through JSON."""
    if not details:
        return None
    try:
        return json.loads(json.dumps(details.__dict__))
    except (TypeError, ValueError, AttributeError):
        logger.warning("Token details %r could not be stored", type(details).__name__)
        return None


def record_turn_usage(
    conversation_pk: int, branch: str, usage: Usage, run_id: int | None = None
) -> bool:
    """Store `usage` as what the newest turn of `branch` used (`store_run_usage`'s write),
    replacing what that turn had; nothing when the branch has no items. For the run engine,
    in its final write's transaction (with the run that used it). True if stored."""
    details = [
        _details(getattr(usage, name, None))
        for name in ("input_tokens_details", "output_tokens_details")
    ]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        # One statement, the SDK's INSERT OR REPLACE with its read of the current turn
        # (a run's final write pays for it on every turn: conversations/sql.py).
        cursor.execute(
            statements().store_turn_usage,
            [
                conversation_pk,
                branch,
                usage.requests or 0,
                usage.input_tokens or 0,
                usage.output_tokens or 0,
                usage.total_tokens or 0,
                *(json.dumps(value) if value is not None else None for value in details),
                run_id,
                now,
                conversation_pk,
                branch,
                branch,
            ],
        )
        return bool(cursor.rowcount)


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
    payload = _loaded(value)
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
        underlying = self.underlying_session
        if isinstance(underlying, DjangoSession):
            # The branch API is the underlying session's (reached through this one too: the
            # SDK's wrapper passes unknown attributes on); what it reads of a message's text
            # it reads decrypted.
            underlying._read_content = self._unwrap

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        underlying = self.underlying_session
        if not isinstance(underlying, DjangoSession):
            await super().add_items(items, wrapper=wrapper)
            return
        # Each item's place in its branch (a user message starts a turn) is read from the
        # plain item: its envelope says nothing. Only that structure is stored in the clear,
        # as the SDK's `message_structure` table holds it: the type and tool name.
        structures = [structure(item) for item in items]
        await underlying._add_items_with_structure(self._encrypt_items(items), structures)

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

    async def get_items_with_turns(self, limit: int) -> list[tuple[int, TResponseInputItem]]:
        """`DjangoSession.get_items_with_turns`, decrypted; an item that cannot be decrypted
        is left out (and counted, as `get_items` does)."""
        underlying = self.underlying_session
        assert isinstance(underlying, DjangoSession)
        rows = await underlying.get_items_with_turns(limit)
        return [(turn, plain) for turn, item in rows if (plain := self._unwrap(item)) is not None]

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


def fork(conversation: Conversation, turn_number: int, branch_name: str) -> str:
    """`create_branch_from_turn` of the conversation's session, in the caller's transaction
    (a view that holds the conversation and starts the new branch's first run in the same
    transaction: either both happen or neither). Raises as it does."""
    _check_storable_id(branch_name)
    return DjangoSession.for_conversation(conversation)._create_branch_sync(
        turn_number, branch_name
    )


def switch(conversation: Conversation, branch_id: str) -> None:
    """`switch_to_branch` of the conversation's session, in the caller's transaction."""
    DjangoSession.for_conversation(conversation)._switch_sync(branch_id)


def branching(session: SessionABC) -> DjangoSession:
    """The `DjangoSession` with the branch API of the session `open_session` gave: itself,
    or the one an encrypted session wraps (which reads what it needs of a message's text
    decrypted: see `DjangoSession.find_turns_by_content`)."""
    if isinstance(session, DjangoSession):
        return session
    if isinstance(session, AuditedEncryptedSession) and isinstance(
        session.underlying_session, DjangoSession
    ):
        return session.underlying_session
    raise TypeError(f"{type(session).__name__} has no branches")


def open_session(
    session_id: str,
    *,
    owner: Any = None,
    agent_name: str | None = None,
    session_settings: SessionSettings | dict[str, Any] | None = None,
    conversation_pk: int | None = None,
    branch: str | None = None,
) -> SessionABC:
    """The session the site uses for a conversation: encrypted at rest when a key is set.

    `conversation_pk`, when the caller has the conversation at hand, spares the first write
    looking it up (every write still checks it). `branch`: the session keeps that branch
    (a run's, the one it was started on) instead of following the conversation's current
    one."""
    session = DjangoSession(
        session_id,
        owner=owner,
        agent_name=agent_name,
        session_settings=session_settings,
        branch=branch,
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
