"""Encryption at rest: the SDK's EncryptedSession around DjangoSession, minus silent loss."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from agents.extensions.memory import EncryptedSession
from cryptography.fernet import Fernet
from django.db import connection

from conversations.models import Conversation, SessionItem
from conversations.session import (
    AuditedEncryptedSession,
    DjangoSession,
    UnreadableSessionItem,
    open_session,
    unreadable_item_counts,
)

pytestmark = pytest.mark.django_db(transaction=True)

CANARY = "my card is 4111 1111 1111 1111, call me at +1 415 555 0100"


def raw_rows() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload FROM conversations_sessionitem")
        return [row[0] for row in cursor.fetchall()]


def test_it_is_a_plain_django_session_without_a_key(settings: Any) -> None:
    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = ""
    assert type(open_session("s")) is DjangoSession


async def test_the_database_holds_no_plaintext(encryption_key: str) -> None:
    session = open_session("secret")
    assert isinstance(session, AuditedEncryptedSession)
    await session.add_items([{"role": "user", "content": CANARY}])

    assert await session.get_items() == [{"role": "user", "content": CANARY}]
    rows = await asyncio.to_thread(raw_rows)
    assert len(rows) == 1
    assert "4111" not in rows[0] and "555" not in rows[0] and "card" not in rows[0]
    assert '"__enc__": 1' in rows[0] or '"__enc__":1' in rows[0]


async def test_history_older_than_ten_minutes_is_still_returned(
    encryption_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    two_days_ago = time.time() - 2 * 24 * 3600
    monkeypatch.setattr("cryptography.fernet.time.time", lambda: two_days_ago)
    await open_session("old").add_items([{"role": "user", "content": "from two days ago"}])
    monkeypatch.undo()

    assert await open_session("old").get_items() == [
        {"role": "user", "content": "from two days ago"}
    ]
    # The SDK's default TTL of ten minutes would have hidden it without a word.
    sdk_default = EncryptedSession("old", DjangoSession("old"), encryption_key)
    assert await sdk_default.get_items() == []


async def test_a_ttl_set_on_purpose_is_honoured(
    encryption_key: str, settings: Any, monkeypatch
) -> None:
    settings.AGENTSITE_SESSION_TTL = 3600
    two_hours_ago = time.time() - 2 * 3600
    monkeypatch.setattr("cryptography.fernet.time.time", lambda: two_hours_ago)
    await open_session("ttl").add_items([{"role": "user", "content": "old"}])
    monkeypatch.undo()
    await open_session("ttl").add_items([{"role": "user", "content": "new"}])

    session = open_session("ttl")
    assert await session.get_items() == [{"role": "user", "content": "new"}]
    assert isinstance(session, AuditedEncryptedSession)
    assert session.unreadable_seen == 0  # expired on purpose is not "unreadable"


async def test_an_item_that_fails_to_decrypt_is_logged_and_counted(
    encryption_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = open_session("mixed")
    await good.add_items([{"role": "user", "content": "readable one"}])
    other_key = AuditedEncryptedSession(
        "mixed", DjangoSession("mixed"), Fernet.generate_key().decode()
    )
    await other_key.add_items([{"role": "user", "content": "under another key"}])
    # A row written before encryption was turned on.
    await DjangoSession("mixed").add_items([{"role": "user", "content": "plaintext"}])
    await good.add_items([{"role": "user", "content": "readable two"}])
    before = unreadable_item_counts().get("mixed", 0)

    with caplog.at_level(logging.WARNING, logger="conversations.session"):
        items = await good.get_items()

    assert [i["content"] for i in items] == ["readable one", "readable two"]
    assert isinstance(good, AuditedEncryptedSession)
    assert good.unreadable_seen == 2
    assert unreadable_item_counts()["mixed"] - before == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert all("mixed" in w for w in warnings)
    assert any("does not decrypt" in w for w in warnings)
    assert any("not encrypted" in w for w in warnings)
    # Nothing was deleted: the operator can still recover the rows with the right key.
    assert await SessionItem.objects.acount() == 4


async def test_pop_refuses_to_remove_an_unreadable_item(encryption_key: str) -> None:
    session = open_session("pop")
    await session.add_items([{"role": "user", "content": "keep me"}])
    await AuditedEncryptedSession(
        "pop", DjangoSession("pop"), Fernet.generate_key().decode()
    ).add_items([{"role": "user", "content": "foreign"}])

    with pytest.raises(UnreadableSessionItem, match="cannot be decrypted"):
        await session.pop_item()
    assert await SessionItem.objects.acount() == 2


async def test_pop_returns_the_decrypted_newest_item(encryption_key: str) -> None:
    session = open_session("pop2")
    await session.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert await session.pop_item() == {"role": "user", "content": "b"}
    assert await session.get_items() == [{"role": "user", "content": "a"}]
    assert await Conversation.objects.filter(session_id="pop2").aexists()


async def test_an_unreadable_item_raises_what_the_sdks_encrypted_session_raises(
    encryption_key: str, tmp_path: Any
) -> None:
    """Code written for the SDK's EncryptedSession catches `InvalidToken`
    when the newest item cannot be decrypted; ours raises a subclass of it, and both leave
    the item in place."""
    from agents import SQLiteSession
    from cryptography.fernet import InvalidToken

    foreign = Fernet.generate_key().decode()
    sdk_store = SQLiteSession("sdk", str(tmp_path / "sdk.sqlite3"))
    await EncryptedSession("sdk", sdk_store, foreign).add_items([{"role": "user", "content": "x"}])
    with pytest.raises(InvalidToken):
        await EncryptedSession("sdk", sdk_store, encryption_key).pop_item()
    assert len(await sdk_store.get_items()) == 1

    ours = open_session("ours")
    await AuditedEncryptedSession("ours", DjangoSession("ours"), foreign).add_items(
        [{"role": "user", "content": "x"}]
    )
    with pytest.raises(InvalidToken) as raised:
        await ours.pop_item()
    assert isinstance(raised.value, UnreadableSessionItem)
    assert "cannot be decrypted" in str(raised.value)
    assert await SessionItem.objects.acount() == 1
    sdk_store.close()
