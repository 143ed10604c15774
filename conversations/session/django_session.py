"""`DjangoSession`: the session store made of its capabilities, each in a module of its own
as the SDK keeps its stores' (`store.py`: the `Session` protocol; `branches.py`: branches
and turns; `usage.py`: usage; `compaction.py`: the compaction hook).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.items import TResponseInputItem
from agents.memory.session import _CompactionSnapshot
from agents.memory.session_settings import SessionSettings

from conversations.models import Conversation
from conversations.session.branches import BranchesMixin
from conversations.session.compaction import CompactionMixin
from conversations.session.usage import UsageMixin


class DjangoSession(BranchesMixin, UsageMixin, CompactionMixin):
    """A conversation's history, for `Runner.run(..., session=DjangoSession(id))`.

    `DjangoSession` answers exactly as the SDK's `SQLiteSession` does (a differential test
    holds it to that), but stores items in `SessionItem` rows so that conversations live in
    the site's own database, show up in admin, and can be owned by a user.

    The `Conversation` row is created on the first `add_items`; `owner` and `agent_name` are
    used only then. `clear_session` empties the history but keeps the conversation itself
    (its owner, title and runs), unlike `SQLiteSession`, which forgets the session row.

    Branches, turns and usage as the SDK's `AdvancedSQLiteSession` has them, with the same
    answers (`tests/conversations/session/test_branches_differential.py`), but its current
    branch is the conversation's (`Conversation.current_branch`): a session object lives for
    one request or one run, and the next one reads and writes where the last one switched. With
    `branch`, the object keeps a branch of its own instead (a run's session, on the branch
    its run was started on); switching moves both.
    """

    @classmethod
    def for_conversation(
        cls,
        conversation: Conversation,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> DjangoSession:
        session = cls(conversation.session_id, session_settings=session_settings)
        session._conversation_pk = conversation.pk
        return session

    def __repr__(self) -> str:
        return f"DjangoSession({self.session_id!r})"

    def branching(self) -> DjangoSession:
        """The session with the branch API: this one."""
        return self

    async def _get_compaction_snapshot(
        self,
        limit: int,
        *,
        prune_prefix: Callable[[TResponseInputItem], bool] | None = None,
    ) -> _CompactionSnapshot | None:
        """The SDK's hook for atomic compaction (`compaction.py` says what it answers)."""
        if type(self) is not DjangoSession or limit < 1:
            # A subclass that changes items on their way must bring its own, as in the SDK.
            return None
        return await self._compaction_snapshot(limit, prune_prefix)
