"""What the run engine reads and writes of a conversation's store, inside its own
transactions: the branch a new run starts on, and a turn's usage in a run's final write."""

from __future__ import annotations

import json
import logging
from typing import Any

from agents.usage import Usage
from django.db import connection
from django.utils import timezone

from conversations.models import Conversation
from conversations.sql import statements

logger = logging.getLogger(__name__)


def _details(details: Any) -> Any:
    """Token details as the SDK stores them: the object's fields, through JSON."""
    if not details:
        return None
    try:
        return json.loads(json.dumps(details.__dict__))
    except (TypeError, ValueError, AttributeError):
        logger.warning("Token details %r could not be stored", type(details).__name__)
        return None


def record_turn_usage(
    conversation_pk: int, branch: str, usage: Usage, run_id: int | None = None
) -> bool:
    """Store `usage` as what the newest turn of `branch` used (`store_run_usage`'s write),
    replacing what that turn had; nothing when the branch has no items. For the run engine,
    in its final write's transaction (with the run that used it). True if stored."""
    details = [
        _details(getattr(usage, name, None))
        for name in ("input_tokens_details", "output_tokens_details")
    ]
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        # One statement, the SDK's INSERT OR REPLACE with its read of the current turn
        # (a run's final write pays for it on every turn: conversations/sql.py).
        cursor.execute(
            statements().store_turn_usage,
            [
                conversation_pk,
                branch,
                usage.requests or 0,
                usage.input_tokens or 0,
                usage.output_tokens or 0,
                usage.total_tokens or 0,
                *(json.dumps(value) if value is not None else None for value in details),
                run_id,
                now,
                conversation_pk,
                branch,
                branch,
            ],
        )
        return bool(cursor.rowcount)


def current_branch(conversation_pk: int) -> str:
    """The branch the conversation is on now (under the caller's lock of it, when it holds
    one).

    Raises:
        Conversation.DoesNotExist: there is no such conversation.
    """
    with connection.cursor() as cursor:
        cursor.execute(statements().current_branch, [conversation_pk])
        row = cursor.fetchone()
    if row is None:
        raise Conversation.DoesNotExist(f"No conversation {conversation_pk}.")
    return str(row[0])
