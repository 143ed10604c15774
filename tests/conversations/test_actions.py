"""The conversation's actions (`conversations/actions.py`) and the rules on `Conversation` they
use: what each action does, and each refusal with its data and its sentence. The pages and the
API around them are tested in tests/conversations/test_views*.py and
tests/api/test_endpoints.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db import transaction
from django.http import Http404

from conversations import actions
from conversations.models import Branch, BusyWith, Conversation, SessionItem
from conversations.session import AuditedEncryptedSession, DjangoSession, open_session
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_run, user_message

# The session store writes through threads of its own: they see only committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("submitted")]


@pytest.fixture
def conversation(conversation: Conversation) -> Conversation:
    """alice's conversation with the support desk, here with two turns, each answered."""
    for question, answer in [("where is order 44", "On its way."), ("and 46?", "Delivered.")]:
        SessionItem.objects.create(conversation=conversation, payload=user_message(question))
        reply = {"role": "assistant", "content": answer}
        SessionItem.objects.create(conversation=conversation, payload=reply)
    return conversation


def user_texts(conversation: Conversation, branch: str = "main") -> list[str]:
    items = asyncio.run(DjangoSession(conversation.session_id).get_items(branch_id=branch))
    return [item["content"] for item in items if item.get("role") == "user"]


def busy_with(conversation: Conversation, status: str) -> AgentRun:
    return make_run(conversation=conversation, status=status, input="and 46?")


def answered_by_billing(conversation: Conversation) -> AgentRun:
    """Her second message's turn started with Billing (a handoff target of the desk)."""
    return make_run(
        conversation=conversation,
        input="and 46?",
        agent_name="support/Billing",
        status=RunStatus.COMPLETED,
    )


# --- the rules on Conversation --------------------------------------------------------------


def test_it_tells_why_a_conversation_is_busy(conversation: Conversation) -> None:
    assert conversation.busy_with() is None
    run = busy_with(conversation, RunStatus.RUNNING)
    assert conversation.busy_with() is BusyWith.WORKING
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.WAITING)
    assert conversation.busy_with() is BusyWith.WAITING
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
    assert conversation.busy_with() is None
    # The composer's words for each, and the run's status they are read from.
    assert BusyWith.WAITING == RunStatus.WAITING


def test_it_locks_a_conversation_and_says_which_version_it_is_on(
    conversation: Conversation,
) -> None:
    gone = make_conversation()
    Conversation.objects.filter(pk=gone.pk).delete()
    with transaction.atomic():
        assert conversation.lock() == "main"
        with pytest.raises(Conversation.DoesNotExist):
            gone.lock()


def test_it_hands_the_next_message_to_an_agent_or_back_to_its_own(
    conversation: Conversation,
) -> None:
    assert conversation.answering_agent == "support"
    conversation.hand_to("support/Billing")
    conversation.refresh_from_db()
    assert conversation.current_agent == "support/Billing"
    assert conversation.answering_agent == "support/Billing"
    conversation.hand_to("support")  # its own agent: stored as none
    conversation.refresh_from_db()
    assert conversation.current_agent == ""
    assert conversation.answering_agent == "support"


# --- every action but rename, while the conversation is busy -------------------------------

# Each action, and what it tells the person while the agent works, and while a request waits.
WHILE_BUSY: dict[str, tuple[Any, str, str]] = {
    "send": (
        lambda c, user: actions.send(c, user, "and 42?"),
        actions.BUSY_WORKING,
        actions.BUSY_WAITING,
    ),
    "edit": (
        lambda c, user: actions.edit(c, user, turn=1, text="hi", shown="main"),
        actions.EDIT_BUSY,
        actions.EDIT_WAITING,
    ),
    "switch": (lambda c, user: actions.switch_version(c, "main"), *[actions.SWITCH_BUSY] * 2),
    "undo": (lambda c, user: actions.undo(c), actions.UNDO_WORKING, actions.UNDO_WAITING),
    "clear": (lambda c, user: actions.clear(c), *[actions.CLEAR_BUSY] * 2),
}


@pytest.mark.parametrize("action", list(WHILE_BUSY))
@pytest.mark.parametrize(
    "status", [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.WAITING]
)
def test_it_is_refused_while_the_conversation_is_busy_saying_why(
    conversation: Conversation, alice: Any, action: str, status: str
) -> None:
    busy_with(conversation, status)
    act, working, waiting = WHILE_BUSY[action]

    with pytest.raises(actions.Busy) as refused:
        act(conversation, alice)

    is_waiting = status == RunStatus.WAITING
    assert refused.value.waiting is is_waiting
    assert refused.value.why == ("waiting" if is_waiting else "working")
    assert str(refused.value) == (waiting if is_waiting else working)
    # Nothing changed.
    assert AgentRun.objects.count() == 1
    assert SessionItem.objects.filter(branch="main").count() == SessionItem.objects.count() == 4
    assert not Branch.objects.exists()


# --- send -----------------------------------------------------------------------------------


def test_send_queues_a_run_on_the_text(
    conversation: Conversation, alice: Any, submitted: list
) -> None:
    run = actions.send(conversation, alice, "  and order 42?  ", shown="main")

    assert run.status == RunStatus.QUEUED and run.input == "and order 42?"
    assert run.requested_by == alice and run.agent_name == "support"
    assert submitted == [("execute", run.pk)]


def test_send_is_refused_when_the_page_showed_another_version(
    conversation: Conversation, alice: Any
) -> None:
    with pytest.raises(actions.VersionMoved) as refused:
        actions.send(conversation, alice, "and order 42?", shown="edit-1")

    assert (refused.value.shown, refused.value.current) == ("edit-1", "main")
    assert str(refused.value) == actions.SEND_MOVED
    assert not AgentRun.objects.exists()


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("   ", "The message is empty."),
        ("x" * (runs.MAX_INPUT_CHARS + 1), "The message is too long (20001 characters; at most"),
    ],
)
def test_send_refuses_an_empty_or_too_long_message(
    conversation: Conversation, alice: Any, text: str, sentence: str
) -> None:
    with pytest.raises(actions.InvalidMessage, match=sentence.replace("(", r"\(")):
        actions.send(conversation, alice, text)
    assert not AgentRun.objects.exists()


def test_send_is_refused_past_the_rate_limit_with_when_to_try_again(
    conversation: Conversation, alice: Any, settings: Any
) -> None:
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 1
    make_run(requested_by=alice, status=RunStatus.COMPLETED)  # in another conversation

    with pytest.raises(actions.RateLimited) as refused:
        actions.send(conversation, alice, "and order 42?")

    wait = refused.value.retry_after
    assert isinstance(wait, int) and 1 <= wait <= 60
    assert str(refused.value).endswith(f"Try again in {wait} second{'s' if wait != 1 else ''}.")
    assert not AgentRun.objects.filter(conversation=conversation).exists()


def test_send_is_refused_when_the_agent_is_gone(alice: Any) -> None:
    conversation = make_conversation(owner=alice, agent_name="retired")

    with pytest.raises(actions.AgentGone) as refused:
        actions.send(conversation, alice, "hello")

    assert refused.value.agent_name == "retired"
    assert str(refused.value) == actions.AGENT_GONE.format(agent_name="retired")


def test_an_action_on_a_conversation_deleted_meanwhile_is_a_404(
    conversation: Conversation, alice: Any
) -> None:
    Conversation.objects.filter(pk=conversation.pk).delete()
    with pytest.raises(Http404):
        actions.send(conversation, alice, "hello")


# --- edit -----------------------------------------------------------------------------------


def test_edit_forks_at_the_message_and_sends_the_edited_text_there(
    conversation: Conversation, alice: Any
) -> None:
    answered_by_billing(conversation)

    edited = actions.edit(conversation, alice, turn=2, text="and 42?", shown="main")

    assert edited.branch == "edit-1"
    assert edited.run.input == "and 42?" and edited.run.status == RunStatus.QUEUED
    conversation.refresh_from_db()
    assert conversation.current_branch == "edit-1"
    # The agent that message was sent to answers the edited one.
    assert conversation.current_agent == "support/Billing"
    assert edited.run.agent_name == "support/Billing"
    assert user_texts(conversation, "edit-1") == ["where is order 44"]
    assert user_texts(conversation) == ["where is order 44", "and 46?"]  # kept as it was


def test_edit_is_refused_when_the_page_showed_another_version(
    conversation: Conversation, alice: Any
) -> None:
    with pytest.raises(actions.VersionMoved) as refused:
        actions.edit(conversation, alice, turn=1, text="hi", shown="edit-3")

    assert (refused.value.shown, refused.value.current) == ("edit-3", "main")
    assert str(refused.value) == actions.EDIT_MOVED


@pytest.mark.parametrize("turn", [0, 3, 10**12])
def test_edit_is_refused_for_a_message_the_version_does_not_have(
    conversation: Conversation, alice: Any, turn: int
) -> None:
    with pytest.raises(actions.NoSuchTurn) as refused:
        actions.edit(conversation, alice, turn=turn, text="hi", shown="main")

    assert refused.value.turn == turn
    assert str(refused.value) == actions.NO_SUCH_TURN.format(turn=turn)


def test_a_refused_edited_text_leaves_no_new_version(
    conversation: Conversation, alice: Any
) -> None:
    with pytest.raises(actions.InvalidMessage):
        actions.edit(conversation, alice, turn=1, text=" ", shown="main")

    assert not Branch.objects.exists()
    conversation.refresh_from_db()
    assert conversation.current_branch == "main"
    assert SessionItem.objects.filter(branch="main").count() == 4
    assert SessionItem.objects.count() == 4


# --- switch version -------------------------------------------------------------------------


def test_switching_versions_hands_the_next_message_to_that_version_s_agent(
    conversation: Conversation, alice: Any
) -> None:
    answered_by_billing(conversation)
    edited = actions.edit(conversation, alice, turn=2, text="and 42?", shown="main")
    AgentRun.objects.filter(pk=edited.run.pk).update(
        status=RunStatus.COMPLETED, agent_name="support"
    )

    actions.switch_version(conversation, "main")
    conversation.refresh_from_db()
    assert (conversation.current_branch, conversation.current_agent) == ("main", "support/Billing")

    actions.switch_version(conversation, "edit-1")
    conversation.refresh_from_db()
    assert (conversation.current_branch, conversation.current_agent) == ("edit-1", "")


def test_switching_to_a_version_that_has_no_messages_is_refused(
    conversation: Conversation,
) -> None:
    with pytest.raises(actions.NoSuchVersion) as refused:
        actions.switch_version(conversation, "edit-9")

    assert refused.value.branch == "edit-9" and str(refused.value) == actions.NO_SUCH_BRANCH
    conversation.refresh_from_db()
    assert conversation.current_branch == "main"


# --- undo, clear, rename --------------------------------------------------------------------


def test_undo_takes_the_last_exchange_back_and_hands_back_its_agent(
    conversation: Conversation,
) -> None:
    answered_by_billing(conversation)
    before = conversation.updated

    assert actions.undo(conversation) == 2

    assert user_texts(conversation) == ["where is order 44"]
    conversation.refresh_from_db()
    assert conversation.current_agent == "support/Billing"
    assert conversation.updated > before


def test_undo_with_nothing_to_undo_removes_nothing(alice: Any) -> None:
    assert actions.undo(make_conversation(owner=alice)) == 0


def test_undo_never_removes_an_item_it_cannot_decrypt(alice: Any, settings: Any) -> None:
    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()
    conversation = make_conversation(owner=alice)
    asyncio.run(open_session(conversation.session_id).add_items([user_message("first")]))
    other_key = Fernet.generate_key().decode()
    session = DjangoSession(conversation.session_id)
    written_elsewhere = AuditedEncryptedSession(conversation.session_id, session, other_key)
    asyncio.run(written_elsewhere.add_items([user_message("under another key")]))

    with pytest.raises(actions.Unreadable) as refused:
        actions.undo(conversation)

    assert str(refused.value) == actions.UNREADABLE
    assert SessionItem.objects.count() == 2


def test_clear_empties_every_version_and_gives_the_conversation_back_to_its_agent(
    conversation: Conversation, alice: Any
) -> None:
    edited = actions.edit(conversation, alice, turn=2, text="and 42?", shown="main")
    AgentRun.objects.filter(pk=edited.run.pk).update(status=RunStatus.COMPLETED)
    conversation.hand_to("support/Billing")

    actions.clear(conversation)

    assert not SessionItem.objects.exists()
    conversation.refresh_from_db()
    assert conversation.current_agent == ""


def test_busy_says_what_a_message_sent_now_would_be_told(conversation: Conversation) -> None:
    assert actions.busy(conversation) is None
    busy_with(conversation, RunStatus.WAITING)
    refusal = actions.busy(conversation)
    assert refusal is not None and str(refusal) == actions.BUSY_WAITING


def test_rename_collapses_spaces_and_is_not_activity(conversation: Conversation) -> None:
    before = Conversation.objects.get(pk=conversation.pk).updated

    assert actions.rename(conversation, "  Order\n 44  ") == "Order 44"
    assert actions.rename(conversation, "   ") == ""

    conversation.refresh_from_db()
    assert conversation.title == "" and conversation.updated == before
