"""DjangoSession: the SDK's Session protocol on Django models."""

from __future__ import annotations

import asyncio
import threading

import pytest
from agents import Agent, Runner, function_tool
from agents.memory.session_settings import SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations.models import Conversation, SessionItem
from conversations.session import DjangoSession
from tests.factories import make_user, user_message

pytestmark = pytest.mark.django_db(transaction=True)


async def test_it_creates_the_conversation_on_first_use() -> None:
    session = DjangoSession("support_ticket_456", agent_name="support")
    assert await session.get_items() == []
    assert not await Conversation.objects.filter(session_id="support_ticket_456").aexists()

    await session.add_items([user_message("hello")])

    conversation = await Conversation.objects.aget(session_id="support_ticket_456")
    assert conversation.agent_name == "support"
    assert await session.get_items() == [user_message("hello")]
    item = await SessionItem.objects.aget(conversation=conversation)
    assert item.payload == user_message("hello")
    assert abs((timezone.now() - item.created).total_seconds()) < 60


async def test_it_records_the_owner_given_at_creation() -> None:
    alice = await asyncio.to_thread(make_user, username="alice")
    await DjangoSession("owned", owner=alice).add_items([user_message("hi")])
    conversation = await Conversation.objects.select_related("owner").aget(session_id="owned")
    assert conversation.owner == alice


async def test_it_returns_the_last_n_items_in_chronological_order() -> None:
    session = DjangoSession("s")
    await session.add_items([user_message(str(i)) for i in range(10)])

    assert [i["content"] for i in await session.get_items(limit=3)] == ["7", "8", "9"]
    assert await session.get_items(limit=0) == []
    assert len(await session.get_items(limit=100)) == 10
    assert [i["content"] for i in await session.get_items()][:2] == ["0", "1"]


async def test_it_uses_the_session_settings_limit_by_default() -> None:
    session = DjangoSession("s", session_settings=SessionSettings(limit=2))
    await session.add_items([user_message(str(i)) for i in range(5)])
    assert [i["content"] for i in await session.get_items()] == ["3", "4"]
    assert len(await session.get_items(limit=4)) == 4


async def test_it_pops_the_newest_item_and_none_when_empty() -> None:
    session = DjangoSession("s")
    assert await session.pop_item() is None
    await session.add_items([user_message("a"), user_message("b")])
    assert await session.pop_item() == user_message("b")
    assert await session.get_items() == [user_message("a")]


async def test_it_clears_items_but_keeps_the_conversation() -> None:
    session = DjangoSession("s")
    await session.add_items([user_message("a")])
    await session.clear_session()
    assert await session.get_items() == []
    assert await Conversation.objects.filter(session_id="s").aexists()
    await session.add_items([user_message("b")])
    assert await session.get_items() == [user_message("b")]


async def test_it_never_leaks_items_between_sessions() -> None:
    one, two = DjangoSession("one"), DjangoSession("two")
    await one.add_items([user_message("for one")])
    await two.add_items([user_message("for two")])
    await one.pop_item()
    assert await one.get_items() == []
    assert await two.get_items() == [user_message("for two")]
    await two.clear_session()
    await one.add_items([user_message("again")])
    assert await two.get_items() == []


async def test_it_recreates_a_conversation_deleted_under_it() -> None:
    session = DjangoSession("s")
    await session.add_items([user_message("a")])
    await Conversation.objects.filter(session_id="s").adelete()
    await session.add_items([user_message("b")])
    assert await session.get_items() == [user_message("b")]


async def test_a_fresh_object_sees_what_another_wrote() -> None:
    await DjangoSession("s").add_items([user_message("a")])
    assert await DjangoSession("s").get_items() == [user_message("a")]
    assert await DjangoSession("s").pop_item() == user_message("a")


def test_it_reads_the_last_n_items_in_one_indexed_query() -> None:
    conversation = Conversation.objects.create(session_id="long")
    SessionItem.objects.bulk_create(
        SessionItem(conversation=conversation, payload=user_message(str(i))) for i in range(3000)
    )
    # Newer items of many other conversations: walking all items newest-first would be slow.
    others = [Conversation.objects.create(session_id=f"other{n}") for n in range(30)]
    SessionItem.objects.bulk_create(
        SessionItem(conversation=other, payload=user_message("x"))
        for _ in range(300)
        for other in others
    )
    session = DjangoSession("long")

    # Run in this thread, so the queries are seen on this connection. On SQLite the read goes
    # straight to the driver's connection, so SQLite itself reports what it executes.
    statements: list[str] = []
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        connection.connection.set_trace_callback(statements.append)
        try:
            items = session._get_items_sync(20)
        finally:
            connection.connection.set_trace_callback(None)
    else:
        with CaptureQueriesContext(connection) as queries:
            items = session._get_items_sync(20)
        statements = [query["sql"] for query in queries.captured_queries]
    assert [i["content"] for i in items] == [str(i) for i in range(2980, 3000)]
    assert len(statements) == 1, statements

    sql = statements[0]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE conversations_sessionitem")
            cursor.execute(f"EXPLAIN {sql}")
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        plan = "\n".join(str(row[0] if len(row) == 1 else row) for row in cursor.fetchall())
    # The planner walks the (conversation, branch, id) index: no scan of the table, no sort
    # step (on PostgreSQL, not the primary key newest-first either: conversations/sql.py).
    assert "item_conv_branch_id" in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan
    assert "SCAN conversations_sessionitem" not in plan
    assert "Seq Scan on conversations_sessionitem" not in plan


def test_ten_concurrent_writers_keep_each_batch_contiguous_and_ordered() -> None:
    writers, batches, batch_size = 10, 15, 6
    start = threading.Barrier(writers)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        async def write() -> None:
            session = DjangoSession("shared")  # each writer its own object, loop, connection
            start.wait()
            for b in range(batches):
                await session.add_items(
                    [{"role": "user", "content": f"{w}:{b}:{i}"} for i in range(batch_size)]
                )

        try:
            asyncio.run(write())
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    items = asyncio.run(DjangoSession("shared").get_items())
    labels = [tuple(map(int, item["content"].split(":"))) for item in items]
    assert len(labels) == writers * batches * batch_size
    assert Conversation.objects.filter(session_id="shared").count() == 1
    # Cut the history into batches: each must be one writer's batch, whole and in order.
    seen_per_writer: dict[int, list[int]] = {}
    for start_index in range(0, len(labels), batch_size):
        chunk = labels[start_index : start_index + batch_size]
        w, b = chunk[0][0], chunk[0][1]
        assert chunk == [(w, b, i) for i in range(batch_size)]
        seen_per_writer.setdefault(w, []).append(b)
    assert seen_per_writer == {w: list(range(batches)) for w in range(writers)}


@function_tool
def get_city(landmark: str) -> str:
    """Which city a landmark is in."""
    return "San Francisco"


async def test_a_second_turn_sees_the_first_through_the_session() -> None:
    model = ScriptedModel(
        [
            [function_call("get_city", {"landmark": "Golden Gate Bridge"}, call_id="call_1")],
            [assistant_message("It is in San Francisco.", item_id="msg_1")],
            [assistant_message("California.", item_id="msg_2")],
        ]
    )
    agent = Agent(name="Guide", instructions="Answer briefly.", model=model, tools=[get_city])
    session = DjangoSession("support_ticket_456")

    first = await Runner.run(agent, "What city is the Golden Gate Bridge in?", session=session)
    second = await Runner.run(agent, "What state is it in?", session=session)

    assert first.final_output == "It is in San Francisco."
    assert second.final_output == "California."
    model.assert_complete()
    sent = model.last_call.input
    assert isinstance(sent, list)
    texts = [item.get("content") for item in sent if item.get("role") == "user"]
    assert texts == ["What city is the Golden Gate Bridge in?", "What state is it in?"]
    assert any(item.get("type") == "function_call_output" for item in sent)
    assert any(
        item.get("role") == "assistant" and "San Francisco" in str(item.get("content"))
        for item in sent
    )
    # Stored: user, tool call, tool output, reply; then user, reply.
    stored = await session.get_items()
    assert len(stored) == 6
    assert stored[-1]["role"] == "assistant"


@pytest.mark.parametrize("size", [1, 2, 3, 63, 64, 65, 100, 130])
async def test_a_batch_of_any_size_is_stored_in_order_numbered_and_typed(size: int) -> None:
    # SQLite writes a batch in statements of 64, 32, ..., 1 rows: every size reads back whole.
    session = DjangoSession(f"batch-{size}")
    await session.add_items([user_message("before")])
    await session.add_items([user_message("known")])  # the cached conversation from here on
    batch = [
        user_message(f"u{n}") if n % 3 == 0 else {"type": "function_call_output", "output": n}
        for n in range(size)
    ]
    await session.add_items(batch)

    assert await session.get_items() == [user_message("before"), user_message("known"), *batch]
    rows = [
        (row.turn, row.message_type, row.payload)
        async for row in SessionItem.objects.filter(conversation__session_id=f"batch-{size}")
        .order_by("id")
        .only("turn", "message_type", "payload")
    ]
    turn, expected = 2, []
    for item in batch:
        turn += item.get("role") == "user"
        kind = "user" if item.get("role") == "user" else "function_call_output"
        expected.append((turn, kind, item))
    assert rows[2:] == expected
