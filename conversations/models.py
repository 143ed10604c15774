"""Conversations, stored so that the SDK can use them as sessions.

A `Conversation` is what a person sees as one chat; its `SessionItem` rows are exactly the
Responses-API items the SDK hands to `Session.add_items`, oldest first by primary key.

A conversation has branches, as the SDK's `AdvancedSQLiteSession` has: each item belongs to
one branch ("main" first) and one user turn of it (`turn`: how many user messages the branch
held up to it), and a branch made from turn N starts with copies of the items of turns before
N. `Conversation.current_branch` is the branch a session reads and writes; `Branch` rows
reserve the ids ever used (a deleted branch's id is never used again, as in the SDK), and
`TurnUsage` is what the runs of each turn of a branch used (`store_run_usage`).
"""

from __future__ import annotations

import secrets
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from agentsite.db.faithful import FaithfulJSONField
from conversations.items import is_user_message, structure

MAIN_BRANCH = "main"
BRANCH_ID_MAX_LENGTH = 100


def new_session_id() -> str:
    return f"conv_{secrets.token_urlsafe(16)}"


class ConversationQuerySet(models.QuerySet["Conversation"]):
    def owned_by(self, user: Any) -> ConversationQuerySet:
        return self.filter(owner=user)

    def started_since(self, user: Any, since: Any) -> ConversationQuerySet:
        """The conversations `user` opened from `since` on: what the rate limit counts."""
        return self.filter(owner=user, created__gte=since)

    def untouched(self) -> ConversationQuerySet:
        """Opened and never used: no title, no item on any version, no run. The list leaves
        them out, and a new conversation with the same agent reuses one."""
        return self.filter(title="", items__isnull=True, runs__isnull=True)

    def touched(self) -> ConversationQuerySet:
        """All but the `untouched` ones."""
        return self.exclude(pk__in=self.untouched().values("pk"))

    def with_first_message(self) -> ConversationQuerySet:
        """Each with `first_message`: the payload of the first user message of the version it
        is on (None before one), what a list shows of a conversation without a title."""
        first = (
            SessionItem.objects.filter(
                conversation=models.OuterRef("pk"),
                branch=models.OuterRef("current_branch"),
                payload__role="user",
            )
            .order_by("id")
            .values("payload")[:1]
        )
        return self.annotate(first_message=models.Subquery(first, output_field=models.JSONField()))


class BusyWith(StrEnum):
    """Why a conversation takes no message now (a conversation takes one at a time); the
    chat's composer is told which, and takes its refusal away once it is no longer so."""

    # Its agent is answering: a run of it is queued, running or resuming.
    WORKING = "working"
    # A request of its last run waits for a reviewer: that run's status reads the same
    # (`RunStatus.WAITING`; engine.models imports this module, so not from there).
    WAITING = "waiting"


class Conversation(models.Model):
    session_id = models.CharField(
        max_length=255,
        unique=True,
        default=new_session_id,
        help_text="Public id, used as the SDK session id and in URLs.",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="conversations",
    )
    agent_name = models.CharField(max_length=100, blank=True)
    current_agent = models.CharField(
        max_length=100,
        blank=True,
        help_text=(
            "The registry name of the agent that answered last (a handoff target is "
            "'<agent_name>/<its name>'); the next turn starts with it. Empty: agent_name."
        ),
    )
    title = models.CharField(max_length=200, blank=True)
    current_branch = models.CharField(
        max_length=BRANCH_ID_MAX_LENGTH,
        default=MAIN_BRANCH,
        help_text="The branch its session reads and writes now ('main' until a fork).",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "-updated"], name="conv_owner_updated")]

    def __str__(self) -> str:
        return self.title or self.session_id

    @property
    def first_words(self) -> str:
        """Its first message's text (`with_first_message`), "" when none is known."""
        first: Any = getattr(self, "first_message", None)
        text = first.get("content") if is_user_message(first) and first else None
        return text if isinstance(text, str) else ""

    def lock(self) -> str:
        """Lock the conversation's row for the rest of the transaction (sends, edits and
        version switches of one conversation queue on it) and return the version it is on
        now.

        Raises:
            Conversation.DoesNotExist: it was deleted a moment ago.
        """
        current = (
            Conversation.objects.select_for_update()
            .filter(pk=self.pk)
            .values_list("current_branch", flat=True)
            .first()
        )
        if current is None:
            raise Conversation.DoesNotExist("No conversation found.")
        return current

    def busy_with(self) -> BusyWith | None:
        """None when it takes a message now; else whether its agent is working or a request
        of it waits for a reviewer."""
        status = self.runs.busy().values_list("status", flat=True).first()
        if status is None:
            return None
        return BusyWith.WAITING if status == BusyWith.WAITING else BusyWith.WORKING

    @property
    def answering_agent(self) -> str:
        """Who answers the next message as far as the conversation knows: the agent that
        answered last, else its own ("": the site's default). The engine also checks that
        the name can still be reached."""
        return self.current_agent or self.agent_name

    def hand_to(self, agent_name: str | None) -> None:
        """`agent_name` answers the next message (None: the conversation's own agent, stored
        as ""). No write when that is so already: most turns end with the agent they started
        with (the engine's final write calls this on every turn)."""
        current = "" if agent_name in (None, self.agent_name) else agent_name
        if current != self.current_agent:
            Conversation.objects.filter(pk=self.pk).update(current_agent=current)
            self.current_agent = current

    def hand_back(self, taken_back: str) -> None:
        """A user message was taken back (undone, or edited into a new version): the agent
        it was sent to answers next, the one its turn (the newest run on that text) started
        with. Unchanged when no run has that text."""
        started = (
            self.runs.filter(input=taken_back.strip())
            .order_by("-created", "-pk")
            .values_list("agent_name", flat=True)
            .first()
        )
        if started is not None:
            self.hand_to(started)

    def version_agent(self, branch: str) -> str | None:
        """The agent that started the latest turn of the version `branch` (None: no run of
        it yet): who answers that version's next message."""
        return (
            self.runs.on_branch(branch)
            .order_by("-created", "-pk")
            .values_list("agent_name", flat=True)
            .first()
        )

    def touch(self) -> None:
        """Its last activity, the list's order, is now (the session sets it on its own writes
        only)."""
        Conversation.objects.filter(pk=self.pk).update(updated=timezone.now())


class SessionItem(models.Model):
    # No index of its own: the (conversation, branch, id) index below serves every lookup by
    # conversation, and also gives "newest first" without a sort on PostgreSQL.
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="items", db_index=False
    )
    branch = models.CharField(max_length=BRANCH_ID_MAX_LENGTH, default=MAIN_BRANCH)
    # The branch's user turn the item belongs to: 1 for the first user message and what
    # follows it, 0 for items before any. A branch's turns never decrease by id.
    turn = models.PositiveIntegerField(default=0)
    # The SDK's `message_type` and `tool_name` of the item (`items.structure`), read from the
    # plain item when it is written, so that an encrypted item has them too. "" only until
    # `save` fills it in.
    message_type = models.TextField(default="")
    tool_name = models.TextField(null=True, blank=True)
    payload = FaithfulJSONField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        # "The last N items of one branch" walks this index backwards and stops after N, so
        # its cost does not grow with the conversation's length, nor with its branches.
        indexes = [
            models.Index(fields=["conversation", "branch", "id"], name="item_conv_branch_id")
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}#{self.pk}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # The session writes its rows in plain SQL (conversations/sql.py), structure and all;
        # a row made through the ORM (admin, tests) is placed the same way, at the end of its
        # branch.
        if self._state.adding and not self.message_type:
            self.message_type, self.tool_name = structure(self.payload)
            newest = (
                SessionItem.objects.filter(conversation_id=self.conversation_id, branch=self.branch)
                .order_by("-id")
                .values_list("turn", flat=True)
                .first()
            )
            self.turn = (newest or 0) + (self.message_type == "user")
        super().save(*args, **kwargs)

    @property
    def kind(self) -> str:
        """A short label for admin: the item's role or type."""
        payload = self.payload
        if isinstance(payload, dict):
            if "__enc__" in payload:
                return "encrypted"
            return str(payload.get("role") or payload.get("type") or "item")
        return type(payload).__name__


EDIT_PREFIX = "edit-"


def branch_label(branch_id: str) -> str:
    """A branch as people read it: "Original", "Edit 2" (the chat's forks), else its id."""
    if branch_id == MAIN_BRANCH:
        return "Original"
    number = branch_id.removeprefix(EDIT_PREFIX)
    if branch_id.startswith(EDIT_PREFIX) and number.isdigit():
        return f"Edit {int(number)}"
    return branch_id


class BranchQuerySet(models.QuerySet["Branch"]):
    def next_edit_id(self, conversation_pk: int) -> str:
        """The id of the conversation's next fork from the chat, "edit-<n>": one more than
        its branches so far, never one used before."""
        used = set(self.filter(conversation_id=conversation_pk).values_list("branch_id", flat=True))
        number = len(used) + 1
        while f"{EDIT_PREFIX}{number}" in used:
            number += 1
        return f"{EDIT_PREFIX}{number}"


class Branch(models.Model):
    """A branch id used in a conversation, reserved for good: the SDK never reuses one, even
    after the branch was deleted or the session cleared. ("main" is never a row: it is always
    taken.) With where it came from, for people."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="branches", db_index=False
    )
    branch_id = models.CharField(max_length=BRANCH_ID_MAX_LENGTH)
    source = models.CharField(max_length=BRANCH_ID_MAX_LENGTH, help_text="Made from this branch.")
    from_turn = models.PositiveIntegerField(help_text="Its turns before this one were copied.")
    created = models.DateTimeField(auto_now_add=True)

    objects = BranchQuerySet.as_manager()

    class Meta:
        ordering = ["conversation", "id"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "branch_id"], name="branch_unique_id")
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}:{self.branch_id}"


# What a turn used, as the SDK's `store_run_usage` counts it: the usage columns of a turn.
TURN_USAGE_FIELDS = (
    "requests",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "input_tokens_details",
    "output_tokens_details",
)


class TurnUsage(models.Model):
    """What one user turn of a branch used, as `AdvancedSQLiteSession.store_run_usage` stores
    it: the latest run's usage of the turn replaces the one before (a paused run stores what
    it used so far, its resumption the whole)."""

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="turn_usage", db_index=False
    )
    branch = models.CharField(max_length=BRANCH_ID_MAX_LENGTH)
    turn = models.PositiveIntegerField()
    requests = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    total_tokens = models.PositiveBigIntegerField(default=0)
    input_tokens_details = models.JSONField(null=True, blank=True)
    output_tokens_details = models.JSONField(null=True, blank=True)
    # The run that stored it, when the site's engine did (not part of the SDK's table).
    run = models.ForeignKey(
        "engine.AgentRun",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="turn_usage",
    )
    created = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["conversation", "branch", "turn"]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "branch", "turn"], name="turn_usage_unique_turn"
            )
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}:{self.branch}#{self.turn}"
