"""Opening a session: the one the site uses for a conversation (`open_session`: a
`DjangoSession`, encrypted at rest when a key is set), what every such session offers
whether encrypted or not (`branching`, `rewrite_items`), and a branch change in a view's own
transaction (`fork`, `switch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.items import TResponseInputItem
from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings
from django.conf import settings

from conversations.models import Conversation
from conversations.session.branches import _check_storable_id
from conversations.session.django_session import DjangoSession
from conversations.session.encryption import AuditedEncryptedSession

# Fernet needs a number; a century is "no practical expiry" for a chat history.
NO_EXPIRY_SECONDS = 100 * 365 * 24 * 3600


async def rewrite_items(
    session: SessionABC,
    rewrite: Callable[[TResponseInputItem], TResponseInputItem | None],
    lookback: int,
) -> int:
    """`DjangoSession.rewrite_items` through the session `open_session` gave: an encrypted
    one gives `rewrite` each item decrypted (an unreadable one is left as it is) and stores
    what it returns encrypted (`AuditedEncryptedSession.rewrite_items`)."""
    if not isinstance(session, (DjangoSession, AuditedEncryptedSession)):
        raise TypeError(f"{type(session).__name__} cannot rewrite items in place")
    return await session.rewrite_items(rewrite, lookback)


def branching(session: SessionABC) -> DjangoSession:
    """The `DjangoSession` with the branch API of the session `open_session` gave: itself,
    or the one an encrypted session wraps (which reads what it needs of a message's text
    decrypted: see `DjangoSession.find_turns_by_content`)."""
    if not isinstance(session, (DjangoSession, AuditedEncryptedSession)):
        raise TypeError(f"{type(session).__name__} has no branches")
    return session.branching()


def fork(conversation: Conversation, turn_number: int, branch_name: str) -> str:
    """`create_branch_from_turn` of the conversation's session, in the caller's transaction
    (a view that holds the conversation and starts the new branch's first run in the same
    transaction: either both happen or neither). Raises as it does."""
    _check_storable_id(branch_name)
    return DjangoSession.for_conversation(conversation)._create_branch_sync(
        turn_number, branch_name
    )


def switch(conversation: Conversation, branch_id: str) -> None:
    """`switch_to_branch` of the conversation's session, in the caller's transaction."""
    DjangoSession.for_conversation(conversation)._switch_sync(branch_id)


def open_session(
    session_id: str,
    *,
    owner: Any = None,
    agent_name: str | None = None,
    session_settings: SessionSettings | dict[str, Any] | None = None,
    conversation_pk: int | None = None,
    branch: str | None = None,
) -> SessionABC:
    """The session the site uses for a conversation: encrypted at rest when a key is set.

    `conversation_pk`, when the caller has the conversation at hand, spares the first write
    looking it up (every write still checks it). `branch`: the session keeps that branch
    (a run's, the one it was started on) instead of following the conversation's current
    one."""
    session = DjangoSession(
        session_id,
        owner=owner,
        agent_name=agent_name,
        session_settings=session_settings,
        branch=branch,
    )
    session._conversation_pk = conversation_pk
    key = settings.AGENTSITE_SESSION_ENCRYPTION_KEY
    if not key:
        return session
    return AuditedEncryptedSession(
        session_id=session_id,
        underlying_session=session,
        encryption_key=key,
        ttl=settings.AGENTSITE_SESSION_TTL or NO_EXPIRY_SECONDS,
    )
