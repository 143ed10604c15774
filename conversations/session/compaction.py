"""Compaction: the SDK's hook for `OpenAIResponsesCompactionSession`
(`memory/openai_responses_compaction_session.py`), answered as its `SQLiteSession` answers
it. A snapshot holds the newest `limit` items, whether nothing older exists, and
`replace_suffix(start, output)`, which replaces the items from `start` on with `output` in one
transaction, or changes nothing and returns False when the newest rows are no longer those
read (an append, a pop or a rewrite came in between). Without it the SDK clears the history
and writes it again, losing whatever was written meanwhile.

A row that cannot be decoded is never in the snapshot, so never replaced: the snapshot starts
after the newest such row, and is then incomplete (the SDK compacts that suffix in input mode
only, from a user message on). `prune_prefix` (the SDK's `EncryptedSession` passes
"expired") deletes the oldest rows in the same transaction for as long as it holds for them;
an unreadable row stops it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agents.items import TResponseInputItem
from agents.memory.session import _await_mutation, _CompactionSnapshot
from django.db import connection, transaction
from django.utils import timezone

from agentsite.db.hops import db_thread
from conversations.items import structure
from conversations.session.store import SessionStore, _fetch, _item_rows, _loaded, _texts
from conversations.sql import of_branch, statements

logger = logging.getLogger(__name__)


class CompactionMixin(SessionStore):
    """`DjangoSession`'s compaction snapshot, read and replaced under the conversation's
    lock."""

    async def _compaction_snapshot(
        self,
        limit: int,
        prune_prefix: Callable[[TResponseInputItem], bool] | None,
    ) -> _CompactionSnapshot:
        """The snapshot `DjangoSession._get_compaction_snapshot` answers the SDK with (the
        module's docstring says what it holds)."""
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
