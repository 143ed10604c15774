"""Usage, as the SDK's `AdvancedSQLiteSession` stores it: what each turn of a branch used
(`TurnUsage` rows), stored from a run's result and summed per conversation, branch or turn.
The run engine stores it in its own final write instead (`run_writes.record_turn_usage`).
"""

from __future__ import annotations

import logging
from typing import Any

from agents.memory.session import _await_mutation
from agents.usage import Usage
from django.db import transaction
from django.db.models import Count, Sum

from agentsite.db.hops import db_thread
from conversations.models import TURN_USAGE_FIELDS, TurnUsage
from conversations.session.run_writes import record_turn_usage
from conversations.session.store import SessionStore, _storable_id, _turn_in_range

logger = logging.getLogger(__name__)


class UsageMixin(SessionStore):
    """`DjangoSession`'s usage: `store_run_usage`, `get_session_usage`, `get_turn_usage`."""

    async def store_run_usage(self, result: Any) -> None:
        """Store what `result` (a `RunResult`) used as the current turn's usage of the
        current branch, replacing what the turn had; nothing when the branch is empty.
        Never raises: a failure is logged, as the SDK does."""
        try:
            usage = result.context_wrapper.usage
            if usage is not None:
                await _await_mutation(db_thread(self._store_usage_sync)(usage))
        except Exception:
            logger.exception("Session %s: failed to store session usage", self.session_id)

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """Usage summed over every branch (or `branch_id`'s turns): `requests`,
        `input_tokens`, `output_tokens`, `total_tokens`, `total_turns`; None when none was
        stored."""
        return await db_thread(self._session_usage_sync)(branch_id)

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """One turn's usage (`{}` when none), or every turn's of the branch, by turn."""
        return await db_thread(self._turn_usage_sync)(user_turn_number, branch_id)

    def _store_usage_sync(self, usage: Usage) -> None:
        with transaction.atomic():
            locked = self._locked()
            if locked is not None:
                record_turn_usage(locked[0], locked[1], usage)

    def _session_usage_sync(self, branch_id: str | None) -> dict[str, int] | None:
        rows = TurnUsage.objects.filter(conversation__session_id=self.session_id)
        if branch_id:
            rows = rows.filter(branch=branch_id)
        totals = rows.aggregate(
            requests=Sum("requests"),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            total_tokens=Sum("total_tokens"),
            total_turns=Count("id"),
        )
        if totals["requests"] is None:
            return None
        return {name: int(value or 0) for name, value in totals.items()}

    def _turn_usage_sync(
        self, user_turn_number: int | None, branch_id: str | None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        where = self._where(branch_id)
        fields = TURN_USAGE_FIELDS
        if user_turn_number is not None:
            if where is None or not _storable_id(where[1]) or not _turn_in_range(user_turn_number):
                return {}
            found = (
                TurnUsage.objects.filter(
                    conversation_id=where[0], branch=where[1], turn=user_turn_number
                )
                .values(*fields)
                .first()
            )
            return dict(found) if found is not None else {}
        if where is None or not _storable_id(where[1]):
            return []
        rows = TurnUsage.objects.filter(conversation_id=where[0], branch=where[1]).order_by("turn")
        return [
            {"user_turn_number": row.pop("turn"), **row} for row in rows.values("turn", *fields)
        ]
