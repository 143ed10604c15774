"""The conversations app's plain SQL: `DjangoSession`'s statements, made once per database
from the models (`agentsite.db.sql`).

Why plain SQL: the session store is the SDK's `Session` on our tables and answers for every
turn (the history read before each model call, the items added after it). The ORM's own work
cost about 20 times these queries, and the goal is to be as fast as the SDK's
`SQLiteSession`: the "session store" rows of docs/benchmarks.md (goal ≤ 1.0×), and
"turn overhead: one turn, one tool call" (goal ≤ 1.5× the bare SDK). Compaction's statements
(`compaction_*`) are plain SQL because they are the adapter, as `SQLiteSession`'s own snapshot
is: they read payloads as stored, so that a row that cannot be decoded is seen, never deleted.

Every statement on a session's rows picks them with `of_branch` (its parameters first: the
session's branch, else the conversation's current one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from agentsite.db.sql import column, json_placeholder, per_vendor, table
from conversations.models import TURN_USAGE_FIELDS, Conversation, SessionItem, TurnUsage


@dataclass(frozen=True)
class Statements:
    # Each read or pop names its branch by the parameters `of_branch(session id, branch or
    # None)`: with None, the conversation's current branch is read in the same statement (a
    # session that follows its conversation), else the branch given (a run's session keeps
    # its own).
    #
    # Params: of_branch. Every payload of the branch, oldest first ("get_items" without a
    # limit; turn overhead: the SDK reads the whole history).
    all_items: str
    # Params: of_branch, limit. The newest `limit` payloads of the branch, newest first
    # (session store: "get_items(limit=20)", flat up to 100,000 items).
    last_items: str
    # The same, each payload with its turn: what the chat page reads (its edit controls
    # name the turn of each message).
    last_items_with_turns: str
    # Params: conversation pk, branch, turn, message type, tool name, payload (JSON text),
    # created (session store: "add_items").
    insert_item: str
    # Params: of_branch. Deletes the branch's newest item, returning its payload, turn,
    # message type, branch and conversation pk (session store: "pop_item()").
    pop_item: str
    # Params: conversation pk, branch, turn. A turn's usage, once its user message was popped
    # (the first item of its turn: the turn is empty).
    drop_turn_usage: str
    # Params: conversation pk, branch, conversation pk, branch. Turn 0's usage, once the
    # branch is empty (turn 0 items come before any other).
    drop_usage_of_empty_branch: str
    # Params: conversation pk, branch, requests, input, output and total tokens, input and
    # output token details (JSON text or None), run id or None, created, conversation pk,
    # branch, branch. A turn's usage, replaced: the branch's newest item's turn, read in the same
    # statement; nothing when the branch has none (`record_turn_usage`; turn overhead: through
    # the ORM, the read and `bulk_create`'s upsert cost about 1 ms a turn).
    store_turn_usage: str
    # Params: updated, conversation pk, session id, branch or None; returns the current
    # branch and the turn of the newest item of the branch (of the given one, else of the
    # current one; None when it has none): the write lock on one conversation, taken by its
    # cached pk, which is checked, and what an append numbers its items' turns from, in one
    # statement (session store: "add_items").
    touch_by_pk: str
    # Params: updated, session id, branch or None; returns the pk, the current branch and
    # the newest turn: the same lock, found by session id (the first write of a session; a
    # pop on PostgreSQL) (session store: "add_items", "pop_item()").
    touch_by_session: str
    # Params: updated, conversation pk, session id. SQLite's append: the touch of `touch_by_pk`
    # without its RETURNING, which makes SQLite write the result to a temporary table first
    # (11 µs of a 45 µs append); `lean_branch_and_turn` reads the same in the transaction.
    lean_touch: str
    # Params: branch or None, conversation pk. The conversation's current branch and the
    # newest turn of the branch (the one given, else the current one), as `touch_by_pk`
    # returns them.
    lean_branch_and_turn: str
    # Params: conversation pk, branch, branch. The turn of the branch's newest item: read on
    # its own once the lock is held, where the lock's RETURNING cannot read it (see
    # `statements`).
    newest_turn: str
    # Params: conversation pk. The branch the conversation is on: the one a run started
    # without its caller's lock runs on (`start_run`; turn overhead: through the ORM this
    # read cost 0.5 ms of a turn, this statement 0.06 ms).
    current_branch: str
    # Params: `of_branch`, limit. The newest `limit` rows as (id, payload), newest first: what
    # compaction reads, and reads again under the lock before it replaces them.
    compaction_rows: str
    # Params: `of_branch`, id, limit. The oldest `limit` rows older than `id`, as (id, payload),
    # oldest first: the expired prefix the encrypted session asks compaction to prune.
    compaction_prefix: str
    # Params: `of_branch`, id. Deletes the rows older than or at `id` (the pruned prefix).
    compaction_delete_through: str
    # Params: `of_branch`, id. Deletes the rows from `id` on (the replaced suffix).
    compaction_delete_from: str


# The most rows one `insert_items` statement takes: a batch is written by statements of 64,
# 32, ..., 1 rows (at most seven texts to prepare and keep; a 100-row text took 0.5 ms to
# prepare, more than writing the rows).
INSERT_ROWS_MAX = 64


@functools.cache
def insert_items(count: int) -> str:
    """SQLite's append of `count` rows in one statement, the values every row shares bound
    once (numbered parameters): ?1 conversation pk, ?2 branch, ?3 created, then per row its
    turn, message type, tool name and payload. `executemany` binds seven values a row, which
    took a third of a 100-item append (session store: "add_items(10)", "add_items(100)")."""
    assert 1 <= count <= INSERT_ROWS_MAX
    item = SessionItem
    names = ("conversation", "branch", "created", "turn", "message_type", "tool_name", "payload")
    rows = ", ".join(
        f"(?1, ?2, ?3, ?{4 * n + 4}, ?{4 * n + 5}, ?{4 * n + 6}, ?{4 * n + 7})"
        for n in range(count)
    )
    columns = ", ".join(column(item, name) for name in names)
    return f"INSERT INTO {table(item)} ({columns}) VALUES {rows}"


def of_branch(session_id: str, branch: str | None) -> list[str | None]:
    """The parameters naming a session's branch in a read or a pop."""
    return [session_id, branch, session_id, branch, session_id]


@per_vendor
def statements() -> Statements:
    items, conversations, usage = table(SessionItem), table(Conversation), table(TurnUsage)
    item_id, payload = column(SessionItem, "id"), column(SessionItem, "payload")
    item_conversation, branch = column(SessionItem, "conversation"), column(SessionItem, "branch")
    turn = column(SessionItem, "turn")
    conversation_id, updated = column(Conversation, "id"), column(Conversation, "updated")
    session_id, current = column(Conversation, "session_id"), column(Conversation, "current_branch")
    of_branch = _of_branch(
        item_conversation, branch, conversations, conversation_id, session_id, current
    )
    # In the RETURNING of the lock: the branch's newest item, on the same index. Right on
    # SQLite only, whose writers queue at BEGIN: what the UPDATE reads is what is committed
    # once it has the lock. PostgreSQL reads a statement's subqueries in the snapshot taken
    # when the statement began: an UPDATE that waited for the lock re-reads the
    # conversation's row, but this would be the newest turn as it was before the wait (the
    # appends of the writer it waited for unseen). There the session reads the turn again
    # with `newest_turn`, a statement of its own.
    newest_turn = (
        f"(SELECT {turn} FROM {items} "
        f"WHERE {item_conversation} = {conversations}.{conversation_id} "
        f"AND {branch} = COALESCE(%s, {conversations}.{current}) ORDER BY {item_id} DESC LIMIT 1)"
    )
    usage_of_turn = (
        f"{column(TurnUsage, 'conversation')} = %s AND {column(TurnUsage, 'branch')} = %s "
        f"AND {column(TurnUsage, 'turn')}"
    )
    newest_first = f"{branch} DESC, {item_id} DESC"
    return Statements(
        store_turn_usage=_store_turn_usage(items, usage, item_conversation, branch, item_id, turn),
        all_items=(f"SELECT {payload} FROM {items} WHERE {of_branch} ORDER BY {branch}, {item_id}"),
        last_items=(
            f"SELECT {payload} FROM {items} WHERE {of_branch} ORDER BY {newest_first} LIMIT %s"
        ),
        last_items_with_turns=(
            f"SELECT {payload}, {turn} FROM {items} WHERE {of_branch} "
            f"ORDER BY {newest_first} LIMIT %s"
        ),
        insert_item=(
            f"INSERT INTO {items} ({item_conversation}, {branch}, {turn}, "
            f"{column(SessionItem, 'message_type')}, {column(SessionItem, 'tool_name')}, "
            f"{payload}, {column(SessionItem, 'created')}) "
            f"VALUES (%s, %s, %s, %s, %s, {json_placeholder()}, %s)"
        ),
        pop_item=(
            f"DELETE FROM {items} WHERE {item_id} = (SELECT {item_id} FROM {items} "
            f"WHERE {of_branch} ORDER BY {newest_first} LIMIT 1) RETURNING {payload}, {turn}, "
            f"{column(SessionItem, 'message_type')}, {branch}, {item_conversation}"
        ),
        drop_turn_usage=f"DELETE FROM {usage} WHERE {usage_of_turn} = %s",
        drop_usage_of_empty_branch=(
            f"DELETE FROM {usage} WHERE {usage_of_turn} = 0 AND NOT EXISTS (SELECT 1 "
            f"FROM {items} WHERE {item_conversation} = %s AND {branch} = %s)"
        ),
        touch_by_pk=(
            f"UPDATE {conversations} SET {updated} = %s "
            f"WHERE {conversation_id} = %s AND {session_id} = %s "
            f"RETURNING {current}, {newest_turn}"
        ),
        lean_touch=(
            f"UPDATE {conversations} SET {updated} = %s "
            f"WHERE {conversation_id} = %s AND {session_id} = %s"
        ),
        lean_branch_and_turn=(
            f"SELECT {current}, {newest_turn} FROM {conversations} WHERE {conversation_id} = %s"
        ),
        touch_by_session=(
            f"UPDATE {conversations} SET {updated} = %s WHERE {session_id} = %s "
            f"RETURNING {conversation_id}, {current}, {newest_turn}"
        ),
        current_branch=f"SELECT {current} FROM {conversations} WHERE {conversation_id} = %s",
        newest_turn=(
            f"SELECT {turn} FROM {items} WHERE {item_conversation} = %s "
            f"AND {branch} >= %s AND {branch} <= %s ORDER BY {branch} DESC, {item_id} DESC LIMIT 1"
        ),
        compaction_rows=(
            f"SELECT {item_id}, {payload} FROM {items} WHERE {of_branch} "
            f"ORDER BY {newest_first} LIMIT %s"
        ),
        compaction_prefix=(
            f"SELECT {item_id}, {payload} FROM {items} WHERE {of_branch} AND {item_id} < %s "
            f"ORDER BY {branch}, {item_id} LIMIT %s"
        ),
        compaction_delete_through=f"DELETE FROM {items} WHERE {of_branch} AND {item_id} <= %s",
        compaction_delete_from=f"DELETE FROM {items} WHERE {of_branch} AND {item_id} >= %s",
    )


def _store_turn_usage(
    items: str, usage: str, item_conversation: str, branch: str, item_id: str, turn: str
) -> str:
    """A turn's usage, replaced: the branch's newest item's turn, read in the same statement
    (the SDK's INSERT OR REPLACE; turn overhead)."""
    usage_columns = [
        column(TurnUsage, name)
        for name in ("conversation", "branch", "turn", *TURN_USAGE_FIELDS, "run", "created")
    ]
    replaced = ", ".join(f"{name} = excluded.{name}" for name in usage_columns[3:])
    return (
        f"INSERT INTO {usage} ({', '.join(usage_columns)}) "
        f"SELECT %s, %s, {turn}, %s, %s, %s, %s, {json_placeholder()}, "
        f"{json_placeholder()}, %s, %s FROM {items} "
        f"WHERE {item_conversation} = %s AND {branch} >= %s AND {branch} <= %s "
        f"ORDER BY {branch} DESC, {item_id} DESC LIMIT 1 "
        f"ON CONFLICT ({', '.join(usage_columns[:3])}) DO UPDATE SET {replaced}"
    )


def _of_branch(
    item_conversation: str,
    branch: str,
    conversations: str,
    conversation_id: str,
    session_id: str,
    current: str,
) -> str:
    """The filter of a session's branch (its parameters: `of_branch` above)."""
    # Scalar subqueries, not a join: the planner then knows it reads one conversation's
    # branch and walks the (conversation, branch, id) index, where a join may walk every item
    # of every conversation newest-first (PostgreSQL does).
    #
    # The branch is bounded from both sides rather than compared equal, and the order names
    # it: with an equality, PostgreSQL drops the branch from the order (it is fixed) and
    # then found walking the primary key newest-first, every conversation's items, as cheap
    # as this index on a small table (seen in tests/conversations/session/test_store.py); a
    # range keeps the branch in the order, which only this index gives without a sort.
    the_branch = f"COALESCE(%s, (SELECT {current} FROM {conversations} WHERE {session_id} = %s))"
    return (
        f"{item_conversation} = (SELECT {conversation_id} FROM {conversations} "
        f"WHERE {session_id} = %s) AND {branch} >= {the_branch} AND {branch} <= {the_branch}"
    )
