"""Compaction: the SDK's `OpenAIResponsesCompactionSession` over `DjangoSession`, atomically.

The SDK replaces a compacted suffix in one transaction only through a store's
`_get_compaction_snapshot` (its own `SQLiteSession` and `SQLAlchemySession` have one). Over any
other store it reads the history again after the compaction request and clears it: an item
written while the request was out was lost, and the encrypted session's items that do not
decrypt were deleted. `DjangoSession` has the hook; these are the SDK's own scenarios
(`tests/memory/test_compaction_suffix.py`, `tests/extensions/memory/test_encrypt_session.py` in
openai-agents-python) on our rows. The compaction API is faked (`FakeCompactionClient`): no
test reaches a model.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from agents import Agent, RunConfig, Runner
from agents.items import TResponseInputItem
from agents.memory import OpenAIResponsesCompactionSession, SessionSettings
from agents.memory.session import SessionABC
from agents.testing import ScriptedModel, assistant_message
from cryptography.fernet import Fernet
from django.conf import settings
from django.db import connection
from django.utils import timezone

from agentsite.db import faithful
from conversations.models import Conversation, SessionItem
from conversations.session import AuditedEncryptedSession, DjangoSession, compaction, open_session
from conversations.sql import statements

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY = {"type": "compaction", "id": "cmp_1", "encrypted_content": "the summary \x00"}
# A row whose payload does not decode: a faithful wrapper (agentsite/db/faithful.py) around
# text that is not JSON. Both databases store it; nothing can read it.
UNREADABLE = json.dumps({"__agentsite_json__": "{cut off in the midd"})


class FakeCompactionClient:
    """Stands in for `AsyncOpenAI` where the compaction session uses it: `responses.compact`
    records its arguments, awaits `during` while the request is "out", and answers `output`."""

    def __init__(
        self,
        output: list[dict[str, Any]] | None = None,
        during: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.responses = self
        self.output = [SUMMARY] if output is None else output
        self.during = during
        self.calls: list[dict[str, Any]] = []

    async def compact(self, **kwargs: Any) -> SimpleNamespace:
        self.calls.append(kwargs)
        if self.during is not None:
            await self.during()
        return SimpleNamespace(output=copy.deepcopy(self.output), usage=None)


def compacting(
    underlying: SessionABC, client: FakeCompactionClient, **kwargs: Any
) -> OpenAIResponsesCompactionSession:
    """The SDK's compaction session around `underlying`, compacting after every turn."""
    kwargs.setdefault("compaction_mode", "input")
    kwargs.setdefault("should_trigger_compaction", lambda _context: True)
    return OpenAIResponsesCompactionSession(
        underlying.session_id, underlying, client=cast(Any, client), **kwargs
    )


# The model's one answer in every turn, as the session stores it.
DONE = cast(dict[str, Any], assistant_message("done").model_dump(exclude_unset=True))
CONTINUE = {"role": "user", "content": "continue"}


async def run_turn(session: SessionABC, *, limit: int | None = None) -> None:
    """One turn through `session`: "continue", answered "done". `limit`: the model sees the
    newest `limit` items of the history only."""
    config = RunConfig(session_settings=SessionSettings(limit=limit)) if limit else None
    agent = Agent(name="worker", model=ScriptedModel([[assistant_message("done")]]))
    await Runner.run(agent, "continue", session=session, run_config=config)


def user(text: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "user", "content": text})


def assistant(text: str) -> TResponseInputItem:
    return cast(TResponseInputItem, {"role": "assistant", "content": text})


def _rows_of(session_id: str) -> list[tuple[int, Any]]:
    """A conversation's rows as (id, payload JSON), oldest first, read raw: an unreadable
    row is seen as it is stored."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.id, i.payload FROM conversations_sessionitem i "
            "JOIN conversations_conversation c ON c.id = i.conversation_id "
            "WHERE c.session_id = %s ORDER BY i.id",
            [session_id],
        )
        return [
            (pk, json.loads(payload) if isinstance(payload, str) else payload)
            for pk, payload in cursor.fetchall()
        ]


async def rows_of(session_id: str) -> list[tuple[int, Any]]:
    return await asyncio.to_thread(_rows_of, session_id)


def _store_raw(session_id: str, text: str) -> None:
    conversation = Conversation.objects.get(session_id=session_id)
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    branch = conversation.current_branch
    newest = SessionItem.objects.filter(conversation=conversation, branch=branch).order_by("-pk")
    turn = newest.values_list("turn", flat=True).first() or 0
    with connection.cursor() as cursor:
        cursor.execute(
            statements().insert_item, [conversation.pk, branch, turn, "other", None, text, now]
        )


async def store_raw(session_id: str, text: str) -> None:
    """A row written past `add_items`: what another program, or a bug, left there."""
    await asyncio.to_thread(_store_raw, session_id, text)


# --- the plain session ------------------------------------------------------------------------


async def test_it_replaces_the_compacted_suffix_and_keeps_the_older_history() -> None:
    history = [user(str(i)) for i in range(4)]
    backend = DjangoSession("suffix")
    await backend.add_items(history)
    client = FakeCompactionClient()

    await run_turn(compacting(backend, client), limit=1)

    # The model saw the newest item only: that, the input and the reply are compacted, and
    # the older items stay (the SDK's fallback cannot do this: it needs the whole history).
    assert [call["input"] for call in client.calls] == [[history[3], CONTINUE, DONE]]
    assert await backend.get_items() == [*history[:3], SUMMARY]  # U+0000 kept, on both


@pytest.mark.parametrize("limit", [None, 1], ids=["whole-history", "newest-items"])
async def test_an_append_while_the_compaction_request_is_out_survives(limit: int | None) -> None:
    history = [user(str(i)) for i in range(4)] if limit else []
    backend = DjangoSession("append")
    if history:
        await backend.add_items(history)
    newer = user("written by another run meanwhile")
    client = FakeCompactionClient(during=lambda: DjangoSession("append").add_items([newer]))

    await run_turn(compacting(backend, client), limit=limit)

    # The compacted items are no longer the newest: the replacement is refused, all is kept.
    assert len(client.calls) == 1
    assert await backend.get_items() == [*history, CONTINUE, DONE, newer]


async def test_a_pop_while_the_compaction_request_is_out_stands() -> None:
    backend = DjangoSession("pop")
    popped: list[Any] = []

    async def pop() -> None:
        popped.append(await DjangoSession("pop").pop_item())

    client = FakeCompactionClient(during=pop)

    await run_turn(compacting(backend, client))

    # The summary covers the popped reply, so it is not written over the pop.
    assert popped == [DONE] and len(client.calls) == 1
    assert await backend.get_items() == [CONTINUE]


async def test_an_unreadable_row_is_kept() -> None:
    # Runs read the two newest items: `get_items` itself fails on a row it cannot read.
    backend = DjangoSession("unreadable", session_settings=SessionSettings(limit=2))
    await backend.add_items([user("oldest")])
    await store_raw("unreadable", UNREADABLE)
    history = [user("asked"), assistant("answered")]
    await backend.add_items(history)
    before = await rows_of("unreadable")
    client = FakeCompactionClient()

    # The model sees the two newest items; the compaction reads one more: the unreadable row.
    await run_turn(compacting(backend, client))

    # Compacted: only what comes after the unreadable row; it and all before it are kept.
    assert [call["input"] for call in client.calls] == [[*history, CONTINUE, DONE]]
    after = await rows_of("unreadable")
    assert after[:2] == before[:2] and len(after) == 3
    assert await backend.get_items(limit=1) == [SUMMARY]


async def test_the_replacement_is_refused_whole_when_an_item_cannot_be_stored() -> None:
    history = [user(str(i)) for i in range(4)]
    backend = DjangoSession("nan")
    await backend.add_items(history)
    client = FakeCompactionClient(output=[{"type": "compaction", "score": float("nan")}])

    with pytest.raises(ValueError, match="NaN or Infinity"):
        await run_turn(compacting(backend, client), limit=1)

    # add_items' own refusal, inside the one transaction: nothing was deleted either.
    assert len(client.calls) == 1
    assert await backend.get_items() == [*history, CONTINUE, DONE]


async def test_a_partial_history_is_not_compacted_by_previous_response_id() -> None:
    backend = DjangoSession("chain")
    await backend.add_items([user(str(i)) for i in range(4)])
    client = FakeCompactionClient()

    await run_turn(compacting(backend, client, compaction_mode="previous_response_id"), limit=1)

    # A response chain summarizes older items too, which would stay: the SDK declines.
    assert client.calls == []
    assert len(await backend.get_items()) == 6


async def test_compaction_on_a_branch_replaces_that_branchs_items_only() -> None:
    backend = DjangoSession("branched")
    await backend.add_items([user("one"), assistant("1"), user("two"), assistant("2")])
    await backend.create_branch_from_turn(2, "edit")  # turn 1 copied, now current
    await backend.add_items([user("two again"), assistant("2 again")])

    snapshot = await backend._get_compaction_snapshot(10)
    assert snapshot is not None and snapshot.complete
    assert snapshot.items == [user("one"), assistant("1"), user("two again"), assistant("2 again")]
    assert await snapshot.replace_suffix(2, [cast(Any, SUMMARY)])

    assert await backend.get_items() == [user("one"), assistant("1"), SUMMARY]
    await backend.switch_to_branch("main")
    assert await backend.get_items() == [user("one"), assistant("1"), user("two"), assistant("2")]


def hold_the_replacement(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, ...]:
    """Compaction's replacement stops inside its transaction, the suffix deleted and the
    summary not yet written, until `release` is set; `inside` says it got there."""
    inside, release = threading.Event(), threading.Event()
    rows = compaction._item_rows

    def held_rows(texts: list[str], *args: Any) -> list[tuple[Any, ...]]:
        if texts and faithful.decode(json.loads(texts[0])).get("type") == "compaction":
            inside.set()
            assert release.wait(10)
        return rows(texts, *args)

    monkeypatch.setattr(compaction, "_item_rows", held_rows)
    return inside, release


async def test_an_append_waits_for_the_replacement_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = DjangoSession("locked")
    await backend.add_items([user("asked"), assistant("answered")])
    inside, release = hold_the_replacement(monkeypatch)
    snapshot = await backend._get_compaction_snapshot(10)
    assert snapshot is not None and snapshot.complete
    replacing = asyncio.ensure_future(snapshot.replace_suffix(0, [cast(Any, SUMMARY)]))
    try:
        assert await asyncio.to_thread(inside.wait, 10)
        appending = asyncio.create_task(DjangoSession("locked").add_items([user("newer")]))
        await asyncio.sleep(0.3)
        # It queues on the conversation's row lock (PostgreSQL), the write lock (SQLite).
        assert not appending.done()
    finally:
        release.set()
    assert await replacing is True
    await appending
    assert await backend.get_items() == [SUMMARY, user("newer")]


async def test_a_cancelled_turn_settles_its_replacement_before_a_newer_append(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = [user(str(i)) for i in range(4)]
    backend = DjangoSession("cancel")
    await backend.add_items(history)
    inside, release = hold_the_replacement(monkeypatch)
    session = compacting(backend, FakeCompactionClient())
    turn = asyncio.create_task(run_turn(session, limit=1))
    try:
        assert await asyncio.to_thread(inside.wait, 10)
        turn.cancel()
        appending = asyncio.create_task(session.add_items([user("newer")]))
        await asyncio.sleep(0.1)
        assert not appending.done()  # the compaction session's own lock
    finally:
        release.set()
    with pytest.raises(asyncio.CancelledError):
        await turn
    await appending
    # The transaction committed whole, then the append: nothing lost, nothing out of order.
    assert await backend.get_items() == [*history[:3], SUMMARY, user("newer")]


async def test_without_the_hook_the_sdk_would_lose_the_append(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the SDK's fallback for a store without the hook, on the scenario above."""
    monkeypatch.delattr(DjangoSession, "_get_compaction_snapshot")
    backend = DjangoSession("fallback")
    newer = user("written by another run meanwhile")
    client = FakeCompactionClient(during=lambda: DjangoSession("fallback").add_items([newer]))

    await run_turn(compacting(backend, client))

    assert await backend.get_items() == [SUMMARY]  # `newer` is gone


# --- through encryption (open_session with a key) -------------------------------------------


def encrypted_compacting(
    session_id: str, client: FakeCompactionClient, order: str
) -> tuple[SessionABC, AuditedEncryptedSession]:
    """The session a run gets, and its encryption: compaction around `open_session` (what
    the site would build), or the SDK's documented order, encryption around compaction."""
    encrypted = open_session(session_id)
    assert isinstance(encrypted, AuditedEncryptedSession)
    if order == "compaction-outside":
        return compacting(encrypted, client), encrypted
    outer = AuditedEncryptedSession(
        session_id,
        compacting(encrypted.underlying_session, client),
        settings.AGENTSITE_SESSION_ENCRYPTION_KEY,
        ttl=encrypted.ttl,
    )
    return outer, outer


ORDERS = ["compaction-outside", "encryption-outside"]


def decrypted(encrypted: AuditedEncryptedSession, rows: list[tuple[int, Any]]) -> list[Any]:
    """The items of raw `rows`, decrypted directly (not through `get_items`)."""
    return [json.loads(encrypted.cipher.decrypt(row["payload"].encode())) for _, row in rows]


@pytest.mark.parametrize("order", ORDERS)
async def test_through_encryption_an_append_while_compacting_survives(
    encryption_key: str, order: str
) -> None:
    newer = user("written by another run meanwhile")
    client = FakeCompactionClient(during=lambda: open_session("enc").add_items([newer]))
    session, encrypted = encrypted_compacting("enc", client, order)

    await run_turn(session)

    assert len(client.calls) == 1
    assert await encrypted.get_items() == [CONTINUE, DONE, newer]
    rows = await rows_of("enc")
    assert all(payload.get("__enc__") == 1 for _, payload in rows)  # no plaintext written


@pytest.mark.parametrize("order", ORDERS)
async def test_through_encryption_an_item_that_does_not_decrypt_is_kept(
    encryption_key: str, order: str
) -> None:
    await open_session("foreign").add_items([user("oldest")])
    await AuditedEncryptedSession(
        "foreign", DjangoSession("foreign"), Fernet.generate_key().decode()
    ).add_items([user("under another key")])
    history = [user("asked"), assistant("answered")]
    await open_session("foreign").add_items(history)
    before = await rows_of("foreign")
    client = FakeCompactionClient()
    session, encrypted = encrypted_compacting("foreign", client, order)

    await run_turn(session)

    # The model saw all it could read; only what follows the foreign item is compacted.
    assert [call["input"] for call in client.calls] == [[*history, CONTINUE, DONE]]
    after = await rows_of("foreign")
    assert after[:2] == before[:2]  # the oldest item and the foreign one, untouched
    assert decrypted(encrypted, after[2:]) == [SUMMARY]
    assert encrypted.unreadable_seen > 0  # and it was reported, not silently skipped


@pytest.mark.parametrize("order", ORDERS)
async def test_through_encryption_an_expired_prefix_is_pruned_up_to_an_unreadable_item(
    encryption_key: str, order: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AGENTSITE_SESSION_TTL = 10
    clock = [1_000.0]
    monkeypatch.setattr("cryptography.fernet.time.time", lambda: clock[0])
    encrypted_store = open_session("ttl")
    await encrypted_store.add_items([user("expired 1"), user("expired 2")])
    await AuditedEncryptedSession(
        "ttl", DjangoSession("ttl"), Fernet.generate_key().decode()
    ).add_items([user("under another key")])
    await encrypted_store.add_items([user("expired 3")])
    clock[0] += 20
    live = [user("live"), assistant("still live")]
    await encrypted_store.add_items(live)
    before = await rows_of("ttl")
    client = FakeCompactionClient()
    session, encrypted = encrypted_compacting("ttl", client, order)

    await run_turn(session)

    assert [call["input"] for call in client.calls] == [[*live, CONTINUE, DONE]]
    after = await rows_of("ttl")
    # The two oldest (expired) rows are pruned; the one that does not decrypt stops the
    # pruning and is kept; the expired row after it went with the replaced suffix.
    assert after[0] == before[2]
    assert decrypted(encrypted, after[1:]) == [SUMMARY]


async def test_without_the_hook_the_sdk_would_delete_an_item_that_does_not_decrypt(
    encryption_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the SDK's fallback, through encryption, on the scenario above."""
    monkeypatch.delattr(DjangoSession, "_get_compaction_snapshot")
    await AuditedEncryptedSession(
        "lost", DjangoSession("lost"), Fernet.generate_key().decode()
    ).add_items([user("under another key")])
    await open_session("lost").add_items([user("asked")])
    client = FakeCompactionClient()
    session, encrypted = encrypted_compacting("lost", client, "compaction-outside")

    await run_turn(session)

    assert decrypted(encrypted, await rows_of("lost")) == [SUMMARY]  # the foreign item is gone
