"""The whole product over HTTP, on the local provider (tests/provider.py), for Chat Completions
and for the Responses API: the chat page's POST starts the run, the in-process executor runs it,
the real openai client streams it from 127.0.0.1. (The browser walk:
tests/browser/test_provider.py.)"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.urls import reverse

from agentsite.asgi import application
from approvals.models import ApprovalRequest
from conversations.models import Conversation
from conversations.session import DjangoSession
from demo.models import Order, OrderEvent
from engine import executor, runs
from engine.models import AgentRun, RunStatus
from tests.conftest import Traces
from tests.factories import client_of, make_reviewer
from tests.provider import (
    LocalProvider,
    Recorded,
    handoff,
    text,
    tool_call,
    use_local_provider,
)
from tracing.models import Span, Trace

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
    pytest.mark.parametrize("api", ["chat_completions", "responses"]),
]

REPLY = "Order 42, the Burr coffee grinder, is placed and ships tomorrow."


def send(conversation: Conversation, text: str) -> AgentRun:
    """What alice's chat page does: POST the message; the run starts after the view's commit."""
    response = client_of(conversation.owner).post(
        reverse("chat_send", args=[conversation.session_id]), {"text": text}
    )
    assert response.status_code == 302, response.content
    return AgentRun.objects.filter(conversation=conversation).latest("pk")


def settle(run: AgentRun) -> AgentRun:
    assert executor.inprocess().wait_idle(timeout=20), "the run's job did not end"
    run.refresh_from_db()
    return run


def model_input(request: Recorded) -> list[dict[str, Any]]:
    """What a request showed the model of the conversation, in either format."""
    return list(request.body.get("messages") or request.body.get("input") or [])


def tool_outputs(request: Recorded, call_id: str) -> list[str]:
    """The outputs of call `call_id` that a request sent back to the model."""
    return [
        str(item.get("content") if item.get("role") == "tool" else item.get("output"))
        for item in model_input(request)
        if item.get("tool_call_id") == call_id
        or (item.get("type") == "function_call_output" and item.get("call_id") == call_id)
    ]


def offered_tools(request: Recorded) -> set[str]:
    return {(tool.get("function") or tool).get("name") for tool in request.body.get("tools") or []}


def instructions(request: Recorded) -> str:
    if "instructions" in request.body:
        return str(request.body["instructions"])
    first = model_input(request)[0]
    assert first["role"] == "system"
    return str(first["content"])


def summed_usage(requests: list[Recorded]) -> dict[str, int]:
    sent = [request.usage for request in requests]
    assert all(usage is not None for usage in sent), "the provider sent no usage"
    return {
        "requests": len(sent),
        "input_tokens": sum(usage["input_tokens"] for usage in sent if usage),
        "output_tokens": sum(usage["output_tokens"] for usage in sent if usage),
        "total_tokens": sum(usage["total_tokens"] for usage in sent if usage),
    }


def model_spans(traces: Traces, trace_id: str) -> list[dict[str, Any]]:
    """The SDK's spans of each model call: generation (Chat Completions) or response (Responses)."""
    return [
        span["span_data"]
        for span in traces.sdk.spans
        if span["trace_id"] == trace_id and span["span_data"]["type"] in ("generation", "response")
    ]


def assert_model_calls_traced(
    traces: Traces, run: AgentRun, requests: list[Recorded], api: str
) -> None:
    """Each model call is a span with the usage the server sent, as the SDK records it
    (Chat Completions: a generation span naming the model; Responses: a response span naming
    the response), and is stored so."""
    traces.flush()
    emitted = model_spans(traces, run.trace_id)
    assert len(emitted) == len(requests)
    for span, request in zip(emitted, requests, strict=True):
        assert request.usage is not None
        assert span["usage"]["input_tokens"] == request.usage["input_tokens"]
        assert span["usage"]["output_tokens"] == request.usage["output_tokens"]
        if api == "chat_completions":
            assert span["type"] == "generation" and span["model"] == "test-model"
        else:
            assert span["type"] == "response" and span["response_id"] == request.answer_id
    stored = list(
        Span.objects.filter(trace_id=run.trace_id, span_type__in=["generation", "response"])
    )
    assert [s.span_data["usage"] for s in stored] == [span["usage"] for span in emitted]
    assert [s.total_tokens for s in stored] == [
        r.usage["total_tokens"] for r in requests if r.usage
    ]
    # Stored, each names the model that answered: a response span too (the SDK's names only
    # the response; the exporter adds the model its response carries).
    assert [s.span_data["model"] for s in stored] == ["test-model"] * len(requests)
    if api == "chat_completions":
        assert {s.name for s in stored} == {"test-model"}
    trace = Trace.objects.get(trace_id=run.trace_id)
    assert trace.run == run
    assert trace.total_tokens == run.usage["total_tokens"]


# --- streaming ------------------------------------------------------------------------------


def session_cookie(user: Any) -> tuple[bytes, bytes]:
    return (b"cookie", f"sessionid={client_of(user).cookies['sessionid'].value}".encode())


@pytest.mark.usefixtures("quiet_server")
async def test_a_streamed_reply_reaches_the_chat_socket_in_pieces(
    settings: Any, local_provider: LocalProvider, conversation: Conversation, api: str
) -> None:
    use_local_provider(settings, local_provider, api)
    local_provider.script(text(REPLY))
    local_provider.pace = 0.02  # a word every 20 ms, as a model writes
    cookie = await sync_to_async(lambda: session_cookie(conversation.owner))()
    communicator = WebsocketCommunicator(
        application,
        f"/ws/chats/{conversation.session_id}/",
        headers=[(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1"), cookie],
    )
    assert (await communicator.connect())[0]  # binds the executor to this loop, as a server

    run = await sync_to_async(send)(conversation, "where is my order 42?")
    delta_frame = f'<span hx-swap-oob="beforeend:#run-{run.pk}-text"'

    def pieces() -> list[str]:
        return [re.sub(r"<[^>]+>", "", frame) for frame in frames if frame.startswith(delta_frame)]

    # Until the whole reply came in pieces and a completed run was pushed after the last of
    # them. The run shares this loop with the socket: the push of the run's queued event can
    # be rendered only once the run has completed (a push renders the run as stored when it
    # goes out), so a completed frame may come before any word.
    frames: list[str] = []
    while not (
        "".join(pieces()) == REPLY
        and 'data-status="completed"' in frames[-1]
        and any(frame.startswith(delta_frame) for frame in frames)
    ):
        frames.append(await communicator.receive_from(timeout=10))
    await communicator.disconnect()

    # In pieces as the words came: one each, or a few together when they came while the
    # one before was still being sent (`streaming.Deltas`); never cut inside a word.
    words = REPLY.split(" ")
    assert len(pieces()) > 1
    at = 0
    for piece in pieces():
        count = len(piece.strip().split(" "))
        assert piece.strip() == " ".join(words[at : at + count]), (piece, at)
        at += count
    assert at == len(words)
    assert REPLY in frames[-1]
    await run.arefresh_from_db()
    assert run.status == RunStatus.COMPLETED and run.final_output == REPLY
    assert [request.path for request in local_provider.requests] == [
        "/v1/chat/completions" if api == "chat_completions" else "/v1/responses"
    ]
    (request,) = local_provider.requests
    assert request.body["stream"] is True and request.body["model"] == "test-model"
    assert model_input(request)[-1] == {"role": "user", "content": "where is my order 42?"}


# --- a tool call ----------------------------------------------------------------------------


def test_a_tool_call_runs_once_and_its_usage_reaches_the_run_and_the_trace(
    settings: Any,
    local_provider: LocalProvider,
    conversation: Conversation,
    traces: Traces,
    api: str,
) -> None:
    use_local_provider(settings, local_provider, api)
    local_provider.script(tool_call("lookup_order", {"order_id": 42}, "call_look_42"), text(REPLY))

    run = settle(send(conversation, "where is my order 42?"))

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == REPLY
    first, second = local_provider.requests
    assert {"lookup_order", "cancel_order", "transfer_to_billing"} <= offered_tools(first)
    (output,) = tool_outputs(second, "call_look_42")
    assert "Burr coffee grinder" in output  # what the tool read from alice's order 42
    items = asyncio.run(DjangoSession(conversation.session_id).get_items())
    assert [i["call_id"] for i in items if i.get("type") == "function_call_output"] == [
        "call_look_42"
    ]
    assert run.usage == summed_usage(local_provider.requests)
    assert_model_calls_traced(traces, run, local_provider.requests, api)
    traced_tools = Span.objects.filter(trace_id=run.trace_id, span_type="function")
    assert [(s.name, s.span_data["input"]) for s in traced_tools] == [
        ("lookup_order", '{"order_id": 42}')
    ]


# --- an approval ----------------------------------------------------------------------------


def test_an_approval_pauses_shows_in_the_inbox_and_resumes_with_the_tool_output(
    settings: Any,
    local_provider: LocalProvider,
    conversation: Conversation,
    traces: Traces,
    api: str,
) -> None:
    use_local_provider(settings, local_provider, api)
    local_provider.script(
        tool_call("cancel_order", {"order_id": 42}, "call_cancel_42"),
        text("Order 42 is cancelled."),
    )

    run = settle(send(conversation, "please cancel my order 42"))

    assert run.status == RunStatus.WAITING, run.error
    assert len(local_provider.requests) == 1
    request = ApprovalRequest.objects.get(run=run)
    assert (request.tool_name, request.arguments, request.call_id) == (
        "cancel_order",
        {"order_id": 42},
        "call_cancel_42",
    )
    assert not OrderEvent.objects.exists(), "the tool ran before it was approved"
    rita = client_of(make_reviewer())
    inbox = rita.get(reverse("inbox")).content.decode()
    assert f'id="request-{request.pk}"' in inbox and "cancel_order" in inbox

    decided = rita.post(
        reverse("inbox_decide", args=[request.pk]),
        {"action": "approve", "seen_hash": request.arguments_hash},
    )
    assert decided.status_code in (200, 302)
    run = settle(run)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Order 42 is cancelled."
    assert Order.objects.get(number=42).status == Order.Status.CANCELLED
    assert OrderEvent.objects.count() == 1
    paused, resumed = local_provider.requests
    assert tool_outputs(paused, "call_cancel_42") == []
    (output,) = tool_outputs(resumed, "call_cancel_42")
    assert "cancelled" in output
    assert run.usage == summed_usage(local_provider.requests)
    assert_model_calls_traced(traces, run, local_provider.requests, api)


def test_an_approval_inside_an_agent_used_as_a_tool_resumes_through_the_server(
    settings: Any, local_provider: LocalProvider, conversation: Conversation, api: str
) -> None:
    """The researcher runs as a tool of the support desk, not streamed (`Agent.as_tool`): its
    gated search pauses the whole run, and the approval resumes it inside the researcher."""
    use_local_provider(settings, local_provider, api)
    local_provider.script(
        tool_call("research", {"input": "refund policy"}, "call_research"),
        tool_call("search_knowledge_base", {"query": "refunds"}, "call_search"),
        text("Refunds go back to the original payment method."),
        text("Refunds go back to your original payment method within 5 business days."),
    )

    run = settle(send(conversation, "what is your refund policy?"))

    assert run.status == RunStatus.WAITING, run.error
    request = ApprovalRequest.objects.get(run=run)
    assert (request.tool_name, request.origin) == ("search_knowledge_base", "agent_as_tool")
    assert [r.body.get("stream") for r in local_provider.requests] == [True, None]

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    run = settle(run)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output.startswith("Refunds go back to your original payment method")
    _, researching, researched, answered = local_provider.requests
    assert instructions(researching).startswith("You research questions")
    assert tool_outputs(researching, "call_search") == []
    (article,) = tool_outputs(researched, "call_search")
    assert article.startswith("Refund policy:")
    assert tool_outputs(answered, "call_research") == [
        "Refunds go back to the original payment method."
    ]
    assert run.usage == summed_usage(local_provider.requests)


# --- a handoff ------------------------------------------------------------------------------


def test_a_handoff_to_billing_goes_on_with_billing_s_instructions_and_tools(
    settings: Any, local_provider: LocalProvider, conversation: Conversation, api: str
) -> None:
    use_local_provider(settings, local_provider, api)
    local_provider.script(
        handoff("Billing", "call_to_billing"), text("Billing here: nothing was refunded on 42.")
    )

    run = settle(send(conversation, "how much was refunded on order 42?"))

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Billing here: nothing was refunded on 42."
    support, billing = local_provider.requests
    assert instructions(support).startswith("You are the support desk")
    assert instructions(billing).startswith("You are the billing specialist")
    assert "cancel_order" in offered_tools(support)
    assert offered_tools(billing) == {"lookup_order", "issue_refund", "transfer_to_support_desk"}
    (output,) = tool_outputs(billing, "call_to_billing")
    assert json.loads(output) == {"assistant": "Billing"}
    conversation.refresh_from_db()
    assert conversation.current_agent == "support/Billing"
    assert run.usage == summed_usage(local_provider.requests)


# --- what is asked of the model -------------------------------------------------------------


def test_an_agent_that_names_no_model_is_sent_no_settings_of_another_model(
    settings: Any, local_provider: LocalProvider, conversation: Conversation, api: str
) -> None:
    """The SDK gives an agent that names no model the default settings of *its* default model
    (a gpt-5: reasoning effort and verbosity), which gpt-4.1 and most compatible servers
    refuse; the served model here is `test-model`, which wants none."""
    use_local_provider(settings, local_provider, api)
    local_provider.script(text("Hello."))

    run = settle(send(conversation, "hello"))

    assert run.status == RunStatus.COMPLETED, run.error
    (request,) = local_provider.requests
    asked = set(request.body) & {"reasoning", "reasoning_effort", "verbosity", "text"}
    assert not asked, {name: request.body[name] for name in asked}


def test_a_card_number_never_reaches_the_server(
    settings: Any, local_provider: LocalProvider, conversation: Conversation, api: str
) -> None:
    """The demo's guardrail runs before the model (not in parallel with its first request)."""
    use_local_provider(settings, local_provider, api)
    local_provider.always(text("I should never be asked."))

    run = settle(send(conversation, "refund order 42 to my card 4242 4242 4242 4242"))

    assert run.status == RunStatus.GUARDRAIL, run.error
    assert local_provider.requests == []
