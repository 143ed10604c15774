"""The conversations app's plain SQL: `DjangoSession`'s statements, made once per database
from the models (`agentsite.db.sql`).

Why plain SQL: the session store is the SDK's `Session` on our tables and answers for every
turn (the history read before each model call, the items added after it). The ORM's own work
cost about 20 times these queries, and the goal is to be as fast as the SDK's
`SQLiteSession`: the "session store" rows of docs/benchmarks.md (goal ≤ 1.0×), and
"turn overhead: one turn, one tool call" (goal ≤ 1.5× the bare SDK). Compaction's statements
(`compaction_*`) are plain SQL because they are the adapter, as `SQLiteSession`'s own snapshot
is: they read payloads as stored, so that a row that cannot be decoded is seen, never deleted.

Every statement on a session's rows picks them with `of_session` (its parameters first).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentsite.db.sql import column, json_placeholder, per_vendor, table
from conversations.models import Conversation, SessionItem


@dataclass(frozen=True)
class Statements:
    # Params: session id. Every payload, oldest first ("get_items" without a limit; turn
    # overhead: the SDK reads the whole history).
    all_items: str
    # Params: session id, limit. The newest `limit` payloads, newest first (session store:
    # "get_items(limit=20)", flat up to 100,000 items).
    last_items: str
    # Params: conversation pk, payload (JSON text), created (session store: "add_items").
    insert_item: str
    # Params: session id. Deletes the newest item, returning its payload (session store:
    # "pop_item()").
    pop_item: str
    # Params: updated, conversation pk, session id: the write lock on one conversation,
    # taken by its cached pk, which is checked (session store: "add_items").
    touch_by_pk: str
    # Params: updated, session id; returns the pk: the same lock, found by session id (the
    # first write of a session; a pop on PostgreSQL) (session store: "add_items", "pop_item()").
    touch_by_session: str
    # Params: session id, limit. The newest `limit` rows as (id, payload), newest first: what
    # compaction reads, and reads again under the lock before it replaces them.
    compaction_rows: str
    # Params: session id, id, limit. The oldest `limit` rows older than `id`, as (id, payload),
    # oldest first: the expired prefix the encrypted session asks compaction to prune.
    compaction_prefix: str
    # Params: session id, id. Deletes the rows older than or at `id` (the pruned prefix).
    compaction_delete_through: str
    # Params: session id, id. Deletes the rows from `id` on (the replaced suffix).
    compaction_delete_from: str


@per_vendor
def statements() -> Statements:
    items, conversations = table(SessionItem), table(Conversation)
    item_id, payload = column(SessionItem, "id"), column(SessionItem, "payload")
    conversation_id, updated = column(Conversation, "id"), column(Conversation, "updated")
    session_id = column(Conversation, "session_id")
    # A scalar subquery, not a join: the planner then knows it reads one conversation and
    # walks the (conversation, id) index, where a join may walk every item of every
    # conversation newest-first (PostgreSQL does).
    of_session = (
        f"{column(SessionItem, 'conversation')} = "
        f"(SELECT {conversation_id} FROM {conversations} WHERE {session_id} = %s)"
    )
    return Statements(
        all_items=f"SELECT {payload} FROM {items} WHERE {of_session} ORDER BY {item_id}",
        last_items=(
            f"SELECT {payload} FROM {items} WHERE {of_session} ORDER BY {item_id} DESC LIMIT %s"
        ),
        insert_item=(
            f"INSERT INTO {items} ({column(SessionItem, 'conversation')}, {payload}, "
            f"{column(SessionItem, 'created')}) VALUES (%s, {json_placeholder()}, %s)"
        ),
        pop_item=(
            f"DELETE FROM {items} WHERE {item_id} = (SELECT {item_id} FROM {items} "
            f"WHERE {of_session} ORDER BY {item_id} DESC LIMIT 1) RETURNING {payload}"
        ),
        touch_by_pk=(
            f"UPDATE {conversations} SET {updated} = %s "
            f"WHERE {conversation_id} = %s AND {session_id} = %s"
        ),
        touch_by_session=(
            f"UPDATE {conversations} SET {updated} = %s WHERE {session_id} = %s "
            f"RETURNING {conversation_id}"
        ),
        compaction_rows=(
            f"SELECT {item_id}, {payload} FROM {items} WHERE {of_session} "
            f"ORDER BY {item_id} DESC LIMIT %s"
        ),
        compaction_prefix=(
            f"SELECT {item_id}, {payload} FROM {items} WHERE {of_session} AND {item_id} < %s "
            f"ORDER BY {item_id} LIMIT %s"
        ),
        compaction_delete_through=f"DELETE FROM {items} WHERE {of_session} AND {item_id} <= %s",
        compaction_delete_from=f"DELETE FROM {items} WHERE {of_session} AND {item_id} >= %s",
    )
