"""Encryption at rest: the SDK's `EncryptedSession` (`extensions/memory/encrypt_session.py`)
around a `DjangoSession`, minus its silent data loss, and with our store's atomic paths: an
append's structure read from the plain items, a pop that never deletes what it cannot
decrypt, turns and rewrites read through the cipher.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from agents.extensions.memory.encrypt_session import EncryptedSession, _is_encrypted_envelope
from agents.items import TResponseInputItem
from cryptography.fernet import InvalidToken

from conversations.items import structure
from conversations.session.django_session import DjangoSession

logger = logging.getLogger(__name__)


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

    def _unwrap_quietly(self, item: Any) -> TResponseInputItem | None:
        """The SDK's `_unwrap`: the plain item, or None, neither counted nor logged."""
        return super()._unwrap(item)

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
        self,
        rewrite: Callable[[TResponseInputItem], TResponseInputItem | None],
        lookback: int,
    ) -> int:
        """`DjangoSession.rewrite_items` through the cipher: `rewrite` gets each item
        decrypted (an unreadable one is left as it is, and not counted here) and what it
        returns is stored encrypted."""
        underlying = self.underlying_session
        if not isinstance(underlying, DjangoSession):
            raise TypeError(f"{type(self).__name__} cannot rewrite items in place")

        def through_the_cipher(envelope: TResponseInputItem) -> TResponseInputItem | None:
            plain = self._unwrap_quietly(envelope)
            new = rewrite(plain) if plain is not None else None
            return cast("TResponseInputItem", self._wrap(new)) if new is not None else None

        return await underlying.rewrite_items(through_the_cipher, lookback)

    def branching(self) -> DjangoSession:
        """The session with the branch API: the `DjangoSession` this one wraps, which reads
        what it needs of a message's text decrypted (see `DjangoSession.find_turns_by_content`)."""
        underlying = self.underlying_session
        if not isinstance(underlying, DjangoSession):
            raise TypeError(f"{type(self).__name__} has no branches")
        return underlying
