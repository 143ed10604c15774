"""Branches and turns, as the SDK's `AdvancedSQLiteSession` has them
(`extensions/memory/advanced_sqlite_session.py`): create a branch from a turn or from a
message's text, switch, delete and list branches, and read a branch's user turns, its items
by turn and the tools each turn called. A conversation's current branch is kept on its row
(`Conversation.current_branch`), or on the session object when it was given a branch of its
own (a run's).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any, cast

from agents.extensions.memory.advanced_sqlite_session import _content_preview
from agents.memory.session import _await_mutation
from django.db import transaction
from django.db.models import Count, Min, Q

from agentsite.db.hops import db_thread
from conversations.models import (
    BRANCH_ID_MAX_LENGTH,
    MAIN_BRANCH,
    Branch,
    Conversation,
    SessionItem,
    TurnUsage,
)
from conversations.session.store import SessionStore, _storable_id, _turn_in_range


class BranchesMixin(SessionStore):
    """`DjangoSession`'s branches and turns, with the same answers as
    `AdvancedSQLiteSession`'s (`tests/conversations/session/test_branches_differential.py`)."""

    async def current_branch_id(self) -> str:
        """The branch this session reads and writes now (`AdvancedSQLiteSession` keeps it in
        `_current_branch_id`; here it is the conversation's, or this object's own)."""
        return await db_thread(self._branch_sync)()

    async def create_branch_from_turn(
        self, turn_number: int, branch_name: str | None = None
    ) -> str:
        """A new branch with the current branch's items of the turns before `turn_number`,
        which becomes the current one; its id (`branch_name`, else
        "branch_from_turn_<n>_<unix time>", with "_2", "_3"... when taken).

        Raises:
            ValueError: the turn has no user message on the current branch, or
                `branch_name` is blank, was used before in this conversation, or cannot be
                stored (longer than 100 characters, or holding U+0000 or a lone surrogate).
        """
        if branch_name is not None and not branch_name.strip():
            raise ValueError("Branch name cannot be empty")
        if branch_name is not None:
            _check_storable_id(branch_name)
        created = await _await_mutation(
            db_thread(self._create_branch_sync)(turn_number, branch_name)
        )
        if self._branch is not None:
            self._branch = created
        return created

    async def create_branch_from_content(
        self, search_term: str, branch_name: str | None = None
    ) -> str:
        """A branch from the first user turn of the current branch whose text holds
        `search_term` (ASCII letters in any case), as `create_branch_from_turn` makes one.

        Raises:
            ValueError: no user turn holds it, or `branch_name` is refused.
        """
        matching = await self.find_turns_by_content(search_term)
        if not matching:
            raise ValueError(f"No user turns found containing '{search_term}'")
        return await self.create_branch_from_turn(matching[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        """Make `branch_id` the current branch (of the conversation, and of this object).

        Raises:
            ValueError: the branch has no items (it does not exist).
        """
        await _await_mutation(db_thread(self._switch_sync)(branch_id))
        if self._branch is not None:
            self._branch = branch_id

    async def delete_branch(self, branch_id: str, force: bool = False) -> None:
        """Delete a branch's items and usage; its id stays used.

        Raises:
            ValueError: `branch_id` is blank, "main", the current branch (without `force`,
                which switches to "main" first), or does not exist.
        """
        if not branch_id or not branch_id.strip():
            raise ValueError("Branch ID cannot be empty")
        if branch_id == MAIN_BRANCH:
            raise ValueError("Cannot delete the 'main' branch")
        switched = await _await_mutation(db_thread(self._delete_branch_sync)(branch_id, force))
        if switched and self._branch is not None:
            self._branch = MAIN_BRANCH

    async def list_branches(self) -> list[dict[str, Any]]:
        """Each branch that has items, oldest first: `branch_id`, `message_count`,
        `user_turns`, `is_current`, `created_at` (UTC, "YYYY-MM-DD HH:MM:SS", as SQLite's
        CURRENT_TIMESTAMP writes it)."""
        return await db_thread(self._list_branches_sync)()

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of the current branch (or `branch_id`): `turn`, `content` (cut to
        100 characters), `full_content`, `timestamp`, `can_branch`."""
        return await db_thread(self._turns_sync)(branch_id, None)

    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The user turns whose text holds `search_term` (ASCII letters in any case), as
        `get_conversation_turns` gives them but with `content` uncut. Searched in Python over
        the branch's user messages, read (decrypted, when the session is encrypted) one by
        one: what SQLite's LIKE plus the SDK's own check find."""
        pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)
        return await db_thread(self._turns_sync)(branch_id, pattern)

    async def get_conversation_by_turns(
        self, branch_id: str | None = None
    ) -> dict[int, list[dict[str, str | None]]]:
        """Each turn's items as `{"type": message type, "tool_name": ...}`, in order."""
        return await db_thread(self._by_turns_sync)(branch_id)

    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str, int, int]]:
        """(tool name, calls, turn) for each tool called in each turn, by turn."""
        return await db_thread(self._tool_usage_sync)(branch_id)

    def _branch_sync(self) -> str:
        if self._branch is not None:
            return self._branch
        where = self._where()
        return where[1] if where is not None else MAIN_BRANCH

    def _create_branch_sync(self, turn_number: int, branch_name: str | None) -> str:
        with transaction.atomic():
            locked = self._locked()
            source = locked[1] if locked is not None else (self._branch or MAIN_BRANCH)
            if locked is None or not _has_user_turn(locked[0], source, turn_number):
                raise ValueError(
                    f"Turn {turn_number} does not contain a user message in branch '{source}'"
                )
            conversation_pk = locked[0]
            branch_id = _reserve(conversation_pk, branch_name, turn_number, source)
            copied = (
                SessionItem.objects.filter(
                    conversation_id=conversation_pk, branch=source, turn__lt=turn_number
                )
                .order_by("id")
                .values_list("turn", "message_type", "tool_name", "payload")
            )
            # In their order: the copies' ids keep the branch's order, as the SDK's
            # sequence numbers do.
            SessionItem.objects.bulk_create(
                (
                    SessionItem(
                        conversation_id=conversation_pk,
                        branch=branch_id,
                        turn=turn,
                        message_type=kind,
                        tool_name=tool,
                        payload=payload,
                    )
                    for turn, kind, tool, payload in copied.iterator()
                ),
                batch_size=500,
            )
            Conversation.objects.filter(pk=conversation_pk).update(current_branch=branch_id)
            return branch_id

    def _switch_sync(self, branch_id: str) -> None:
        with transaction.atomic():
            locked = self._locked()
            if locked is None or not _branch_exists(locked[0], branch_id):
                raise ValueError(f"Branch '{branch_id}' does not exist")
            Conversation.objects.filter(pk=locked[0]).update(current_branch=branch_id)

    def _delete_branch_sync(self, branch_id: str, force: bool) -> bool:
        """Delete the branch; True when the session was on it and went back to "main"."""
        with transaction.atomic():
            locked = self._locked()
            current = locked[1] if locked is not None else (self._branch or MAIN_BRANCH)
            exists = locked is not None and _branch_exists(locked[0], branch_id)
            switched = False
            if branch_id == current:
                if not force:
                    raise ValueError(
                        f"Cannot delete current branch '{branch_id}'. Use force=True or switch "
                        "branches first"
                    )
                if not exists:
                    raise ValueError(f"Branch '{branch_id}' does not exist")
                assert locked is not None
                if not _branch_exists(locked[0], MAIN_BRANCH):
                    raise ValueError(f"Branch '{MAIN_BRANCH}' does not exist")
                Conversation.objects.filter(pk=locked[0]).update(current_branch=MAIN_BRANCH)
                switched = True
            if not exists:
                raise ValueError(f"Branch '{branch_id}' does not exist")
            assert locked is not None
            TurnUsage.objects.filter(conversation_id=locked[0], branch=branch_id).delete()
            SessionItem.objects.filter(conversation_id=locked[0], branch=branch_id).delete()
            return switched

    def _list_branches_sync(self) -> list[dict[str, Any]]:
        where = self._where()
        if where is None:
            return []
        conversation_pk, current = where
        rows = (
            SessionItem.objects.filter(conversation_id=conversation_pk)
            .values("branch")
            .annotate(
                message_count=Count("id"),
                user_turns=Count("id", filter=Q(message_type="user")),
                created_at=Min("created"),
                first=Min("id"),
            )
            .order_by("created_at", "first")
        )
        return [
            {
                "branch_id": row["branch"],
                "message_count": row["message_count"],
                "user_turns": row["user_turns"],
                "is_current": row["branch"] == current,
                "created_at": _sqlite_timestamp(row["created_at"]),
            }
            for row in rows
        ]

    def _turns_sync(
        self, branch_id: str | None, pattern: re.Pattern[str] | None
    ) -> list[dict[str, Any]]:
        where = self._where(branch_id)
        if where is None or not _storable_id(where[1]):
            return []
        rows = (
            SessionItem.objects.filter(
                conversation_id=where[0], branch=where[1], message_type="user"
            )
            .order_by("turn", "id")
            .values_list("turn", "payload", "created")
        )
        turns = []
        for turn, payload, created in rows:
            item = self._read_content(payload)
            if not isinstance(item, dict):
                continue  # unreadable (a key that does not decrypt it)
            content = item.get("content", "")
            if pattern is not None:
                try:
                    texts = (
                        [content]
                        if isinstance(content, str)
                        else [part.get("text", "") for part in content]
                    )
                except AttributeError:
                    continue
                if not any(pattern.search(text) for text in texts):
                    continue
            turns.append(
                {
                    "turn": turn,
                    "content": _content_preview(content, None if pattern else 100),
                    "full_content": content,
                    "timestamp": _sqlite_timestamp(created),
                    "can_branch": True,
                }
            )
        return turns

    def _by_turns_sync(self, branch_id: str | None) -> dict[int, list[dict[str, str | None]]]:
        where = self._where(branch_id)
        turns: dict[int, list[dict[str, str | None]]] = {}
        if where is None or not _storable_id(where[1]):
            return turns
        rows = SessionItem.objects.filter(conversation_id=where[0], branch=where[1]).order_by("id")
        for turn, kind, tool in rows.values_list("turn", "message_type", "tool_name"):
            turns.setdefault(turn, []).append({"type": kind, "tool_name": tool})
        return turns

    def _tool_usage_sync(self, branch_id: str | None) -> list[tuple[str, int, int]]:
        where = self._where(branch_id)
        if where is None or not _storable_id(where[1]):
            return []
        rows = list(
            SessionItem.objects.filter(conversation_id=where[0], branch=where[1])
            .order_by("id")
            .values_list("turn", "message_type", "tool_name")
        )
        # AdvancedSQLiteSession.get_tool_usage's query, in Python: each tool call counts,
        # and a tool search's output counts when its turn has no call of the same search.
        searched = {(turn, tool) for turn, kind, tool in rows if kind == "tool_search_call"}
        counts: Counter[tuple[str | None, int]] = Counter()
        for turn, kind, tool in rows:
            if kind in TOOL_CALL_TYPES:
                name = tool if tool is not None else (kind if kind in NAMED_BY_TYPE else None)
                counts[(name, turn)] += 1
            elif kind == "tool_search_output" and (tool is None or (turn, tool) not in searched):
                counts[(tool, turn)] += 1
        ordered = sorted(counts.items(), key=lambda entry: (entry[0][1], entry[0][0] or ""))
        return [(cast(str, name), count, turn) for (name, turn), count in ordered]


# What `get_tool_usage` counts, as AdvancedSQLiteSession's query names them.
TOOL_CALL_TYPES = frozenset(
    {
        "tool_call",
        "function_call",
        "computer_call",
        "file_search_call",
        "web_search_call",
        "code_interpreter_call",
        "tool_search_call",
        "custom_tool_call",
        "mcp_call",
        "mcp_approval_request",
        "shell_call",
        "apply_patch_call",
    }
)
NAMED_BY_TYPE = frozenset({"shell_call", "apply_patch_call"})


def _has_user_turn(conversation_pk: int, branch: str, turn: Any) -> bool:
    if not _storable_id(branch) or not _turn_in_range(turn):
        return False
    return SessionItem.objects.filter(
        conversation_id=conversation_pk, branch=branch, turn=turn, message_type="user"
    ).exists()


def _branch_exists(conversation_pk: int, branch: Any) -> bool:
    if not _storable_id(branch):
        return False
    return SessionItem.objects.filter(conversation_id=conversation_pk, branch=branch).exists()


def _check_storable_id(branch: str) -> None:
    if not _storable_id(branch):
        raise ValueError(
            f"Branch name {branch[:40]!r} cannot be used: at most {BRANCH_ID_MAX_LENGTH} "
            "characters, without U+0000 or a lone surrogate."
        )


def _reserve(conversation_pk: int, name: str | None, from_turn: int, source: str) -> str:
    """Take a new branch id for good (under the conversation's lock): `name`, or the SDK's
    generated one, "branch_from_turn_<n>_<unix time>" with "_2", "_3"... when taken."""
    if name is None:
        base = f"branch_from_turn_{from_turn}_{int(time.time())}"
        taken = set(
            Branch.objects.filter(
                conversation_id=conversation_pk, branch_id__startswith=base
            ).values_list("branch_id", flat=True)
        )
        name, suffix = base, 1
        while name in taken:
            suffix += 1
            name = f"{base}_{suffix}"
    elif (
        name == MAIN_BRANCH
        or Branch.objects.filter(conversation_id=conversation_pk, branch_id=name).exists()
    ):
        raise ValueError(f"Branch ID '{name}' has already been used. Choose a new branch ID.")
    Branch.objects.create(
        conversation_id=conversation_pk, branch_id=name, source=source, from_turn=from_turn
    )
    return name


def _sqlite_timestamp(moment: datetime | None) -> str | None:
    """A time as SQLite's CURRENT_TIMESTAMP writes it (UTC), which the SDK's answers hold."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if moment is not None else None
