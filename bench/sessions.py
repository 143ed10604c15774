"""Session store: `DjangoSession` against the SDK's `SQLiteSession` and `SQLAlchemySession`
(on SQLite through aiosqlite), on the same work.

All store in SQLite files in the same directory (agentsite's database; a file of its own for
each of the SDK's stores), with the items a real turn stores: a user message, a tool call,
its output and an assistant message. The large conversations are built with one bulk insert
each, not with `add_items`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any, cast

from agents import SQLiteSession
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from agents.items import TResponseInputItem
from agents.memory.session import SessionABC
from django.db import transaction
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bench.harness import (
    Config,
    Contender,
    Goal,
    Row,
    Samples,
    arun,
    atimed,
    compared,
    interleave,
    ops_per_second,
    ratio,
)
from conversations.items import structure
from conversations.models import Conversation, SessionItem
from conversations.session import DjangoSession

BENCHMARK = "session store"
AS_FAST = Goal(1.0, "≤ 1.0× (as fast as SQLiteSession)")
FLAT = Goal(1.25, "≤ 1.25× (flat)")
# The contenders of a write: DjangoSession, then the SDK's stores (their names: Stores.open).
ALL = ("ours", "peer", "relaxed", "sqlalchemy")

TURN_ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "Where is my order 7? It was due yesterday."},
    {
        "type": "function_call",
        "call_id": "call_7f3a9c",
        "name": "lookup_order",
        "arguments": '{"order_id":7}',
        "id": "fc_7f3a9c",
        "status": "completed",
    },
    {
        "type": "function_call_output",
        "call_id": "call_7f3a9c",
        "output": "Order 7 shipped yesterday with tracking number 1Z999AA10123456784.",
    },
    {
        "type": "message",
        "id": "msg_51c2",
        "role": "assistant",
        "status": "completed",
        "content": [
            {
                "type": "output_text",
                "text": "Order 7 shipped yesterday; the tracking number is 1Z999AA10123456784.",
                "annotations": [],
            }
        ],
    },
]


def items(count: int) -> list[TResponseInputItem]:
    return [cast("TResponseInputItem", TURN_ITEMS[i % len(TURN_ITEMS)]) for i in range(count)]


class RelaxedSQLiteSession(SQLiteSession):
    """`SQLiteSession` with agentsite's durability: SQLite's own default in WAL mode
    (synchronous=FULL) syncs the disk at every commit; agentsite's settings use NORMAL, which
    does not. For writes, this peer shows what is left when both skip that sync."""

    @staticmethod
    def _configure_connection(conn: sqlite3.Connection) -> None:
        SQLiteSession._configure_connection(conn)
        conn.execute("PRAGMA synchronous=NORMAL")


class Stores:
    """One conversation per case in each store, filled in bulk."""

    def __init__(self, config: Config, prefix: str = "") -> None:
        # Before every session id: stores made again in one process (a check measuring its
        # rows a second time) open conversations of their own.
        self.prefix = prefix
        self.sqlite_path = config.workdir / "sdk-sessions.sqlite3"
        self.relaxed_path = config.workdir / "sdk-sessions-normal-sync.sqlite3"
        self.sqlalchemy_path = config.workdir / "sdk-sqlalchemy-sessions.sqlite3"
        self._engine: AsyncEngine | None = None

    def django(self, session_id: str, fill: int = 0) -> DjangoSession:
        if fill:
            with transaction.atomic():
                conversation = Conversation.objects.create(
                    session_id=session_id, agent_name="bench_tool"
                )
                SessionItem.objects.bulk_create(
                    _rows_as_appended(conversation, fill), batch_size=5000
                )
        return DjangoSession(session_id)

    def sqlite(self, session_id: str, fill: int = 0) -> SQLiteSession:
        session = SQLiteSession(session_id, self.sqlite_path)  # creates the tables
        _fill_sdk_tables(self.sqlite_path, session_id, fill)
        return session

    def relaxed(self, session_id: str, fill: int = 0) -> SQLiteSession:
        session = RelaxedSQLiteSession(session_id, self.relaxed_path)
        _fill_sdk_tables(self.relaxed_path, session_id, fill)
        return session

    def sqlalchemy(self, session_id: str, fill: int = 0) -> SQLAlchemySession:
        """One async engine (aiosqlite) for all its sessions, as an application would have;
        tables created by the SDK on first use."""
        if self._engine is None:
            self._engine = create_async_engine(f"sqlite+aiosqlite:///{self.sqlalchemy_path}")
        session = SQLAlchemySession(session_id, engine=self._engine, create_tables=True)
        arun(session.get_items(limit=1))  # creates the tables before they are filled
        _fill_sdk_tables(self.sqlalchemy_path, session_id, fill)
        return session

    def open(self, store: str, session_id: str, fill: int = 0) -> SessionABC:
        """One of the stores by its contender's name: "ours", "peer" (SQLiteSession),
        "relaxed" (synchronous=NORMAL), "sqlalchemy"."""
        opener = {
            "ours": self.django,
            "peer": self.sqlite,
            "relaxed": self.relaxed,
            "sqlalchemy": self.sqlalchemy,
        }[store]
        return opener(f"{self.prefix}{session_id}", fill)

    def close(self) -> None:
        if self._engine is not None:
            arun(self._engine.dispose())
            self._engine = None


def _rows_as_appended(conversation: Conversation, fill: int) -> Iterator[SessionItem]:
    """The rows `add_items` would have written for `items(fill)`: each with its message type,
    tool name and turn (a user message starts the next). Without them every row was in turn
    0 with no type, a conversation no append makes, and each pop took the path of an item
    before any user message (a second statement, for turn 0's usage)."""
    turn = 0
    for item in items(fill):
        message_type, tool_name = structure(item)
        turn += message_type == "user"
        yield SessionItem(
            conversation=conversation,
            payload=item,
            message_type=message_type,
            tool_name=tool_name,
            turn=turn,
        )


def _fill_sdk_tables(path: Any, session_id: str, fill: int) -> None:
    """The SDK's two stores share one schema: a session row and its messages."""
    if not fill:
        return
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO agent_sessions (session_id) VALUES (?)", (session_id,))
        db.executemany(
            "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
            ((session_id, json.dumps(item)) for item in items(fill)),
        )


def adding(session: SessionABC, batch: list[TResponseInputItem], count: int) -> Contender:
    return lambda: arun(atimed(lambda: session.add_items(batch), count))


def reading(session: SessionABC, count: int) -> Contender:
    return lambda: arun(atimed(lambda: session.get_items(limit=20), count))


def popping(session: SessionABC, count: int) -> Contender:
    return lambda: arun(atimed(session.pop_item, count))


def appends(
    stores: Stores, size: int, count: int, repeats: int, contenders: tuple[str, ...] = ALL
) -> dict[str, Samples]:
    """`add_items` of `size` items, `count` calls a repeat, into a growing conversation of
    each store named in `contenders`."""
    batch = items(size)
    return interleave(
        {name: adding(stores.open(name, f"add-{size}"), batch, count) for name in contenders},
        repeats,
    )


def reads(
    stores: Stores,
    sizes: tuple[int, ...],
    count: int,
    repeats: int,
    contenders: tuple[str, ...] = ("ours", "peer", "sqlalchemy"),
) -> dict[str, Samples]:
    """`get_items(limit=20)`, `count` calls a repeat, from a conversation of each size in
    each store named in `contenders`; the samples are named "<store>-<size>"."""
    return interleave(
        {
            f"{name}-{size}": reading(stores.open(name, f"get-{size}", fill=size), count)
            for size in sizes
            for name in contenders
        },
        repeats,
    )


def pops(
    stores: Stores, count: int, repeats: int, contenders: tuple[str, ...] = ALL
) -> dict[str, Samples]:
    """`pop_item`, `count` calls a repeat, from a conversation of each store named in
    `contenders` that has plenty."""
    needed = (repeats + 1) * count + 100
    return interleave(
        {name: popping(stores.open(name, "pop", fill=needed), count) for name in contenders},
        repeats,
    )


def run(config: Config) -> list[Row]:
    repeats = config.pick(3, 15)
    stores = Stores(config)
    rows: list[Row] = []

    # add_items: a batch of 1, 10, 100 items, appended to a growing conversation.
    for size, count in (
        (1, config.pick(10, 60)),
        (10, config.pick(8, 40)),
        (100, config.pick(3, 12)),
    ):
        samples = appends(stores, size, count, repeats)
        rows.append(_row(f"add_items({size})", samples, f"appending {size} item(s) in one call"))
        rows.append(_relaxed_row(f"add_items({size})", samples))
        rows.append(_sqlalchemy_row(f"add_items({size})", samples))

    # get_items(limit=20): the last 20 items, from ever longer conversations.
    sizes = config.pick((10, 1_000, 10_000), (10, 1_000, 100_000))
    samples = reads(stores, sizes, config.pick(10, 60), repeats)
    for size in sizes:
        rows.append(
            _row(
                f"get_items(limit=20), {size:,} items",
                {"ours": samples[f"ours-{size}"], "peer": samples[f"peer-{size}"]},
                f"reading the last 20 items of a {size:,}-item conversation",
            )
        )
        rows.append(
            _sqlalchemy_row(
                f"get_items(limit=20), {size:,} items",
                {"ours": samples[f"ours-{size}"], "sqlalchemy": samples[f"sqlalchemy-{size}"]},
            )
        )
    # Flatness compares reads that return the same 20 items: from the smallest conversation
    # that has 20 (a 10-item one returns half as many, which alone makes it faster).
    largest = sizes[-1]
    smallest = min(size for size in sizes if size >= 20)
    for who, label, goal in (("ours", "DjangoSession", FLAT), ("peer", "SQLiteSession", None)):
        rows.append(
            compared(
                BENCHMARK,
                f"{label}: get_items(limit=20) at {largest:,} ÷ at {smallest:,}",
                ops_per_second(samples[f"{who}-{largest}"]),
                ops_per_second(samples[f"{who}-{smallest}"]),
                ratio(samples[f"{who}-{largest}"], samples[f"{who}-{smallest}"]),
                f"how {label} slows as a conversation grows {largest // smallest:,}-fold, "
                f"reading the same 20 items (here 'peer' is the same store at {smallest:,} "
                "items); 1.00× is perfectly flat",
                goal,
            )
        )

    # pop_item: remove the newest item, from a conversation that has plenty.
    samples = pops(stores, config.pick(10, 40), repeats)
    rows.append(_row("pop_item()", samples, "removing and returning the newest item"))
    rows.append(_relaxed_row("pop_item()", samples))
    rows.append(_sqlalchemy_row("pop_item()", samples))
    stores.close()
    return rows


def _row(case: str, samples: dict[str, Samples], what: str) -> Row:
    return compared(
        BENCHMARK,
        case,
        ops_per_second(samples["ours"]),
        ops_per_second(samples["peer"]),
        ratio(samples["ours"], samples["peer"]),
        f"DjangoSession vs SQLiteSession, {what}: time per call, ours ÷ SQLiteSession's "
        "(below 1: DjangoSession is faster)",
        AS_FAST,
    )


def _relaxed_row(case: str, samples: dict[str, Samples]) -> Row:
    return _reference_row(
        f"{case}, vs SQLiteSession with synchronous=NORMAL",
        samples,
        "relaxed",
        "reference: the same calls against a SQLiteSession that, like agentsite's database, "
        "does not sync the disk at each commit; what remains is the cost of the store itself",
    )


def _sqlalchemy_row(case: str, samples: dict[str, Samples]) -> Row:
    return _reference_row(
        f"{case}, vs SQLAlchemySession (aiosqlite)",
        samples,
        "sqlalchemy",
        "the SDK's SQLAlchemy store on a SQLite file through aiosqlite (its defaults), the "
        "same calls: time per call, ours ÷ SQLAlchemySession's",
    )


def _reference_row(case: str, samples: dict[str, Samples], peer: str, meaning: str) -> Row:
    return compared(
        BENCHMARK,
        case,
        ops_per_second(samples["ours"]),
        ops_per_second(samples[peer]),
        ratio(samples["ours"], samples[peer]),
        meaning,
    )
