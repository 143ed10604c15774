"""The offline demo model on its own: what it answers to which conversation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from agents import Agent, ModelSettings, function_tool, handoff, set_trace_processors, trace
from agents.handoffs import Handoff
from agents.items import ModelResponse
from agents.models.interface import ModelTracing
from agents.tool import Tool
from agents.tracing import Span, Trace, TracingProcessor
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
)
from pydantic import Field

from demo.model import OfflineDemoModel
from tests.factories import user_message


@function_tool
def lookup_order(order_id: int) -> str:
    """Look up an order."""
    return "unused"


@function_tool
def cancel_order(order_id: int) -> str:
    """Cancel an order."""
    return "unused"


@function_tool
def issue_refund(order_id: int, amount: float) -> str:
    """Refund an order."""
    return "unused"


@function_tool
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email."""
    return "unused"


@function_tool
def research(input: str) -> str:
    """Research a policy."""
    return "unused"


@function_tool
def search_knowledge_base(query: str) -> str:
    """Search the knowledge base."""
    return "unused"


SUPPORT_TOOLS: list[Tool] = [lookup_order, cancel_order, issue_refund, send_email, research]
BILLING_TOOLS: list[Tool] = [lookup_order, issue_refund]


def make_handoffs() -> list[Handoff[Any, Any]]:
    return [handoff(Agent(name="Billing"))]


def make_call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(arguments),
    }


def make_output(output: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def make_assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


async def respond(
    input: str | list[Any],
    tools: list[Tool] | None = None,
    handoffs: list[Handoff[Any, Any]] | None = None,
) -> ModelResponse:
    return await OfflineDemoModel().get_response(
        "You are a test agent.",
        input,
        ModelSettings(),
        SUPPORT_TOOLS if tools is None else tools,
        None,
        make_handoffs() if handoffs is None else handoffs,
        ModelTracing.DISABLED,
        previous_response_id=None,
        conversation_id=None,
        prompt=None,
    )


def call_of(response: ModelResponse) -> tuple[str, dict[str, Any]]:
    [item] = response.output
    assert isinstance(item, ResponseFunctionToolCall)
    return item.name, json.loads(item.arguments)


def text_of(response: ModelResponse) -> str:
    [item] = response.output
    assert isinstance(item, ResponseOutputMessage)
    return "".join(getattr(part, "text", "") for part in item.content)


async def test_it_looks_up_an_order() -> None:
    assert call_of(await respond("where is order 7")) == ("lookup_order", {"order_id": 7})
    assert call_of(await respond("Status of order #7?")) == ("lookup_order", {"order_id": 7})


async def test_it_cancels_an_order() -> None:
    assert call_of(await respond("cancel order 42")) == ("cancel_order", {"order_id": 42})


async def test_it_reads_refund_amount_and_order_in_either_order() -> None:
    expected = ("issue_refund", {"order_id": 42, "amount": 80.0})
    assert call_of(await respond("refund 80 on order 42")) == expected
    assert call_of(await respond("refund order 42 80")) == expected
    assert call_of(await respond("please refund $80 for order #42")) == expected


async def test_it_sends_refund_amounts_as_json_floats() -> None:
    # An integer would not survive the SDK's unchanged-arguments check, and the approval
    # policy would then fail closed even for a small refund.
    response = await respond("refund 30 on order 42")
    [item] = response.output
    assert isinstance(item, ResponseFunctionToolCall)
    assert '"amount":30.0' in item.arguments.replace(" ", "")


async def test_it_asks_for_what_a_refund_lacks() -> None:
    assert "order number and the amount" in text_of(await respond("refund 30"))


async def test_it_writes_an_email_about_a_refund() -> None:
    name, arguments = call_of(await respond("email alice@example.com about my refund"))
    assert name == "send_email"
    assert arguments["to"] == "alice@example.com"
    assert "refund" in arguments["subject"].lower()
    assert "your refund" in arguments["body"]


async def test_it_hands_billing_questions_to_billing() -> None:
    assert call_of(await respond("I have a billing question")) == ("transfer_to_billing", {})


async def test_it_sends_research_requests_to_the_research_tool() -> None:
    assert call_of(await respond("research refund policy")) == (
        "research",
        {"input": "refund policy"},
    )


async def test_it_searches_the_knowledge_base_when_it_is_the_researcher() -> None:
    response = await respond("refund policy", tools=[search_knowledge_base], handoffs=[])
    assert call_of(response) == ("search_knowledge_base", {"query": "refund policy"})


async def test_it_only_calls_tools_it_was_given() -> None:
    text = text_of(await respond("cancel order 42", tools=BILLING_TOOLS, handoffs=[]))
    assert "can't cancel" in text
    assert "where is order 44" in text
    assert "cancel order 42" not in text


async def test_it_lists_what_it_can_do_for_anything_else() -> None:
    text = text_of(await respond("hello there"))
    for phrase in [
        "where is order 44",
        "cancel order 42",
        "refund 30 on order 42",
        "email alice@example.com about my refund",
        "research refund policy",
        "I have a billing question",
    ]:
        assert phrase in text


@function_tool
def book_leave(days: Annotated[int, Field(gt=0, le=30)], reason: str) -> str:
    """Book days of leave."""
    return f"Booked {days} days."


async def test_it_calls_any_tool_it_was_given_when_told_its_name_and_arguments() -> None:
    # Not one of the demo's phrases: a developer's own tool, driven without a model key.
    response = await respond(
        'call book_leave {"days": 3, "reason": "a wedding"}', tools=[book_leave], handoffs=[]
    )
    assert call_of(response) == ("book_leave", {"days": 3, "reason": "a wedding"})
    assert call_of(await respond("CALL lookup_order")) == ("lookup_order", {})


async def test_it_says_how_to_call_a_tool_it_has_no_phrase_for() -> None:
    text = text_of(await respond("hello", tools=[book_leave], handoffs=[]))

    # A placeholder for each required argument, within the schema's bounds (gt=0: 1).
    assert 'call book_leave {"days": 1, "reason": "…"}' in text
    assert "I have no tools" not in text


async def test_it_refuses_a_call_it_cannot_make_and_says_why() -> None:
    unknown = text_of(await respond('call book_holiday {"days": 3}', tools=[book_leave]))
    assert "no tool named “book_holiday”" in unknown
    assert "“book_leave”" in unknown

    broken = text_of(await respond("call book_leave {days: 3}", tools=[book_leave]))
    assert "not valid JSON" in broken
    assert 'call book_leave {"days": 1' in broken

    listed = text_of(await respond("call book_leave [3]", tools=[book_leave]))
    assert "must be a JSON object" in listed


async def test_it_answers_only_the_latest_user_message() -> None:
    history = [
        user_message("cancel order 42"),
        make_call("cancel_order", {"order_id": 42}),
        make_output("Order 42 (Burr coffee grinder) is now cancelled."),
        make_assistant("Cancellation: done."),
        user_message("where is order 7"),
    ]
    assert call_of(await respond(history)) == ("lookup_order", {"order_id": 7})


async def test_it_answers_a_tool_result_with_text_quoting_it() -> None:
    conversation = [
        user_message("where is order 7"),
        make_call("lookup_order", {"order_id": 7}),
        make_output("Order 7 for Chen Wei: headphones, $89.00, status shipped."),
    ]
    text = text_of(await respond(conversation))
    assert "“Order 7 for Chen Wei: headphones, $89.00, status shipped.”" in text


async def test_it_never_calls_a_second_tool_in_a_turn_that_has_a_result() -> None:
    # The result is unrelated to the question: a looping model would call lookup_order again.
    conversation = [
        user_message("where is order 7"),
        make_call("lookup_order", {"order_id": 7}),
        make_output("An error occurred while running the tool."),
    ]
    assert "An error occurred" in text_of(await respond(conversation))


async def test_it_says_plainly_when_a_call_was_not_approved() -> None:
    conversation = [
        user_message("cancel order 42"),
        make_call("cancel_order", {"order_id": 42}),
        make_output("Rejected: the customer already received it."),
    ]
    text = text_of(await respond(conversation))
    assert "cancel order 42 was not approved" in text
    assert "“Rejected: the customer already received it.”" in text


async def test_it_greets_after_a_handoff() -> None:
    conversation = [
        user_message("I have a billing question"),
        make_call("transfer_to_billing", {}),
        make_output(json.dumps({"assistant": "Billing"})),
    ]
    text = text_of(await respond(conversation, tools=BILLING_TOOLS, handoffs=[]))
    assert text.startswith("Hi, this is Billing.")
    assert "issue a refund" in text


async def test_it_gives_every_call_a_new_id() -> None:
    first = await respond("cancel order 42")
    second = await respond("cancel order 42")
    ids = {item.call_id for item in first.output + second.output if hasattr(item, "call_id")}
    assert len(ids) == 2
    assert first.response_id != second.response_id


async def test_it_reports_usage_with_token_details() -> None:
    response = await respond("where is order 7")
    assert response.usage.requests == 1
    assert response.usage.input_tokens > 0
    assert response.usage.output_tokens > 0
    assert response.usage.total_tokens == (
        response.usage.input_tokens + response.usage.output_tokens
    )
    assert response.usage.input_tokens_details.cached_tokens == 0


async def test_it_streams_text_word_by_word() -> None:
    conversation: list[Any] = [
        user_message("where is order 7"),
        make_call("lookup_order", {"order_id": 7}),
        make_output("Order 7 is shipped."),
    ]
    events = [
        event
        async for event in OfflineDemoModel().stream_response(
            None,
            conversation,
            ModelSettings(),
            SUPPORT_TOOLS,
            None,
            [],
            ModelTracing.DISABLED,
            previous_response_id=None,
            conversation_id=None,
            prompt=None,
        )
    ]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 5
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    completed = events[-1]
    assert isinstance(completed, ResponseCompletedEvent)
    [message] = completed.response.output
    assert isinstance(message, ResponseOutputMessage)
    assert "".join(deltas) == "".join(getattr(part, "text", "") for part in message.content)
    assert completed.response.model == "offline-demo"


class SpanRecorder(TracingProcessor):
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []

    def on_trace_start(self, trace: Trace) -> None:
        pass

    def on_trace_end(self, trace: Trace) -> None:
        pass

    def on_span_start(self, span: Span[Any]) -> None:
        pass

    def on_span_end(self, span: Span[Any]) -> None:
        exported = span.export()
        if exported is not None:
            self.spans.append(exported)

    def shutdown(self) -> None:
        pass

    def force_flush(self) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[SpanRecorder]:
    recorder = SpanRecorder()
    set_trace_processors([recorder])
    yield recorder
    set_trace_processors([])


async def test_it_records_a_generation_span_for_each_call(recorder: SpanRecorder) -> None:
    model = OfflineDemoModel()
    arguments: dict[str, Any] = {
        "system_instructions": None,
        "input": "where is order 7",
        "model_settings": ModelSettings(),
        "tools": SUPPORT_TOOLS,
        "output_schema": None,
        "handoffs": [],
        "tracing": ModelTracing.ENABLED,
        "previous_response_id": None,
        "conversation_id": None,
        "prompt": None,
    }
    with trace("demo model"):
        await model.get_response(**arguments)
        async for _ in model.stream_response(**arguments):
            pass

    generations = [span["span_data"] for span in recorder.spans]
    assert [data["type"] for data in generations] == ["generation", "generation"]
    for data in generations:
        assert data["model"] == "offline-demo"
        assert data["input"] == [{"role": "user", "content": "where is order 7"}]
        assert data["output"][0]["name"] == "lookup_order"
        assert data["usage"]["input_tokens"] > 0
