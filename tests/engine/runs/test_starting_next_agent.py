"""The conversation continues with the agent that answered (`engine/runs/starting.py`, the rules
on `Conversation`).

Each turn starts with the agent that answered the turn before (`result.last_agent`, stored
on the conversation as a registry name: "scripted/Billing" after a handoff to Billing); a
run that pauses there resumes on that same agent, with the fingerprint of its graph.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from agents import Agent
from agents.handoffs import handoff
from agents.testing import ScriptedModel, assistant_message, function_call
from django.test import Client

from approvals.models import ApprovalOrigin
from conversations.consumers import _render_run
from conversations.models import Conversation
from conversations.session import DjangoSession
from demo import agents as demo
from demo.model import decide
from engine import registry, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.conftest import Traces
from tests.factories import make_conversation, make_reviewer
from tracing.models import Span

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_registry")]


def desk(front_steps: list[Any], billing_steps: list[Any]) -> tuple[Agent[Any], Agent[Any]]:
    """Front hands billing questions to Billing, which can wire money and hands back."""
    billing: Agent[Any] = Agent(
        name="Billing", model=ScriptedModel(billing_steps), tools=[scripted.wire_money]
    )
    front: Agent[Any] = Agent(name="Front", model=ScriptedModel(front_steps), handoffs=[billing])
    billing.handoffs.append(front)
    return front, billing


def say(text: str) -> list[Any]:
    return [assistant_message(text, item_id=f"msg_{uuid.uuid4().hex}")]


def call(name: str, arguments: dict[str, Any] | None = None) -> list[Any]:
    return [function_call(name, arguments or {}, call_id=f"call_{uuid.uuid4().hex}")]


def turn(conversation: Conversation, text: str) -> AgentRun:
    run = runs.start_run(conversation, text, conversation.owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    conversation.refresh_from_db()
    return run


def first_agent_span(traces: Traces, run: AgentRun) -> str:
    traces.flush()
    span = Span.objects.filter(trace_id=run.trace_id, span_type="agent").order_by(
        "started_at", "pk"
    )
    return span.values_list("name", flat=True).first() or ""


@pytest.fixture
def alice_conversation(alice: Any) -> Conversation:
    return make_conversation(owner=alice, agent_name="scripted")


def test_the_turn_after_a_handoff_starts_with_billing_and_a_handoff_back_works(
    settings: Any, submitted: list, traces: Traces, alice_conversation: Conversation
) -> None:
    front, _ = desk(
        [call("transfer_to_billing"), say("Front again."), say("Hello from the front.")],
        [say("Billing here."), say("You were charged $5."), call("transfer_to_front")],
    )
    scripted.install(settings, front)
    conversation = alice_conversation

    first = turn(conversation, "I have a billing question")
    assert (first.status, first.agent_name) == (RunStatus.COMPLETED, "scripted")
    assert first.final_output == "Billing here."
    assert conversation.current_agent == "scripted/Billing"

    second = turn(conversation, "what was I charged?")
    assert second.agent_name == "scripted/Billing"  # the turn started with Billing
    assert second.final_output == "You were charged $5."
    assert first_agent_span(traces, second) == "Billing"

    back = turn(conversation, "I need the front desk")
    assert back.final_output == "Front again."
    # Its own agent answers next, stored as after an undo or a clear.
    assert (conversation.current_agent, conversation.answering_agent) == ("", "scripted")

    after = turn(conversation, "hello")
    assert after.agent_name == "scripted"
    assert after.final_output == "Hello from the front."
    assert first_agent_span(traces, after) == "Front"


def test_the_chat_header_shows_who_is_answering(
    settings: Any, submitted: list, alice_conversation: Conversation
) -> None:
    front, _ = desk([call("transfer_to_billing")], [say("Billing here.")])
    scripted.install(settings, front)
    conversation = alice_conversation
    client = Client()
    client.force_login(conversation.owner)
    chip = 'data-testid="answering" title="Who is answering">{}</span>'

    first = client.get(f"/chats/{conversation.session_id}/").text
    assert chip.format("Front") in first
    assert "Ask <strong>Front</strong> anything." in first
    assert 'placeholder="Message Front…"' in first
    run = turn(conversation, "I have a billing question")

    after = client.get(f"/chats/{conversation.session_id}/").text
    assert chip.format("Billing") in after
    assert 'placeholder="Message Billing…"' in after  # the composer names who answers too
    # So does the messages' re-read (a reconnect's, or the waiting block's), out of band.
    history = client.get(f"/chats/{conversation.session_id}/history/").text
    assert 'hx-swap-oob="true">Billing</span>' in history
    # The push at the end of the turn carries it too, so the open page changes without a reload.
    items = asyncio.run(DjangoSession(conversation.session_id).get_items())
    pushed = _render_run(conversation.pk, run.pk, items, False)
    assert (
        '<span id="agent-chip" class="agent-chip" data-testid="answering" '
        'title="Who is answering" hx-swap-oob="true">Billing</span>'
    ) in pushed


def test_a_pause_after_a_handoff_resumes_on_billing_and_the_inbox_names_it(
    settings: Any, submitted: list, alice_conversation: Conversation
) -> None:
    front, billing = desk(
        [call("transfer_to_billing")],
        [say("Billing here."), call("wire_money", {"account": "acme", "amount": 5}), say("Sent.")],
    )
    scripted.install(settings, front)
    conversation = alice_conversation
    turn(conversation, "I have a billing question")

    run = turn(conversation, "send acme 5")
    assert run.status == RunStatus.WAITING, run.error
    assert run.agent_name == "scripted/Billing"
    assert run.agent_fingerprint == registry.fingerprint(billing)
    request = run.approval_requests.get()
    # Billing's own tool, in a turn that started with Billing: not "after a handoff".
    assert (request.agent_name, request.origin) == ("Billing", ApprovalOrigin.TOOL)

    rita = make_reviewer()
    reviewer = Client()
    reviewer.force_login(rita)
    inbox = reviewer.get("/inbox/").text
    assert '<span class="chip">Billing</span>' in inbox

    runs.decide(request, rita, runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Sent."
    assert scripted.EXECUTED == [("wire_money", ("acme", 5))]
    conversation.refresh_from_db()
    assert conversation.current_agent == "scripted/Billing"


def test_a_changed_billing_fails_the_paused_run_closed(
    settings: Any, submitted: list, alice_conversation: Conversation, monkeypatch: Any
) -> None:
    front, billing = desk(
        [call("transfer_to_billing")],
        [say("Billing here."), call("wire_money", {"account": "acme", "amount": 5}), say("Sent.")],
    )
    scripted.install(settings, front)
    conversation = alice_conversation
    turn(conversation, "I have a billing question")
    run = turn(conversation, "send acme 5")
    assert run.status == RunStatus.WAITING, run.error

    monkeypatch.setattr(billing, "tools", [scripted.delete_account])  # a deploy changed it
    runs.decide(run.approval_requests.get(), make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "The agent changed since this run paused" in run.error
    assert scripted.EXECUTED == []


def test_an_agent_no_longer_reachable_gives_the_conversation_back_to_its_own(
    settings: Any, submitted: list, alice_conversation: Conversation
) -> None:
    front, _ = desk([say("Front here.")], [])
    scripted.install(settings, front)
    conversation = alice_conversation
    Conversation.objects.filter(pk=conversation.pk).update(current_agent="scripted/Gone")
    conversation.refresh_from_db()

    run = turn(conversation, "hello")
    assert run.agent_name == "scripted"
    assert run.final_output == "Front here."


def test_undo_and_clear_give_the_turn_back_to_the_agent_before(
    settings: Any, submitted: list, alice_conversation: Conversation
) -> None:
    front, _ = desk([say("Front here."), call("transfer_to_billing")], [say("Billing here.")])
    scripted.install(settings, front)
    conversation = alice_conversation
    client = Client()
    client.force_login(conversation.owner)
    turn(conversation, "hello")
    turn(conversation, "I have a billing question")
    assert conversation.current_agent == "scripted/Billing"

    client.post(f"/chats/{conversation.session_id}/undo/")
    conversation.refresh_from_db()
    assert conversation.current_agent == ""  # the undone turn had started with Front

    Conversation.objects.filter(pk=conversation.pk).update(current_agent="scripted/Billing")
    client.post(f"/chats/{conversation.session_id}/clear/")
    conversation.refresh_from_db()
    assert conversation.current_agent == ""


def test_registry_names_a_handoff_target_from_the_registered_agent(settings: Any) -> None:
    front, billing = desk([], [])
    scripted.install(settings, front)

    assert registry.public_name("scripted", front) == "scripted"
    assert registry.public_name("scripted", billing) == "scripted/Billing"
    assert registry.get_agent("scripted/Billing") is billing
    assert registry.public_name("scripted", Agent(name="Stranger")) is None
    with pytest.raises(registry.UnknownAgent):
        registry.get_agent("scripted/Stranger")
    assert registry.display_name("scripted/Billing") == "Billing"


def test_the_demo_billing_hands_back_to_the_support_desk() -> None:
    handoffs = [handoff(other) for other in demo.billing.handoffs if isinstance(other, Agent)]
    reply = decide(
        [{"role": "user", "content": "I have a support desk question"}],
        demo.billing.tools,
        handoffs,
    )
    assert getattr(reply, "name", "") == "transfer_to_support_desk"
