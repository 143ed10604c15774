"""The local provider (tests/provider.py) speaks both wire formats as OpenAI does, read by the
real `openai` client over HTTP, and misbehaves exactly as asked."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest
from openai import AsyncOpenAI

from tests.live import ROOT
from tests.provider import (
    LocalProvider,
    answer,
    drop,
    fail,
    handoff,
    malformed,
    stall,
    text,
    tool_call,
)

APIS = ["chat_completions", "responses"]
HELLO: Any = [{"role": "user", "content": "Where is my order 42?"}]


def client(provider: LocalProvider, retries: int = 2, timeout: float = 5.0) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=provider.url,
        api_key="sk-local",
        max_retries=retries,
        timeout=httpx2.Timeout(timeout, connect=timeout),
    )


async def chat_chunks(api: AsyncOpenAI, model: str = "test-model") -> AsyncIterator[Any]:
    stream = await api.chat.completions.create(
        model=model, messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in stream:
        yield chunk


async def response_events(api: AsyncOpenAI, model: str = "test-model") -> AsyncIterator[Any]:
    stream = await api.responses.create(model=model, input=HELLO, stream=True)
    async for event in stream:
        yield event


async def streamed_words(api: AsyncOpenAI, wire: str, received: list[str]) -> None:
    """Appends each text delta to `received` as it arrives; raises what the client raises."""
    if wire == "chat_completions":
        async for chunk in chat_chunks(api):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    else:
        async for event in response_events(api):
            if event.type == "response.output_text.delta":
                received.append(event.delta)


async def test_it_streams_chat_completions_text_tool_calls_and_usage(
    local_provider: LocalProvider,
) -> None:
    local_provider.script(
        answer(text("Let me look."), tool_call("lookup_order", {"order_id": 42}, "call_a1"))
    )

    chunks = [chunk async for chunk in chat_chunks(client(local_provider))]

    assert chunks[0].choices[0].delta.role == "assistant"
    words = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert words == ["Let", " me", " look."]
    calls = [
        c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls
    ]
    assert calls[0][0].id == "call_a1" and calls[0][0].function.name == "lookup_order"
    pieces = [call[0].function.arguments for call in calls[1:]]
    assert len(pieces) > 1 and all(call[0].index == 0 for call in calls)
    assert json.loads("".join(pieces)) == {"order_id": 42}
    finishing = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishing[-1] == "tool_calls" and set(finishing[:-1]) == {None}
    # Usage comes last, in a chunk of its own with no choices, as OpenAI sends it when asked.
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    (request,) = local_provider.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == HELLO and request.body["stream"] is True
    assert request.headers["authorization"] == "Bearer sk-local"
    assert request.usage == {
        "input_tokens": last.usage.prompt_tokens,
        "output_tokens": last.usage.completion_tokens,
        "total_tokens": last.usage.total_tokens,
    }


async def test_it_sends_chat_usage_only_when_asked(local_provider: LocalProvider) -> None:
    local_provider.script(text("Order 42 has shipped."))

    stream = await client(local_provider).chat.completions.create(
        model="test-model", messages=HELLO, stream=True
    )
    chunks = [chunk async for chunk in stream]

    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert local_provider.requests[0].usage is None


async def test_it_streams_the_responses_event_sequence_with_usage(
    local_provider: LocalProvider,
) -> None:
    local_provider.script(
        answer(text("Let me look."), tool_call("lookup_order", {"order_id": 42}, "call_b1"))
    )

    events = [event async for event in response_events(client(local_provider))]

    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.delta for e in events if e.type == "response.output_text.delta"] == [
        "Let",
        " me",
        " look.",
    ]
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == {"order_id": 42}
    assert types.index("response.output_text.done") < types.index(
        "response.function_call_arguments.delta"
    )
    completed = events[-1].response
    assert completed.status == "completed" and completed.model == "test-model"
    message, call = completed.output
    assert message.type == "message" and message.content[0].text == "Let me look."
    assert call.type == "function_call" and call.call_id == "call_b1"
    assert call.name == "lookup_order" and json.loads(call.arguments) == {"order_id": 42}
    assert completed.usage.total_tokens == (
        completed.usage.input_tokens + completed.usage.output_tokens
    )
    assert completed.usage.output_tokens > 0
    assert local_provider.requests[0].path == "/v1/responses"
    assert local_provider.requests[0].usage["total_tokens"] == completed.usage.total_tokens


@pytest.mark.parametrize("wire", APIS)
async def test_it_answers_whole_when_not_streamed(local_provider: LocalProvider, wire: str) -> None:
    local_provider.script(answer(text("Order 42"), tool_call("lookup_order", {"order_id": 42})))
    api = client(local_provider)

    if wire == "chat_completions":
        completion = await api.chat.completions.create(model="test-model", messages=HELLO)
        message = completion.choices[0].message
        assert message.content == "Order 42"
        assert message.tool_calls and message.tool_calls[0].function.name == "lookup_order"
        assert completion.usage and completion.usage.total_tokens > 0
    else:
        response = await api.responses.create(model="test-model", input=HELLO)
        assert response.output_text == "Order 42"
        assert response.output[1].type == "function_call"
        assert response.usage and response.usage.total_tokens > 0


async def test_it_streams_parallel_calls_and_handoffs(local_provider: LocalProvider) -> None:
    local_provider.script(
        answer(
            tool_call("lookup_order", {"order_id": 7}), tool_call("lookup_order", {"order_id": 42})
        ),
        handoff("Billing"),
    )
    api = client(local_provider)

    chunks = [chunk async for chunk in chat_chunks(api)]
    events = [event async for event in response_events(api)]

    started = [
        call
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for call in c.choices[0].delta.tool_calls
        if call.id
    ]
    assert [call.index for call in started] == [0, 1]
    assert started[0].id != started[1].id
    (transfer,) = events[-1].response.output
    assert transfer.name == "transfer_to_billing" and transfer.arguments == "{}"


async def test_it_retries_a_429_after_the_wait_it_names(local_provider: LocalProvider) -> None:
    local_provider.script(fail(429, retry_after=0.05), text("Order 42 has shipped."))
    received: list[str] = []

    await streamed_words(client(local_provider), "chat_completions", received)

    assert "".join(received) == "Order 42 has shipped."
    first, second = local_provider.requests
    assert first.body == second.body
    # The client waited the 50 ms retry-after-ms names, not its own backoff (0.5 s and more).
    assert 0.05 <= second.at - first.at < 0.4
    attempts = [int(r.headers.get("x-stainless-retry-count", "0")) for r in (first, second)]
    assert attempts == [0, 1]


async def test_it_says_a_429_as_openai_does(
    local_provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_provider.always(fail(429, retry_after=0.05))
    # What the client chose to wait before each retry (not how long it took: the machine's
    # load is no part of the answer).
    waits: list[float] = []
    chosen = openai._base_client.BaseClient._calculate_retry_timeout

    def recorded(self: Any, *args: Any, **kwargs: Any) -> float:
        waits.append(chosen(self, *args, **kwargs))
        return waits[-1]

    monkeypatch.setattr(openai._base_client.BaseClient, "_calculate_retry_timeout", recorded)

    with pytest.raises(openai.RateLimitError) as raised:
        await streamed_words(client(local_provider, retries=2), "responses", [])

    assert len(local_provider.requests) == 3
    assert waits == [0.05, 0.05]  # the server's retry-after-ms, not 0.5 s + 1 s of backoff
    error = raised.value
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert error.request_id and error.request_id.startswith("req_")
    assert error.response.headers["retry-after"] == "1"
    assert error.response.headers["retry-after-ms"] == "50"
    assert error.body == {
        "message": "Rate limit reached for requests. Please try again later.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }


@pytest.mark.parametrize("wire", APIS)
async def test_it_fails_with_500_and_401(local_provider: LocalProvider, wire: str) -> None:
    local_provider.script(fail(500), fail(401, message="Incorrect API key provided: sk-loc***"))
    api = client(local_provider, retries=0)

    with pytest.raises(openai.InternalServerError) as server_error:
        await streamed_words(api, wire, [])
    with pytest.raises(openai.AuthenticationError) as auth_error:
        await streamed_words(api, wire, [])

    assert server_error.value.status_code == 500 and server_error.value.type == "server_error"
    assert auth_error.value.code == "invalid_api_key"
    assert "Incorrect API key provided: sk-loc***" in auth_error.value.message


@pytest.mark.parametrize("wire", APIS)
async def test_a_stalled_stream_is_cut_by_the_clients_read_timeout(
    local_provider: LocalProvider, wire: str
) -> None:
    local_provider.script(stall(after_words=2))
    received: list[str] = []
    started = time.monotonic()

    with pytest.raises(openai.APITimeoutError):
        await streamed_words(client(local_provider, timeout=0.3), wire, received)

    assert received == ["Let", " me"]
    assert 0.3 <= time.monotonic() - started < 2
    assert len(local_provider.requests) == 1  # a stream that began is not retried


@pytest.mark.parametrize("wire", APIS)
async def test_a_dropped_connection_ends_the_stream_mid_body(
    local_provider: LocalProvider, wire: str
) -> None:
    local_provider.script(drop(after_words=2))
    received: list[str] = []

    with pytest.raises(openai.APIConnectionError) as raised:
        await streamed_words(client(local_provider), wire, received)

    assert received == ["Let", " me"]
    assert isinstance(raised.value.__cause__, httpx2.RemoteProtocolError)
    assert len(local_provider.requests) == 1


@pytest.mark.parametrize("wire", APIS)
async def test_a_malformed_chunk_is_not_json(local_provider: LocalProvider, wire: str) -> None:
    local_provider.script(malformed())

    with pytest.raises(json.JSONDecodeError):
        await streamed_words(client(local_provider), wire, [])

    assert len(local_provider.requests) == 1


@pytest.mark.parametrize("wire", APIS)
async def test_an_unknown_model_is_404_model_not_found(
    local_provider: LocalProvider, wire: str
) -> None:
    local_provider.models = {"test-model"}
    local_provider.always(text("never sent"))
    api = client(local_provider)

    with pytest.raises(openai.NotFoundError) as raised:
        if wire == "chat_completions":
            await api.chat.completions.create(model="gpt-none", messages=HELLO)
        else:
            await api.responses.create(model="gpt-none", input="hi")

    assert raised.value.code == "model_not_found"
    assert "gpt-none" in raised.value.message
    assert len(local_provider.requests) == 1  # a 404 is not retried


async def test_it_answers_500_when_the_script_is_used_up(local_provider: LocalProvider) -> None:
    local_provider.script(text("One."))
    api = client(local_provider, retries=0)

    await streamed_words(api, "chat_completions", [])
    with pytest.raises(openai.InternalServerError, match="no script"):
        await streamed_words(api, "chat_completions", [])

    assert local_provider.unused == []


def test_it_serves_a_client_in_another_process(local_provider: LocalProvider) -> None:
    local_provider.script(text("Order 42 has shipped."))
    program = (
        "import sys, openai\n"
        "client = openai.OpenAI(base_url=sys.argv[1], api_key='x', max_retries=0)\n"
        "stream = client.chat.completions.create(model='test-model', stream=True,\n"
        "    messages=[{'role': 'user', 'content': 'hi'}])\n"
        "print('|'.join(c.choices[0].delta.content for c in stream\n"
        "    if c.choices and c.choices[0].delta.content))\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", program, local_provider.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert done.stdout.strip() == "Order| 42| has| shipped."
