"""What the session the site opens offers whether it is encrypted or not: `branching` and
`rewrite_items` (conversations/session/opening.py), each answered by the session itself."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from agents import SQLiteSession
from agents.extensions.memory import EncryptedSession
from agents.memory.session import SessionABC
from cryptography.fernet import Fernet

from conversations.models import SessionItem
from conversations.session import (
    AuditedEncryptedSession,
    DjangoSession,
    branching,
    open_session,
    rewrite_items,
)

pytestmark = pytest.mark.django_db(transaction=True)

CALL = {"type": "function_call", "call_id": "c1", "name": "refund", "arguments": '{"a": 1}'}


def stored() -> list[Any]:
    """The payloads as stored (envelopes, when encrypted), oldest first."""
    return list(SessionItem.objects.order_by("pk").values_list("payload", flat=True))


def edited(item: Any) -> Any:
    return {**item, "arguments": '{"a": 2}'} if item.get("type") == "function_call" else None


def sdk_encrypted() -> SessionABC:
    # The SDK's own wrapper passes unknown attributes on to the store it wraps: asked for a
    # rewrite, it would hand that store's envelopes to `rewrite` and store its answer in the
    # clear.
    return EncryptedSession("foreign", DjangoSession("foreign"), Fernet.generate_key().decode())


@pytest.mark.parametrize(
    "make", [lambda: SQLiteSession("foreign"), sdk_encrypted], ids=["sqlite", "sdk-encrypted"]
)
async def test_it_refuses_a_session_that_is_not_the_sites(make: Callable[[], SessionABC]) -> None:
    session = make()
    with pytest.raises(TypeError, match="cannot rewrite items in place"):
        await rewrite_items(session, edited, 10)
    with pytest.raises(TypeError, match="has no branches"):
        branching(session)


async def test_it_gives_the_branch_api_of_the_store_an_encrypted_session_wraps(
    encryption_key: str,
) -> None:
    encrypted = open_session("wrapped")
    assert isinstance(encrypted, AuditedEncryptedSession)
    assert branching(encrypted) is encrypted.underlying_session
    plain = DjangoSession("plain")
    assert branching(plain) is plain


async def test_it_rewrites_an_encrypted_session_through_its_cipher(encryption_key: str) -> None:
    session = open_session("rewritten")
    assert isinstance(session, AuditedEncryptedSession)
    await session.add_items([{"role": "user", "content": "refund me"}])
    await AuditedEncryptedSession(
        "rewritten", DjangoSession("rewritten"), Fernet.generate_key().decode()
    ).add_items([{"role": "user", "content": "under another key"}])
    await session.add_items([CALL])
    before = await asyncio.to_thread(stored)
    seen = session.unreadable_seen

    assert await rewrite_items(session, edited, 10) == 1

    assert session.unreadable_seen == seen  # what the rewrite skips is not reported
    after = await asyncio.to_thread(stored)
    assert after[:2] == before[:2]  # the unreadable item is left as it is
    assert after[2] != before[2] and "refund" not in str(after[2])  # encrypted again
    assert await session.get_items() == [
        {"role": "user", "content": "refund me"},
        {**CALL, "arguments": '{"a": 2}'},
    ]
