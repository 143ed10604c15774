"""DjangoSession's branches and usage: the cases the differential test meets by chance, held
on purpose, and what is the site's own (the branch kept on the conversation, a run's
session on its own branch, encryption at rest, the migration of items stored before)."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from agents.usage import Usage
from cryptography.fernet import Fernet
from django.db import connection, connections, transaction

from conversations.models import Branch, Conversation, SessionItem, TurnUsage
from conversations.session import (
    AuditedEncryptedSession,
    DjangoSession,
    branching,
    open_session,
)
from tests.factories import user_message
from tests.migrations import latest, migrate

pytestmark = pytest.mark.django_db(transaction=True)


def reply(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def call(name: str, call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


async def three_turns(session: Any) -> None:
    """turn 1: a question and its reply; turn 2: one with a tool call; turn 3: a third."""
    await session.add_items([user_message("first"), reply("one")])
    await session.add_items(
        [
            user_message("second"),
            call("lookup_order", "c1"),
            {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
            reply("two"),
        ]
    )
    await session.add_items([user_message("third"), reply("three")])


def texts(items: list[Any]) -> list[str]:
    return [
        item["content"] if isinstance(item.get("content"), str) else item["content"][0]["text"]
        for item in items
        if item.get("role") in ("user", "assistant")
    ]


def result_with(tokens: int) -> Any:
    usage = Usage(requests=1, input_tokens=tokens, output_tokens=5, total_tokens=tokens + 5)
    return SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage))


async def test_a_branch_from_turn_1_starts_empty_and_its_first_message_is_turn_1() -> None:
    session = DjangoSession("s")
    await three_turns(session)

    branch = await session.create_branch_from_turn(1, "retry")

    assert branch == "retry"
    assert await session.current_branch_id() == "retry"
    assert await session.get_items() == []
    # A branch with no item yet is not listed, as in the SDK.
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
    await session.add_items([user_message("first, again"), reply("one again")])
    assert [t["turn"] for t in await session.get_conversation_turns()] == [1]
    listed = {b["branch_id"]: b for b in await session.list_branches()}
    assert listed["retry"]["is_current"] and not listed["main"]["is_current"]
    assert listed["retry"]["user_turns"] == 1 and listed["main"]["user_turns"] == 3


async def test_a_branch_from_the_last_turn_keeps_every_turn_before_it() -> None:
    session = DjangoSession("s")
    await three_turns(session)

    await session.create_branch_from_turn(3)

    assert texts(await session.get_items()) == ["first", "one", "second", "two"]
    assert await session.get_conversation_by_turns() == {
        1: [{"type": "user", "tool_name": None}, {"type": "assistant", "tool_name": None}],
        2: [
            {"type": "user", "tool_name": None},
            {"type": "function_call", "tool_name": "lookup_order"},
            {"type": "function_call_output", "tool_name": None},
            {"type": "assistant", "tool_name": None},
        ],
    }
    assert await session.get_tool_usage() == [("lookup_order", 1, 2)]
    # The original is untouched.
    assert texts(await session.get_items(branch_id="main"))[-2:] == ["third", "three"]


@pytest.mark.parametrize("turn", [0, 4, -1, 10**12])
async def test_a_turn_that_does_not_exist_is_a_clear_error_and_changes_nothing(
    turn: Any,
) -> None:
    session = DjangoSession("s")
    await three_turns(session)

    with pytest.raises(ValueError, match=f"Turn {turn} does not contain a user message"):
        await session.create_branch_from_turn(turn)

    assert await session.current_branch_id() == "main"
    assert await asyncio.to_thread(Branch.objects.count) == 0
    assert len(await session.get_items()) == 8


async def test_deleting_main_or_the_current_branch_is_refused_as_the_sdk_does() -> None:
    session = DjangoSession("s")
    await three_turns(session)
    await session.create_branch_from_turn(2, "edit")
    await session.add_items([user_message("second, edited")])

    with pytest.raises(ValueError, match="Cannot delete the 'main' branch"):
        await session.delete_branch("main")
    with pytest.raises(ValueError, match="Cannot delete current branch 'edit'"):
        await session.delete_branch("edit")
    with pytest.raises(ValueError, match="Branch ID cannot be empty"):
        await session.delete_branch("  ")
    assert await session.current_branch_id() == "edit"

    await session.delete_branch("edit", force=True)

    assert await session.current_branch_id() == "main"
    assert [b["branch_id"] for b in await session.list_branches()] == ["main"]
    # Its id stays used, as in the SDK.
    with pytest.raises(ValueError, match="Branch ID 'edit' has already been used"):
        await session.create_branch_from_turn(2, "edit")


async def test_the_current_branch_lives_on_the_conversation() -> None:
    await three_turns(DjangoSession("s"))
    await DjangoSession("s").create_branch_from_turn(2, "edit")

    # The next request's session goes on where the last one switched.
    later = DjangoSession("s")
    assert await later.current_branch_id() == "edit"
    await later.add_items([user_message("second, edited")])
    assert texts(await DjangoSession("s").get_items()) == ["first", "one", "second, edited"]
    conversation = await Conversation.objects.aget(session_id="s")
    assert conversation.current_branch == "edit"


async def test_a_session_given_a_branch_keeps_it_when_the_conversation_switches() -> None:
    await three_turns(DjangoSession("s"))
    run_session = DjangoSession("s", branch="main")  # a run started on main
    await DjangoSession("s").create_branch_from_turn(2, "edit")

    await run_session.add_items([reply("still on main")])

    assert texts(await DjangoSession("s").get_items(branch_id="main"))[-1] == "still on main"
    assert await DjangoSession("s").get_items() == [user_message("first"), reply("one")]
    assert await run_session.current_branch_id() == "main"


async def test_a_turns_usage_is_replaced_and_goes_with_the_turn() -> None:
    session = DjangoSession("s")
    await three_turns(session)
    await session.store_run_usage(result_with(100))  # a paused run's usage so far
    await session.store_run_usage(result_with(250))  # the whole, when it completed

    assert await session.get_turn_usage(3) == {
        "requests": 1,
        "input_tokens": 250,
        "output_tokens": 5,
        "total_tokens": 255,
        "input_tokens_details": {
            "cache_write_tokens": 0,
            "cached_tokens": 0,
            "cache_write_tokens_details": None,
        },
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    assert (await session.get_session_usage() or {})["total_turns"] == 1

    await session.pop_item()  # its reply: the turn is still there
    assert await session.get_turn_usage(3) != {}
    await session.pop_item()  # its message: the turn is gone, and its usage with it
    assert await session.get_turn_usage(3) == {}
    assert await session.get_session_usage() is None


async def test_usage_is_stored_in_the_current_branch_and_summed_per_branch() -> None:
    session = DjangoSession("s")
    await three_turns(session)
    await session.store_run_usage(result_with(100))
    await session.create_branch_from_turn(2, "edit")
    await session.add_items([user_message("second, edited"), reply("two again")])
    await session.store_run_usage(result_with(40))

    assert await session.get_session_usage("edit") == {
        "requests": 1,
        "input_tokens": 40,
        "output_tokens": 5,
        "total_tokens": 45,
        "total_turns": 1,
    }
    assert (await session.get_session_usage() or {})["input_tokens"] == 140
    assert [row["user_turn_number"] for row in await session.get_turn_usage()] == [2]
    assert [row["user_turn_number"] for row in await session.get_turn_usage(None, "main")] == [3]


async def test_clear_empties_every_branch_and_goes_back_to_main_keeping_ids_used() -> None:
    session = DjangoSession("s")
    await three_turns(session)
    await session.create_branch_from_turn(2, "edit")
    await session.store_run_usage(result_with(10))

    await session.clear_session()

    assert await session.current_branch_id() == "main"
    assert await session.list_branches() == []
    assert await asyncio.to_thread(TurnUsage.objects.count) == 0
    await session.add_items([user_message("new start")])
    with pytest.raises(ValueError, match="already been used"):
        await session.create_branch_from_turn(1, "edit")


async def test_a_branch_name_the_database_cannot_hold_is_refused() -> None:
    session = DjangoSession("s")
    await three_turns(session)
    for name in ["x" * 101, "nul\x00", "half\ud800"]:
        with pytest.raises(ValueError, match="cannot be used"):
            await session.create_branch_from_turn(2, name)
        with pytest.raises(ValueError, match="does not exist"):
            await session.switch_to_branch(name)
        assert await session.get_items(branch_id=name) == []
    assert await session.current_branch_id() == "main"


async def test_items_any_database_cannot_hold_as_jsonb_are_copied_faithfully() -> None:
    session = DjangoSession("s")
    odd = user_message("nul \x00 and half \ud800")
    await session.add_items([odd, reply("ok")])
    await session.add_items([user_message("again")])

    await session.create_branch_from_turn(2, "edit")

    assert await session.get_items() == [odd, reply("ok")]
    found = await session.find_turns_by_content("\x00 and")
    assert [turn["turn"] for turn in found] == [1]


async def test_a_generated_id_names_the_turn_and_the_time_and_is_never_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conversations.session import branches

    monkeypatch.setattr(branches, "time", SimpleNamespace(time=lambda: 1_800_000_000.5))
    session = DjangoSession("s")
    await three_turns(session)

    first = await session.create_branch_from_turn(2)
    await session.switch_to_branch("main")
    second = await session.create_branch_from_turn(2)

    assert (first, second) == ("branch_from_turn_2_1800000000", "branch_from_turn_2_1800000000_2")


# --- encrypted ------------------------------------------------------------------------------


def stored_payloads() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM conversations_sessionitem")
        return [str(row[0]) for row in cursor.fetchall()]


async def test_an_encrypted_session_branches_with_its_text_encrypted(encryption_key: str) -> None:
    session = open_session("secret")
    assert isinstance(session, AuditedEncryptedSession)
    await three_turns(session)

    # Reached through the helper, and through the wrapper itself (the SDK's passes on what
    # it does not know).
    branches = branching(session)
    assert isinstance(branches, DjangoSession)
    assert [t["full_content"] for t in await branches.get_conversation_turns()] == [
        "first",
        "second",
        "third",
    ]
    found = await session.find_turns_by_content("SECOND")
    assert [turn["turn"] for turn in found] == [2]
    assert await session.create_branch_from_content("third", "edit") == "edit"
    await session.add_items([user_message("third, edited"), reply("edited")])

    assert texts(await session.get_items()) == [
        "first",
        "one",
        "second",
        "two",
        "third, edited",
        "edited",
    ]
    assert await branches.get_tool_usage() == [("lookup_order", 1, 2)]
    payloads = await asyncio.to_thread(stored_payloads)
    assert not any("first" in p or "third" in p or "lookup_order" in p for p in payloads)
    kinds = await asyncio.to_thread(
        lambda: list(
            SessionItem.objects.filter(branch="edit").values_list("message_type", flat=True)
        )
    )
    assert kinds[0] == "user" and "function_call" in kinds


async def test_a_message_that_does_not_decrypt_is_left_out_of_turn_listings(
    encryption_key: str, settings: Any
) -> None:
    await three_turns(open_session("secret"))
    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()  # a new key

    session = open_session("secret")

    assert await branching(session).get_conversation_turns() == []
    # The structure needs no key: the turns are still there to branch from.
    assert await branching(session).create_branch_from_turn(3, "edit") == "edit"
    assert session.unreadable_seen == 3  # type: ignore[attr-defined]


# --- the migration --------------------------------------------------------------------------


def test_the_migration_places_items_stored_before_branches(settings: Any) -> None:
    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()
    old = migrate([("conversations", "0003_faithful_json")])
    try:
        conversation = old.get_model("conversations", "Conversation").objects.create(
            session_id="old"
        )
        encrypted = AuditedEncryptedSession(
            session_id="old",
            underlying_session=DjangoSession("old"),
            encryption_key=settings.AGENTSITE_SESSION_ENCRYPTION_KEY,
        )
        rows = [
            {"role": "system", "content": "be brief"},
            user_message("plain"),
            call("lookup_order", "c1"),
            encrypted._wrap(user_message("secret")),
            encrypted._wrap(reply("secret reply")),
            {"__enc__": 1, "v": 1, "kid": "hkdf-v1", "payload": "not a token"},
        ]
        items = old.get_model("conversations", "SessionItem")
        for payload in rows:
            items.objects.create(conversation=conversation, payload=payload)

        migrate([("conversations", "0004_branches")])
    finally:
        latest()

    placed = list(
        SessionItem.objects.filter(conversation__session_id="old")
        .order_by("id")
        .values_list("branch", "turn", "message_type", "tool_name")
    )
    assert placed == [
        ("main", 0, "other", None),
        ("main", 1, "user", None),
        ("main", 1, "function_call", "lookup_order"),
        ("main", 2, "user", None),
        ("main", 2, "assistant", None),
        ("main", 2, "other", None),
    ]


# --- writers of one conversation -------------------------------------------------------------


def test_an_append_that_waited_for_another_s_lock_numbers_its_turn_after_it() -> None:
    """The second of two appends waits on the conversation's lock; the turn it numbers from
    must be read once it has the lock. (On PostgreSQL the newest turn was read in the locking
    UPDATE's RETURNING, whose subquery keeps the snapshot taken before the wait: it did not
    see the first append's items, and both appends made turn 2. The full suite on a fresh
    clone failed the test below on it, 2 runs in 15 alone.)"""
    asyncio.run(DjangoSession("waiting").add_items([user_message("first"), reply("first")]))
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first() -> None:
        try:
            with transaction.atomic():
                DjangoSession("waiting")._add_items_sync([user_message("second"), reply("second")])
                holding.set()
                release.wait(10)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def second() -> None:
        try:
            asyncio.run(DjangoSession("waiting").add_items([user_message("third"), reply("third")]))
        except BaseException as exc:
            errors.append(exc)

    holder = threading.Thread(target=first)
    holder.start()
    assert holding.wait(10)
    waiter = threading.Thread(target=second)
    waiter.start()
    if connection.vendor == "postgresql":
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        for _ in range(200):
            with connection.cursor() as cursor:
                cursor.execute(waiting)
                if cursor.fetchone()[0]:
                    break
            time.sleep(0.01)
        else:
            raise AssertionError("the second append never waited for the lock")
    else:
        time.sleep(0.3)  # SQLite: it waits for the database's write lock
    release.set()
    holder.join()
    waiter.join()
    assert errors == []

    session = DjangoSession("waiting")
    turns = asyncio.run(session.get_conversation_turns("main"))
    assert [(t["turn"], t["content"]) for t in turns] == [
        (1, "first"),
        (2, "second"),
        (3, "third"),
    ]


def test_a_fork_among_concurrent_appends_copies_whole_turns_and_appends_stay_whole() -> None:
    asyncio.run(three_turns(DjangoSession("shared")))
    writers, batches = 4, 6
    start = threading.Barrier(writers + 1)
    errors: list[BaseException] = []

    def writer(w: int) -> None:
        async def write() -> None:
            session = DjangoSession("shared")
            start.wait()
            for b in range(batches):
                await session.add_items([user_message(f"{w}:{b}"), reply(f"{w}:{b}")])

        try:
            asyncio.run(write())
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    def forker() -> None:
        async def fork() -> None:
            start.wait()
            await DjangoSession("shared").create_branch_from_turn(2, "edit")

        try:
            asyncio.run(fork())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    threads.append(threading.Thread(target=forker))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    session = DjangoSession("shared")
    main = asyncio.run(session.get_items(branch_id="main"))
    edit = asyncio.run(session.get_items(branch_id="edit"))
    assert edit[:2] == main[:2]  # turn 1 only, copied whole, then what came after the fork
    assert all(item.get("content") not in ("second", "third") for item in edit)
    # Every append landed whole, on one branch: a message with its reply right after it.
    appended = main[8:] + edit[2:]
    assert len(appended) == writers * batches * 2
    for n in range(0, len(appended), 2):
        assert appended[n]["content"] == appended[n + 1]["content"][0]["text"]
    turns = asyncio.run(session.get_conversation_turns("main"))
    assert [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
