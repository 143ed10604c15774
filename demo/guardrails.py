"""The demo's guardrail: a card number pasted into the chat is refused before any model reads it.

It runs before the agent (`run_in_parallel=False`), so a refused message never reaches the
model and nothing streams; the run ends as "guardrail" with the guardrail's `output_info` as
the message the user reads (see `engine.runs.guardrail_message`).
"""

from __future__ import annotations

from typing import Any

from agents import Agent, GuardrailFunctionOutput, RunContextWrapper, input_guardrail
from agents.items import TResponseInputItem

from conversations.items import is_user_message, message_text
from tracing.redaction import contains_card

CARD_REFUSED = (
    "Please don't paste card numbers here: this chat is stored and read by the people who "
    "review requests, and the shop never needs your card number to help with an order. Your "
    "message was not sent to the agent; send it again without the number."
)


def latest_user_text(input: str | list[TResponseInputItem]) -> str:
    """The newest user message of what a guardrail is given (a session's whole history,
    then the new message): earlier messages were checked when they were sent."""
    if isinstance(input, str):
        return input
    for item in reversed(input):
        if is_user_message(item):
            return message_text(item)
    return ""


@input_guardrail(name="no card numbers", run_in_parallel=False)
def no_card_numbers(
    context: RunContextWrapper[Any], agent: Agent[Any], input: str | list[TResponseInputItem]
) -> GuardrailFunctionOutput:
    found = contains_card(latest_user_text(input))
    return GuardrailFunctionOutput(
        output_info={"message": CARD_REFUSED} if found else None, tripwire_triggered=found
    )
