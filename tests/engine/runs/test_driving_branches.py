"""The run engine on branches: a run belongs to the branch its conversation was on when it
started, writes its turn there, and stores what the turn used there (the SDK's
`store_run_usage`), in its final write."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conversations.models import Conversation, TurnUsage
from conversations.session import DjangoSession
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_reviewer, make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def run_turn(conversation: Conversation, text: str, owner: Any) -> AgentRun:
    run = runs.start_run(conversation, text, owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def user_texts(session_id: str, branch: str | None = None) -> list[str]:
    items = asyncio.run(DjangoSession(session_id).get_items(branch_id=branch))
    return [item["content"] for item in items if item.get("role") == "user"]


def test_a_completed_run_stores_its_turns_usage(submitted: list) -> None:
    chen = make_user(username="chen")
    conversation = make_conversation(owner=chen)
    run_turn(conversation, "where is order 7", chen)
    run = run_turn(conversation, "and where is order 7 now", chen)
    assert run.status == RunStatus.COMPLETED, run.error

    usage = TurnUsage.objects.get(conversation=conversation, turn=2)
    assert usage.branch == "main" and usage.run_id == run.pk
    assert (usage.requests, usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        run.usage["requests"],
        run.usage["input_tokens"],
        run.usage["output_tokens"],
        run.usage["total_tokens"],
    )
    assert usage.requests >= 2
    assert TurnUsage.objects.filter(conversation=conversation).count() == 2
    assert set(AgentRun.objects.values_list("branch", flat=True)) == {"main"}


def test_a_paused_run_stores_what_it_used_and_its_resumption_the_whole(submitted: list) -> None:
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice)
    run = run_turn(conversation, "cancel order 42", alice)
    assert run.status == RunStatus.WAITING, run.error
    paused = TurnUsage.objects.get(conversation=conversation, turn=1)
    assert paused.requests == run.usage["requests"] and paused.run_id == run.pk

    runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    whole = TurnUsage.objects.get(conversation=conversation, turn=1)
    assert whole.requests == run.usage["requests"] > paused.requests
    assert whole.total_tokens == run.usage["total_tokens"]


def test_a_run_started_on_a_branch_writes_and_counts_there(submitted: list) -> None:
    chen = make_user(username="chen")
    conversation = make_conversation(owner=chen)
    run_turn(conversation, "where is order 7", chen)
    run_turn(conversation, "is order 7 shipped", chen)
    asyncio.run(DjangoSession(conversation.session_id).create_branch_from_turn(2, "edit-1"))

    run = run_turn(conversation, "is order 7 late", chen)

    assert run.status == RunStatus.COMPLETED, run.error
    assert AgentRun.objects.get(pk=run.pk).branch == "edit-1"
    session_id = conversation.session_id
    assert user_texts(session_id) == ["where is order 7", "is order 7 late"]
    assert user_texts(session_id, "main") == ["where is order 7", "is order 7 shipped"]
    assert (
        TurnUsage.objects.get(conversation=conversation, branch="edit-1", turn=2).run_id == run.pk
    )
    assert TurnUsage.objects.filter(conversation=conversation, branch="main").count() == 2


def test_a_run_keeps_its_branch_when_the_conversation_switches_under_it(submitted: list) -> None:
    chen = make_user(username="chen")
    conversation = make_conversation(owner=chen)
    run_turn(conversation, "where is order 7", chen)
    session = DjangoSession(conversation.session_id)
    asyncio.run(session.create_branch_from_turn(1, "edit-1"))
    queued = runs.start_run(conversation, "is order 7 late", chen)
    # Something that does not ask whether the conversation is busy switches it back.
    asyncio.run(session.switch_to_branch("main"))

    asyncio.run(runs.execute(queued.pk))

    queued.refresh_from_db()
    assert queued.status == RunStatus.COMPLETED, queued.error
    assert user_texts(conversation.session_id, "edit-1") == ["is order 7 late"]
    assert user_texts(conversation.session_id, "main") == ["where is order 7"]
    assert TurnUsage.objects.get(branch="edit-1", turn=1).run_id == queued.pk
