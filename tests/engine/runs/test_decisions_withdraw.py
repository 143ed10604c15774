"""Withdraw: the person who asked takes back a request that waits for a reviewer.

It is closed as withdrawn, audited as a decision by that person (who, when), leaves every open
inbox, and the run resumes with the call rejected, so the agent answers and the conversation
is free again. A reviewer's click a moment later is told "Withdrawn by alice at ...", and a
withdraw racing approvals (threads, each its own connection) lets exactly one of them win.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from conversations.actions import BUSY_WAITING, UNDO_WAITING, UNDO_WORKING
from engine import events, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.approvals.test_consumers import open_socket
from tests.engine.runs.test_decisions_race import race
from tests.factories import make_reviewer, make_user, session_items
from tracing import recording
from tracing.models import Span

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]

ROUNDS = 12
_calls = itertools.count(1)


def deleting_agent() -> tuple[Agent[Any], str]:
    """An agent whose first step asks to delete an account (approval needed); it then says
    what the tool answered."""
    call_id = f"call_withdraw_{next(_calls)}"
    agent: Agent[Any] = Agent(
        name="Deleter",
        model=ScriptedModel(
            [
                [function_call("delete_account", {"account": "acme"}, call_id=call_id)],
                [assistant_message("Understood.")],
            ]
        ),
        tools=[scripted.delete_account],
    )
    return agent, call_id


def paused_for(owner: Any, settings: Any) -> tuple[AgentRun, ApprovalRequest]:
    agent, _ = deleting_agent()
    run = scripted.executed(scripted.start(settings, agent, "delete acme", owner))
    assert run.status == RunStatus.WAITING, run.error
    return run, run.approval_requests.get()


def test_it_withdraws_audited_with_who_and_when_and_the_run_answers(
    submitted: list, settings: Any, alice: Any
) -> None:
    run, request = paused_for(alice, settings)

    decision = runs.withdraw(request, alice)

    request.refresh_from_db()
    assert request.status == ApprovalStatus.WITHDRAWN
    assert request.decided_by == alice
    assert request.decided_at is not None
    audit = ApprovalDecision.objects.get(request=request)
    assert audit == decision
    assert (audit.reviewer, audit.withdrawn, audit.approved) == (alice, True, False)
    assert audit.created is not None
    assert str(audit).startswith("alice withdrew delete_account")
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RESUMING
    assert submitted[-1] == ("resume", run.pk)
    # The trace shows it as the decision span does any decision: who, and that it was withdrawn.
    span = Span.objects.get(trace__trace_id=run.trace_id, name=recording.DECISION_SPAN_NAME)
    assert (span.data["reviewer"], span.data["decision"]) == ("alice", "withdrawn")

    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert scripted.EXECUTED == []  # the withdrawn call never ran
    outputs = [i for i in session_items(run) if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == [runs.WITHDRAWN_MESSAGE]
    assert "The user withdrew this request" in runs.WITHDRAWN_MESSAGE
    # The conversation is free again.
    assert not AgentRun.objects.filter(conversation=run.conversation).busy().exists()


def test_a_reviewer_approving_a_moment_later_is_told_it_was_withdrawn(
    submitted: list, settings: Any, alice: Any
) -> None:
    _, request = paused_for(alice, settings)
    rita = make_reviewer()
    runs.withdraw(request, alice)

    with pytest.raises(runs.AlreadyDecided, match=r"^Withdrawn by alice at \d{4}-\d\d-\d\d "):
        runs.decide(request.pk, rita, runs.Decision.approve())

    client = Client()
    client.force_login(rita)
    page = client.post(
        reverse("inbox_decide", args=[request.pk]),
        {"action": "approve", "seen_hash": request.arguments_hash},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"request-{request.pk}",
    )
    assert page.status_code == 200
    assert "Withdrawn by alice at " in page.content.decode()
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert scripted.EXECUTED == []
    # The history lists it as withdrawn, by alice.
    history = client.get(reverse("inbox_history")).content.decode()
    assert '<span class="state state-withdrawn">Withdrawn</span>' in history


def test_only_the_person_who_asked_can_withdraw(submitted: list, settings: Any, alice: Any) -> None:
    _, request = paused_for(alice, settings)
    for someone in (make_user(username="mallory"), make_reviewer(), None):
        with pytest.raises(runs.DecisionRefused, match="Only the person who asked"):
            runs.withdraw(request, someone)
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING
    # Through the page, another person's conversation is not found at all.
    client = Client()
    client.force_login(make_user(username="bob"))
    url = reverse("chat_withdraw", args=[request.run.conversation.session_id, request.pk])
    assert client.post(url).status_code == 404


def test_withdraw_racing_approvals_makes_one_decision_and_a_withdrawn_call_never_runs(
    submitted: list, settings: Any, alice: Any
) -> None:
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 0
    reviewers = [make_reviewer(f"reviewer{n}") for n in range(3)]
    wins = {"withdraw": 0, "approve": 0}
    for _ in range(ROUNDS):
        scripted.EXECUTED.clear()
        run, request = paused_for(alice, settings)

        def withdrawing(request: ApprovalRequest = request) -> str:
            try:
                runs.withdraw(request.pk, alice)
            except runs.AlreadyDecided as refusal:
                return str(refusal)
            return "won"

        def approving(reviewer: Any, request: ApprovalRequest = request) -> Any:
            def decide() -> str:
                try:
                    runs.decide(request.pk, reviewer, runs.Decision.approve())
                except runs.AlreadyDecided as refusal:
                    return str(refusal)
                return "won"

            return decide

        outcomes = race(withdrawing, *(approving(r) for r in reviewers))

        assert [o for o in outcomes if not isinstance(o, str)] == []
        assert outcomes.count("won") == 1
        request.refresh_from_db()
        assert ApprovalDecision.objects.filter(request=request).count() == 1
        assert submitted.count(("resume", run.pk)) == 1
        asyncio.run(runs.resume(run.pk))
        run.refresh_from_db()
        assert run.status == RunStatus.COMPLETED, run.error
        if outcomes[0] == "won":
            wins["withdraw"] += 1
            assert request.status == ApprovalStatus.WITHDRAWN
            assert all(o.startswith("Withdrawn by alice at ") for o in outcomes[1:])
            assert scripted.EXECUTED == []
        else:
            wins["approve"] += 1
            assert request.status == ApprovalStatus.APPROVED
            assert outcomes[0].startswith("Already approved by reviewer")
            assert scripted.EXECUTED == [("delete_account", "acme")]
    assert sum(wins.values()) == ROUNDS


def test_the_chat_shows_withdraw_and_the_refusals_say_what_applies(
    submitted: list, settings: Any, alice: Any
) -> None:
    run, request = paused_for(alice, settings)
    client = Client()
    client.force_login(alice)
    session_id = run.conversation.session_id
    page = client.get(reverse("chat", args=[session_id])).content.decode()
    url = reverse("chat_withdraw", args=[session_id, request.pk])
    assert f'action="{url}"' in page
    assert 'data-testid="withdraw"' in page

    send = client.post(reverse("chat_send", args=[session_id]), {"text": "hello?"})
    assert BUSY_WAITING.replace("'", "&#x27;") in send.content.decode()
    undo = client.post(reverse("chat_undo", args=[session_id]), follow=True)
    assert UNDO_WAITING.replace("'", "&#x27;") in undo.content.decode()
    assert "withdraw" in UNDO_WAITING and "withdrawn the request" in BUSY_WAITING

    withdrawn = client.post(url, HTTP_HX_REQUEST="true")
    assert "Withdrawn. The agent is answering without it" in withdrawn.content.decode()
    again = client.post(url, HTTP_HX_REQUEST="true")
    assert "Withdrawn by alice at " in again.content.decode()
    # Without htmx: the chat page, with the answer as a flash.
    plain = client.post(url, follow=True)
    assert "Withdrawn by alice at " in plain.content.decode()

    # While the agent works, an undo says to wait or stop.
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    working = client.post(reverse("chat_undo", args=[session_id]), follow=True)
    assert UNDO_WORKING.replace("'", "&#x27;") in working.content.decode()


async def test_a_withdraw_removes_the_row_from_every_open_inbox(
    submitted: list, settings: Any, alice: Any, fresh_layer: None
) -> None:
    run, request = await sync_to_async(paused_for)(alice, settings)
    rita = await sync_to_async(make_reviewer)()
    socket, connected = await open_socket(rita)
    assert connected
    chat = await get_channel_layer().new_channel()
    await get_channel_layer().group_add(events.conversation_group(run.conversation_id), chat)

    await sync_to_async(runs.withdraw)(request.pk, alice)

    frame = await socket.receive_from(timeout=3)
    assert f'<li id="request-{request.pk}" hx-swap-oob="delete"></li>' in frame
    seen = await asyncio.wait_for(get_channel_layer().receive(chat), 3)
    assert seen["type"] == "approval.withdrawn"
    await socket.disconnect()
