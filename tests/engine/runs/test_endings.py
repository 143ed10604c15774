"""Guardrails end a run cleanly: an input or output guardrail that trips ends the run as
"guardrail" with a message the user understands, the trace shows the guardrail span tripped
(and stays OK: the guardrail did its job), and the conversation takes the next message.

The demo's input guardrail refuses a pasted card number, on the offline demo model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, GuardrailFunctionOutput, input_guardrail, output_guardrail
from agents.testing import ScriptedModel, assistant_message
from django.test import Client
from django.urls import reverse

from conversations.session import DjangoSession
from demo.guardrails import CARD_REFUSED, latest_user_text
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_conversation
from tracing.models import Span, Trace, TraceStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]

CARD = "4111 1111 1111 1111"  # a test card number: it passes the Luhn check


def turn(conversation: Any, text: str, user: Any) -> AgentRun:
    run = runs.start_run(conversation, text, user)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def items_of(conversation: Any) -> list[dict[str, Any]]:
    return asyncio.run(DjangoSession(conversation.session_id).get_items())


def test_the_demo_guardrail_refuses_a_card_number_and_the_next_message_works(
    submitted: list, alice: Any, traces: Any
) -> None:
    conversation = make_conversation(owner=alice, agent_name="support")

    run = turn(conversation, f"my card is {CARD}, where is order 44?", alice)

    assert run.status == RunStatus.GUARDRAIL
    assert run.error == CARD_REFUSED
    assert run.error.startswith("Please don't paste card numbers here: ")
    assert run.finished is not None
    # Neither the session (which the agent and every later guardrail read) nor the run
    # keeps the number as it was pasted.
    assert items_of(conversation) == []
    assert CARD not in run.input and "[card]" in run.input
    # The trace: the guardrail tripped before any model was asked; the trace is OK.
    traces.flush()
    trace = Trace.objects.get(trace_id=run.trace_id)
    guardrail = Span.objects.get(trace=trace, span_type="guardrail")
    assert guardrail.span_data == {
        "type": "guardrail",
        "name": "no card numbers",
        "triggered": True,
    }
    assert not Span.objects.filter(trace=trace, span_type="generation").exists()
    assert trace.status == TraceStatus.OK
    assert trace.derived_status() == TraceStatus.OK
    # The chat says what happened, in the guardrail's words.
    client = Client()
    client.force_login(alice)
    page = client.get(reverse("chat", args=[conversation.session_id])).content.decode()
    assert "Please don&#x27;t paste card numbers here" in page
    assert "The agent failed" not in page and CARD not in page
    assert "Last message refused" in client.get(reverse("chats")).content.decode()

    again = turn(conversation, "where is order 44", alice)

    assert again.status == RunStatus.COMPLETED, again.error
    assert "shipped" in again.final_output
    assert [i.get("content") for i in items_of(conversation)][0] == "where is order 44"


def test_numbers_that_are_no_card_pass_the_demo_guardrail(submitted: list, alice: Any) -> None:
    conversation = make_conversation(owner=alice, agent_name="support")
    run = turn(conversation, "refund 30 on order 42, ref 1234 5678", alice)
    assert run.status != RunStatus.GUARDRAIL, run.error


def test_the_guardrail_reads_only_the_newest_message() -> None:
    history = [
        {"role": "user", "content": f"old {CARD}"},
        {"type": "message", "role": "assistant", "content": "ok"},
        {"role": "user", "content": "new"},
    ]
    assert latest_user_text(history) == "new"
    assert latest_user_text("plain") == "plain"


@output_guardrail(name="no promises")
def no_promises(context: Any, agent: Agent[Any], output: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(
        output_info="The reply made a promise the shop can't keep, so it was held back.",
        tripwire_triggered="promise" in str(output),
    )


@input_guardrail(name="quiet check", run_in_parallel=False)
def quiet_check(context: Any, agent: Agent[Any], input: Any) -> GuardrailFunctionOutput:
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered=True)


def test_an_output_guardrail_ends_the_run_with_its_own_words(
    submitted: list, settings: Any, alice: Any
) -> None:
    agent: Agent[Any] = Agent(
        name="Promiser",
        model=ScriptedModel([[assistant_message("I promise a refund tomorrow.")]]),
        output_guardrails=[no_promises],
    )
    name = scripted.install(settings, agent)
    conversation = make_conversation(owner=alice, agent_name=name)

    run = turn(conversation, "will I get my money?", alice)

    assert run.status == RunStatus.GUARDRAIL
    assert run.error == "The reply made a promise the shop can't keep, so it was held back."
    assert run.input == "will I get my money?"  # an output guardrail: the message stays
    # The reply held back is not kept where the chat (or the next turn) would read it.
    assert items_of(conversation) == [{"role": "user", "content": "will I get my money?"}]
    assert not AgentRun.objects.filter(conversation=conversation).busy().exists()


def test_a_guardrail_without_words_gets_a_plain_sentence_naming_it(
    submitted: list, settings: Any, alice: Any
) -> None:
    agent: Agent[Any] = Agent(
        name="Checked",
        model=ScriptedModel([[assistant_message("never said")]]),
        input_guardrails=[quiet_check],
    )
    name = scripted.install(settings, agent)
    conversation = make_conversation(owner=alice, agent_name=name)

    run = turn(conversation, "hello", alice)

    assert run.status == RunStatus.GUARDRAIL
    assert run.error == runs.GUARDRAIL_INPUT_MESSAGE.format(name="quiet check")
    assert "failed" not in run.error
