"""The SDK's `Session` on Django models, split by capability as the SDK splits its own stores
(`memory/sqlite_session.py`, `extensions/memory/advanced_sqlite_session.py`,
`encrypt_session.py`, `memory/openai_responses_compaction_session.py`):

- `store.py`: the core store, the `Session` protocol (get, add, pop, clear), the lock every
  writer of a conversation takes, and the row helpers the others share;
- `run_writes.py`: what the run engine writes, in its own transactions;
- `branches.py`: branches and turns; `usage.py`: what each turn used; `compaction.py`: the
  SDK's compaction hook;
- `django_session.py`: `DjangoSession`, made of those;
- `encryption.py`: `AuditedEncryptedSession`, encryption at rest around it;
- `opening.py`: the session the site opens for a conversation, and what a view or the engine
  asks of it whether encrypted or not (`branching`, `rewrite_items`, `fork`, `switch`).

A module here imports only those above it in this list, never this package, which
re-exports the names callers use.
"""

from __future__ import annotations

from conversations.session.django_session import DjangoSession
from conversations.session.encryption import (
    AuditedEncryptedSession,
    UnreadableSessionItem,
    unreadable_item_counts,
)
from conversations.session.opening import (
    NO_EXPIRY_SECONDS,
    branching,
    fork,
    open_session,
    rewrite_items,
    switch,
)
from conversations.session.run_writes import current_branch, record_turn_usage
from conversations.session.store import MAX_TURN

__all__ = [
    "MAX_TURN",
    "NO_EXPIRY_SECONDS",
    "AuditedEncryptedSession",
    "DjangoSession",
    "UnreadableSessionItem",
    "branching",
    "current_branch",
    "fork",
    "open_session",
    "record_turn_usage",
    "rewrite_items",
    "switch",
    "unreadable_item_counts",
]
