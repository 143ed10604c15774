"""What a person does to a conversation: send a message, edit one (a new version), switch
versions, undo the last exchange, clear, rename.

Each action is one function: it takes the conversation (already found as the person's own)
and what was typed, takes the conversation's lock where it must, applies the rules and acts,
and returns what it made or raises a `Refusal` that carries its data and, as its `str()`, the
sentence the person reads (nothing was changed then). The chat's pages and the API both call
these; the rules themselves (the lock, busy and why, who answers next) are the
`Conversation`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.http import Http404

from conversations.items import is_user_message, message_text
from conversations.models import Branch, BusyWith, Conversation, SessionItem
from conversations.session import (
    MAX_TURN,
    UnreadableSessionItem,
    branching,
    fork,
    open_session,
    switch,
)
from engine import events, registry, runs

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from engine.models import AgentRun
    from engine.permissions import User

BUSY_WORKING = "The agent is still answering your last message. Send this one when it has replied."
BUSY_WAITING = (
    "Your last request is waiting for a reviewer's approval. You can send this message "
    "once it has been decided, or once you have withdrawn the request."
)
# Undo refused, by what the conversation is busy with: each says what applies to undoing.
UNDO_WORKING = (
    "The agent is still answering your last message: you can undo it once the reply has "
    "finished, or stop the reply first."
)
UNDO_WAITING = (
    "Your last message waits for a reviewer's approval, so it can't be undone yet: withdraw "
    "the request first (the agent then answers without it), or wait until it is decided."
)
EDIT_BUSY = "The agent is still answering: you can edit a message once it has replied."
EDIT_WAITING = (
    "Your last request waits for a reviewer's approval: withdraw it, or wait until it is "
    "decided, to edit a message."
)
SWITCH_BUSY = "You can switch versions once the agent has finished."
CLEAR_BUSY = "You can clear the conversation once the agent has finished."
EDIT_MOVED = (
    "This conversation was switched to another version meanwhile (in another window?): here "
    "it is now. Edit the message again if you still want to."
)
SEND_MOVED = (
    "This conversation was switched to another version meanwhile (in another window?), so "
    "your message was not sent: here is that version now. Send it again if you still want to."
)
NO_SUCH_TURN = "There is no message {turn} in this version of the conversation to edit."
NO_SUCH_BRANCH = "That version of the conversation has no messages any more."
AGENT_GONE = (
    "The agent of this conversation ({agent_name}) is no longer available. "
    "Start a new conversation."
)
UNREADABLE = (
    "Part of this conversation can't be decrypted with the site's current key, so it was left "
    "exactly as it is. Nothing was removed."
)


# --- refusals -------------------------------------------------------------------------------


class Refusal(Exception):
    """An action refused: nothing was changed. `str()` is the sentence the person reads."""


class Busy(Refusal):
    """The conversation takes one message at a time: its agent is working, or a request of
    it waits for a reviewer (`waiting`)."""

    def __init__(self, why: BusyWith, message: str) -> None:
        super().__init__(message)
        self.why = why
        self.waiting = why is BusyWith.WAITING


class VersionMoved(Refusal):
    """The page showed the version `shown`; the conversation is on `current` now."""

    def __init__(self, shown: str, current: str, message: str) -> None:
        super().__init__(message)
        self.shown, self.current = shown, current


class RateLimited(Refusal):
    """Too many messages from this person in a minute: try again in `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AgentGone(Refusal):
    """The conversation's agent, `agent_name`, is no longer registered."""

    def __init__(self, agent_name: str) -> None:
        super().__init__(AGENT_GONE.format(agent_name=agent_name))
        self.agent_name = agent_name


class InvalidMessage(Refusal):
    """The text is empty or too long (the run engine's rules, in its words)."""


class NoSuchTurn(Refusal):
    """The version shown has no message `turn` to edit."""

    def __init__(self, turn: int, message: str | None = None) -> None:
        super().__init__(message or NO_SUCH_TURN.format(turn=turn))
        self.turn = turn


class NoSuchVersion(Refusal):
    """The conversation has no version `branch` (any more)."""

    def __init__(self, branch: str) -> None:
        super().__init__(NO_SUCH_BRANCH)
        self.branch = branch


class Unreadable(Refusal):
    """Part of the conversation cannot be decrypted with the site's key: left as it is."""

    def __init__(self) -> None:
        super().__init__(UNREADABLE)


def busy(
    conversation: Conversation, *, working: str = BUSY_WORKING, waiting: str = BUSY_WAITING
) -> Busy | None:
    """What a message sent now would be refused with (in the words given for each reason),
    or None when the conversation takes one."""
    why = conversation.busy_with()
    if why is None:
        return None
    return Busy(why, waiting if why is BusyWith.WAITING else working)


def _refuse_when_busy(conversation: Conversation, working: str, waiting: str) -> None:
    refusal = busy(conversation, working=working, waiting=waiting)
    if refusal is not None:
        raise refusal


def _lock(conversation: Conversation) -> str:
    """`Conversation.lock`; a conversation deleted a moment ago is a 404."""
    try:
        return conversation.lock()
    except Conversation.DoesNotExist:
        raise Http404("No conversation found.") from None


def _start(
    conversation: Conversation, text: str, user: User | AnonymousUser | None, branch: str
) -> AgentRun:
    """`runs.start_run` on `branch` (read under the conversation's lock), its refusals as
    this module's."""
    try:
        return runs.start_run(conversation, text, user, branch=branch)
    except runs.RateLimited as limit:
        raise RateLimited(str(limit), limit.retry_after) from limit
    except ValueError as error:  # empty or too long
        raise InvalidMessage(str(error)) from error
    except registry.UnknownAgent as gone:
        raise AgentGone(conversation.agent_name) from gone


# --- the actions ----------------------------------------------------------------------------


def send(
    conversation: Conversation,
    user: User | AnonymousUser | None,
    text: str,
    *,
    shown: str | None = None,
) -> AgentRun:
    """Queue a run of the conversation's agent on `text`, as `user`; it starts after commit.
    `shown`: the version the page showed (None or "": the message goes on the current one).

    Raises:
        Busy, VersionMoved, InvalidMessage, RateLimited, AgentGone: nothing is stored.
    """
    with transaction.atomic():
        # Two quick sends of one conversation queue on this lock, so the second sees the run
        # of the first and is refused: a double click starts one run.
        current = _lock(conversation)
        _refuse_when_busy(conversation, BUSY_WORKING, BUSY_WAITING)
        if shown and shown != current:
            raise VersionMoved(shown, current, SEND_MOVED)
        return _start(conversation, text, user, current)


@dataclass(frozen=True)
class Edited:
    """An edit: the new version it made, and the run that answers the edited message."""

    branch: str
    run: AgentRun


def edit(
    conversation: Conversation,
    user: User | AnonymousUser | None,
    *,
    turn: int,
    text: str,
    shown: str,
) -> Edited:
    """The owner's message `turn` becomes `text`: the conversation forks from there (a new
    version, `create_branch_from_turn`, which keeps the turns before it) and the edited text
    is sent as that turn, on the new version, in the same transaction. The version edited
    stays, one click away. `shown`: the version the page showed the message in.

    Raises:
        Busy, VersionMoved, NoSuchTurn, InvalidMessage, RateLimited, AgentGone: nothing is
        stored (a refused text rolls the fork back).
    """
    with transaction.atomic():
        # As `send`: a second edit or a send queues on this lock and finds it busy.
        current = _lock(conversation)
        _refuse_when_busy(conversation, EDIT_BUSY, EDIT_WAITING)
        if current != shown:
            raise VersionMoved(shown, current, EDIT_MOVED)
        conversation.current_branch = current
        original = _turn_message(conversation, turn)
        if original is None:
            raise NoSuchTurn(turn)
        branch = Branch.objects.next_edit_id(conversation.pk)
        try:
            fork(conversation, turn, branch)
        except ValueError as error:
            raise NoSuchTurn(turn, str(error)) from error
        conversation.current_branch = branch
        # As after an undo back to that message: the agent it was sent to answers.
        conversation.hand_back(original)
        run = _start(conversation, text, user, branch)
        events.changed_on_commit(conversation.pk)
    return Edited(branch, run)


def _turn_message(conversation: Conversation, turn: int) -> str | None:
    """The text of the user message that starts `turn` on the conversation's branch, read
    through its session (decrypted when it is encrypted); None when there is none."""
    session = open_session(conversation.session_id)
    branches = branching(session)
    payload = (
        SessionItem.objects.filter(
            conversation=conversation,
            branch=conversation.current_branch,
            turn=turn,
            message_type="user",
        )
        .values_list("payload", flat=True)
        .first()
        if 0 < turn <= MAX_TURN
        else None
    )
    if payload is None:
        return None
    return message_text(branches._read_content(payload))


def switch_version(conversation: Conversation, branch: str) -> None:
    """The conversation goes on the version `branch`: its pages show it, and the next
    message goes on it.

    Raises:
        Busy, NoSuchVersion: nothing was changed.
    """
    with transaction.atomic():
        _lock(conversation)
        _refuse_when_busy(conversation, SWITCH_BUSY, SWITCH_BUSY)
        try:
            switch(conversation, branch)
        except ValueError:
            raise NoSuchVersion(branch) from None
        # The agent that started that version's latest turn answers its next one.
        conversation.hand_to(conversation.version_agent(branch))
        events.changed_on_commit(conversation.pk)


def undo(conversation: Conversation) -> int:
    """Take the last exchange (the last user message and all after it) off the version the
    conversation is on; how many items went (0: there was nothing to undo).

    Raises:
        Busy, Unreadable: nothing was removed.
    """
    _refuse_when_busy(conversation, UNDO_WORKING, UNDO_WAITING)
    try:
        removed = async_to_sync(_undo_last_exchange)(open_session(conversation.session_id))
    except UnreadableSessionItem:
        raise Unreadable() from None
    if removed:
        conversation.touch()
        conversation.hand_back(message_text(removed[-1]))
        events.changed_on_commit(conversation.pk)
    return len(removed)


async def _undo_last_exchange(session: Any) -> list[Any]:
    """Pop items until the last user message is gone; the items removed, newest first.

    An item that cannot be decrypted is never removed: the items popped before it are put
    back (they were all newer than it, so the order is unchanged) and the error is raised.
    """
    items = await session.get_items()
    if not any(is_user_message(item) for item in items):
        return []
    popped: list[Any] = []
    try:
        while True:
            item = await session.pop_item()
            if item is None:
                break
            popped.append(item)
            if is_user_message(item):
                break
    except UnreadableSessionItem:
        if popped:
            await session.add_items(list(reversed(popped)))
        raise
    return popped


def clear(conversation: Conversation) -> None:
    """Empty every version of the conversation (it keeps its title).

    Raises:
        Busy: nothing was removed.
    """
    _refuse_when_busy(conversation, CLEAR_BUSY, CLEAR_BUSY)
    async_to_sync(open_session(conversation.session_id).clear_session)()
    conversation.touch()
    # Nobody has answered any more: the conversation's own agent answers next.
    conversation.hand_to(None)
    events.changed_on_commit(conversation.pk)


def rename(conversation: Conversation, title: str) -> str:
    """Give the conversation `title` (its spaces collapsed; "" removes it); the title kept."""
    conversation.title = " ".join(title.split())
    # Renaming is not activity: the list keeps its order.
    conversation.save(update_fields=["title"])
    return conversation.title
