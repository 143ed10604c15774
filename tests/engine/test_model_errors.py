"""Failures a user understands: a model call that fails ends its run with one sentence for the
user ("The model is busy (rate limited); try again in a minute.") instead of the exception's
text, the provider's error kept for operators (status code, request id, the provider's error
type and message, the API key masked), nothing of the failed answer in the session, the
user's message on the page with "Send again", and the conversation free at once.

`engine.model_errors` is read first with the openai client's own exceptions, built as the
client builds them; then the run engine with a `ScriptedModel` that raises them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

import httpx2
import openai
import pytest
from agents import Agent, function_tool
from agents.exceptions import MaxTurnsExceeded, ModelTimeoutError
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from django.test import Client
from django.urls import reverse

from conversations.session import DjangoSession
from engine import executor, model_errors, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_conversation, make_user
from tests.provider import (
    LocalProvider,
    drop,
    fail,
    malformed,
    stall,
    text,
    use_local_provider,
)
from tracing.models import Span, Trace, TraceStatus

CANARY_KEY = "sk-canary-0123456789abcdefghijklmnop"
CHAT_URL = "http://127.0.0.1:9/v1/chat/completions"


# --- the openai client's exceptions, as it raises them ----------------------------------------


def request(model: str = "test-model", retries: int = 0, url: str = CHAT_URL) -> httpx2.Request:
    return httpx2.Request(
        "POST",
        url,
        json={"model": model, "messages": [{"role": "user", "content": "where is order 7"}]},
        headers={"x-stainless-retry-count": str(retries)},
    )


def status_error(
    status: int,
    *,
    message: str = "Something went wrong.",
    type: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
    model: str = "test-model",
    retries: int = 0,
) -> openai.APIStatusError:
    """The error the client raises for `status`, from an OpenAI-shaped body (the client
    picks the class by status and keeps the body's "error" object)."""
    body = {"message": message, "type": type, "code": code, "param": None}
    response = httpx2.Response(
        status,
        request=request(model, retries),
        json={"error": body},
        headers={"x-request-id": "req_0a1b2c", **(headers or {})},
    )
    client = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    return client._make_status_error(f"Error code: {status} - {body}", body=body, response=response)


def wrapped(outer: type[openai.APIConnectionError], inner: BaseException) -> BaseException:
    """`outer` raised while handling `inner`, as the client wraps transport errors."""
    try:
        try:
            raise inner
        except BaseException as exc:
            if outer is openai.APITimeoutError:
                raise openai.APITimeoutError(request=request()) from exc
            raise outer(request=request()) from exc
    except BaseException as raised:
        return raised


def test_it_says_the_model_is_busy_on_a_429_and_keeps_what_operators_need() -> None:
    error = status_error(
        429,
        message="Rate limit reached for test-model.",
        type="requests",
        code="rate_limit_exceeded",
        headers={"retry-after-ms": "50"},
        retries=2,
    )
    assert isinstance(error, openai.RateLimitError)

    failure = model_errors.describe(error)

    assert failure.kind == "rate_limit"
    assert failure.message == "The model is busy (rate limited); try again in a minute."
    assert failure.detail["status_code"] == 429
    assert failure.detail["request_id"] == "req_0a1b2c"
    assert failure.detail["error_type"] == "requests"
    assert failure.detail["error_code"] == "rate_limit_exceeded"
    assert failure.detail["message"] == "Rate limit reached for test-model."
    assert failure.detail["attempts"] == 3  # the first request and two retries
    assert failure.detail["retry_after"] == "50 ms"
    assert failure.detail["model"] == "test-model"
    assert failure.detail["endpoint"] == "POST /v1/chat/completions"
    assert failure.detail["exception"] == "openai.RateLimitError"
    json.dumps(failure.detail)  # stored in a JSONField as it is


def test_a_quota_that_is_used_up_is_not_called_busy() -> None:
    failure = model_errors.describe(status_error(429, code="insufficient_quota"))
    assert failure.kind == "quota"
    assert "quota" in failure.message and "try again in a minute" not in failure.message


def test_it_says_the_model_did_not_answer_within_the_configured_timeout(settings: Any) -> None:
    settings.AGENTSITE_MODEL_TIMEOUT = 60.0
    # A stream that stalled: the client's read timeout, wrapped by the client.
    stalled = wrapped(openai.APITimeoutError, httpx2.ReadTimeout("timed out"))
    failure = model_errors.describe(stalled)
    assert (failure.kind, failure.message) == ("timeout", "The model did not answer in 60 s.")
    assert failure.detail["timeout_seconds"] == 60.0
    assert failure.detail["chain"][0] == "httpx2.ReadTimeout"

    settings.AGENTSITE_MODEL_TIMEOUT = 0.5
    # The transport's own error, unwrapped, raised in the middle of a stream.
    bare = model_errors.describe(httpx2.ReadTimeout("timed out"))
    assert bare.message == "The model did not answer in 0.5 s."
    # The SDK's per-attempt timeout says its own seconds.
    sdk = model_errors.describe(ModelTimeoutError(12))
    assert (sdk.kind, sdk.message) == ("timeout", "The model did not answer in 12 s.")


def test_a_connection_that_broke_off_or_never_opened_is_the_service_being_unavailable() -> None:
    dropped = model_errors.describe(
        wrapped(openai.APIConnectionError, httpx2.RemoteProtocolError("peer closed connection"))
    )
    assert dropped.kind == "dropped"
    assert dropped.message == "The model service broke off its answer; try again in a moment."
    assert model_errors.describe(httpx2.RemoteProtocolError("incomplete")).kind == "dropped"

    refused = model_errors.describe(
        wrapped(openai.APIConnectionError, httpx2.ConnectError("connection refused"))
    )
    assert refused.kind == "unavailable"
    assert refused.message == "The model service is unavailable; try again in a moment."
    # Could not connect in time is "unavailable" too, not "did not answer".
    slow = model_errors.describe(
        wrapped(openai.APITimeoutError, httpx2.ConnectTimeout("connect timed out"))
    )
    assert slow.kind == "unavailable"


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_server_error_is_the_service_being_unavailable(status: int) -> None:
    failure = model_errors.describe(status_error(status, type="server_error"))
    assert failure.kind == "unavailable"
    assert failure.message == "The model service is unavailable; try again in a moment."
    assert failure.detail["status_code"] == status


def test_an_unknown_model_is_named() -> None:
    error = status_error(
        404,
        message="The model `gpt-nope` does not exist.",
        code="model_not_found",
        model="gpt-nope",
    )
    assert isinstance(error, openai.NotFoundError)
    failure = model_errors.describe(error)
    assert failure.kind == "unknown_model"
    assert failure.message == "The model gpt-nope is not available on the model service."
    # A 404 that says nothing of a model: the address is wrong, not the model.
    elsewhere = model_errors.describe(status_error(404, message="Not Found"))
    assert elsewhere.kind == "not_found"


def test_a_refused_key_is_said_and_masked_everywhere(settings: Any) -> None:
    settings.OPENAI_API_KEY = CANARY_KEY
    error = status_error(
        401,
        message=f"Incorrect API key provided: {CANARY_KEY}.",
        code="invalid_api_key",
    )
    assert CANARY_KEY in str(error)  # the client's own text echoes it

    failure = model_errors.describe(error)

    assert failure.kind == "auth"
    assert "API key" in failure.message
    assert CANARY_KEY not in json.dumps(failure.detail) + failure.message
    assert failure.detail["message"] == "Incorrect API key provided: [API key]."
    assert model_errors.describe(status_error(403)).kind == "forbidden"


def test_a_refused_request_is_said_without_the_provider_s_words() -> None:
    failure = model_errors.describe(status_error(400, message="Invalid 'tools[0].name'."))
    assert failure.kind == "bad_request"
    assert "HTTP 400" in failure.message and "tools" not in failure.message
    assert failure.detail["message"] == "Invalid 'tools[0].name'."
    too_long = model_errors.describe(status_error(400, code="context_length_exceeded"))
    assert too_long.message == (
        "This conversation is too long for the model; start a new conversation."
    )


def test_malformed_json_from_the_stream_is_an_unreadable_answer() -> None:
    try:
        json.loads("{not json")
    except json.JSONDecodeError as exc:
        failure = model_errors.describe(exc)
    assert failure.kind == "malformed"
    assert failure.message.startswith("The model service sent an answer this site could not read")


def test_it_walks_the_chain_to_what_the_sdk_wrapped() -> None:
    try:
        try:
            raise status_error(429)
        except openai.RateLimitError as exc:
            raise RuntimeError("the run could not go on") from exc
    except RuntimeError as outer:
        failure = model_errors.describe(outer)
    assert failure.kind == "rate_limit"
    assert failure.detail["exception"] == "RuntimeError"
    assert failure.detail["chain"] == ["openai.RateLimitError"]
    assert failure.detail["request_id"] == "req_0a1b2c"


def test_anything_else_is_unexpected_without_its_text_for_the_user() -> None:
    failure = model_errors.describe(KeyError("internal_thing"))
    assert failure.kind == "error"
    assert "internal_thing" not in failure.message
    assert "internal_thing" in failure.detail["message"]
    assert model_errors.describe(MaxTurnsExceeded("Max turns (10) exceeded")).kind == "max_turns"


# --- the run engine -------------------------------------------------------------------------

LOOKED_UP: list[int] = []


@function_tool
def look_up_order(order_id: int) -> str:
    """Look an order up."""
    LOOKED_UP.append(order_id)
    return f"Order {order_id} has shipped."


def failing_agent(settings: Any, *steps: Any) -> str:
    return scripted.install(settings, Agent(name="Flaky", model=ScriptedModel(list(steps))))


def turn(conversation: Any, text: str, user: Any) -> AgentRun:
    run = runs.start_run(conversation, text, user)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def items_of(conversation: Any) -> list[dict[str, Any]]:
    return asyncio.run(DjangoSession(conversation.session_id).get_items())


def page_text(response: Any) -> str:
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", response.content.decode(), flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_a_failed_model_call_ends_the_run_with_a_sentence_and_the_detail_for_operators(
    settings: Any, submitted: list, alice: Any, traces: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.OPENAI_API_KEY = CANARY_KEY
    name = failing_agent(
        settings,
        ModelStep.raise_error(
            status_error(429, message=f"Slow down, {CANARY_KEY}", code="rate_limit_exceeded")
        ),
    )
    conversation = make_conversation(owner=alice, agent_name=name)

    with caplog.at_level(logging.WARNING, logger="engine.runs"):
        run = turn(conversation, "where is order 7", alice)

    assert run.status == RunStatus.FAILED
    assert run.error == model_errors.RATE_LIMITED
    assert run.error_detail["status_code"] == 429
    assert run.error_detail["request_id"] == "req_0a1b2c"
    assert run.error_detail["message"] == "Slow down, [API key]"
    # Nothing of the turn but her message was stored, and that is taken out: a resend
    # does not say it twice to the agent.
    assert items_of(conversation) == []
    # One warning line with the detail; neither the key nor what she wrote.
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"Run {run.pk} failed" in line and "req_0a1b2c" in line and "429" in line
    assert CANARY_KEY not in line and "order 7" not in line
    # The trace: an error, with a span saying why.
    traces.flush()
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.ERROR
    span = Span.objects.get(trace_id=run.trace_id, name="run failed")
    assert span.span_data["data"]["request_id"] == "req_0a1b2c"
    assert span.span_data["data"]["user_message"] == model_errors.RATE_LIMITED
    assert CANARY_KEY not in json.dumps(span.span_data)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_the_chat_shows_her_message_the_sentence_and_send_again_which_works(
    settings: Any, submitted: list, alice: Any
) -> None:
    name = failing_agent(
        settings,
        ModelStep.raise_error(status_error(503, type="server_error")),
        [assistant_message("Order 7 has shipped.")],
    )
    conversation = make_conversation(owner=alice, agent_name=name)
    failed = turn(conversation, "where is order 7", alice)
    client = Client()
    client.force_login(alice)

    page = client.get(f"/chats/{conversation.session_id}/")

    text = page_text(page)
    assert "where is order 7" in text
    assert "The agent couldn't finish this reply." in text
    assert model_errors.UNAVAILABLE in text
    assert "APIStatusError" not in text and "InternalServerError" not in text
    html = page.content.decode()
    send_url = reverse("chat_send", args=[conversation.session_id])
    resend = re.search(r'<form class="run-action run-resend"[^>]*>.*?</form>', html, re.S)
    assert resend is not None
    assert f'action="{send_url}"' in resend.group(0)
    assert 'name="text" value="where is order 7"' in resend.group(0)
    assert "csrfmiddlewaretoken" in resend.group(0)  # works as a plain form

    # Send again, as the plain form does: the conversation takes it at once.
    response = client.post(send_url, {"text": "where is order 7"})
    assert response.status_code == 302
    again = AgentRun.objects.exclude(pk=failed.pk).get()
    assert again.input == "where is order 7"
    # A second click while it runs is refused: one run.
    client.post(send_url, {"text": "where is order 7"})
    assert AgentRun.objects.count() == 2
    asyncio.run(runs.execute(again.pk))
    again.refresh_from_db()
    assert again.status == RunStatus.COMPLETED, again.error
    items = items_of(conversation)
    assert [item.get("role") for item in items] == ["user", "assistant"]  # said once


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_a_tool_that_ran_before_the_failure_stays_in_the_history(
    settings: Any, submitted: list, alice: Any
) -> None:
    LOOKED_UP.clear()
    agent = Agent(
        name="Flaky",
        tools=[look_up_order],
        model=ScriptedModel(
            [
                [function_call("look_up_order", {"order_id": 7}, call_id="call_look_7")],
                ModelStep.raise_error(status_error(500, type="server_error")),
            ]
        ),
    )
    conversation = make_conversation(owner=alice, agent_name=scripted.install(settings, agent))

    run = turn(conversation, "where is order 7", alice)

    assert run.status == RunStatus.FAILED and run.error == model_errors.UNAVAILABLE
    assert LOOKED_UP == [7]
    kinds = [item.get("type") or item.get("role") for item in items_of(conversation)]
    assert kinds == ["user", "function_call", "function_call_output"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_the_run_s_admin_page_shows_the_detail(settings: Any, submitted: list, alice: Any) -> None:
    name = failing_agent(
        settings, ModelStep.raise_error(status_error(404, code="model_not_found", model="gpt-x"))
    )
    run = turn(make_conversation(owner=alice, agent_name=name), "hello", alice)
    assert run.error == "The model gpt-x is not available on the model service."
    staff = Client()
    staff.force_login(make_user(username="admin", is_staff=True, is_superuser=True))

    page = staff.get(f"/admin/engine/agentrun/{run.pk}/change/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "error detail" in text.lower()
    assert "req_0a1b2c" in text and "model_not_found" in text


# --- over HTTP, on the local provider (tests/provider.py) -------------------------------------

both_apis = pytest.mark.parametrize("api", ["chat_completions", "responses"])
REPLY = "Order 42 is placed and ships tomorrow."


def send(client: Client, conversation: Any, text: str) -> AgentRun:
    """What the chat page does: POST the message; the run starts after the view's commit."""
    response = client.post(reverse("chat_send", args=[conversation.session_id]), {"text": text})
    assert response.status_code == 302, response.content
    return AgentRun.objects.filter(conversation=conversation).latest("pk")


def settle(run: AgentRun, timeout: float = 20) -> AgentRun:
    assert executor.inprocess().wait_idle(timeout=timeout), "the run's job did not end"
    run.refresh_from_db()
    return run


@pytest.fixture
def chat(client_for_alice: Client, conversation: Any) -> tuple[Client, Any]:
    return client_for_alice, conversation


def failed_turn(
    settings: Any, provider: LocalProvider, chat: tuple[Client, Any], api: str, answer: Any
) -> AgentRun:
    use_local_provider(settings, provider, api, timeout=2.0, retries=1)
    provider.always(answer)
    client, conversation = chat
    run = settle(send(client, conversation, "where is order 42?"))
    assert run.status == RunStatus.FAILED
    return run


@both_apis
@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
def test_a_429_then_an_answer_completes_the_turn_after_a_retry(
    settings: Any, local_provider: LocalProvider, chat: tuple[Client, Any], api: str
) -> None:
    use_local_provider(settings, local_provider, api, retries=2)
    local_provider.script(fail(429, retry_after=0.05), text(REPLY))
    client, conversation = chat

    run = settle(send(client, conversation, "where is order 42?"))

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == REPLY
    assert len(local_provider.requests) == 2
    assert local_provider.requests[1].headers["x-stainless-retry-count"] == "1"


@both_apis
@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
def test_a_429_every_time_shows_the_rate_limit_message_and_send_again_works(
    settings: Any, local_provider: LocalProvider, chat: tuple[Client, Any], api: str
) -> None:
    run = failed_turn(settings, local_provider, chat, api, fail(429, retry_after=0.01))

    assert run.error == model_errors.RATE_LIMITED
    assert len(local_provider.requests) == 2  # the request and its one retry
    assert run.error_detail["status_code"] == 429
    assert run.error_detail["attempts"] == 2
    assert re.fullmatch(r"req_[0-9a-f]+", run.error_detail["request_id"])
    assert run.error_detail["error_code"] == "rate_limit_exceeded"
    client, conversation = chat
    page = client.get(reverse("chat", args=[conversation.session_id]))
    text_shown = page_text(page)
    assert "where is order 42?" in text_shown
    assert model_errors.RATE_LIMITED in text_shown
    assert 'data-testid="send-again"' in page.content.decode()

    # The provider answers again: Send again (the same text to chat_send) works.
    local_provider.always(text(REPLY))
    again = settle(send(client, conversation, "where is order 42?"))
    assert again.status == RunStatus.COMPLETED, again.error
    items = items_of(conversation)
    assert [item.get("role") for item in items] == ["user", "assistant"]
    assert items[0]["content"] == "where is order 42?"  # said once to the agent


@both_apis
@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
def test_a_stalled_stream_ends_the_run_within_the_timeout(
    settings: Any, local_provider: LocalProvider, chat: tuple[Client, Any], api: str
) -> None:
    use_local_provider(settings, local_provider, api, timeout=0.5, retries=2)
    local_provider.always(stall(after_words=2))
    client, conversation = chat

    started = time.monotonic()
    run = send(client, conversation, "where is order 42?")
    run = settle(run, timeout=5)
    took = time.monotonic() - started

    assert run.status == RunStatus.FAILED
    assert run.error == "The model did not answer in 0.5 s."
    assert took < 3, took  # one silence of 0.5 s: a stream under way is not retried
    assert len(local_provider.requests) == 1
    assert run.error_detail["kind"] == "timeout"
    assert items_of(conversation) == []
    # The conversation takes a new message at once.
    local_provider.always(text(REPLY))
    assert settle(send(client, conversation, "and order 7?")).status == RunStatus.COMPLETED


@both_apis
@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
def test_a_connection_dropped_mid_stream_leaves_no_half_item_in_the_session(
    settings: Any, local_provider: LocalProvider, chat: tuple[Client, Any], api: str
) -> None:
    use_local_provider(settings, local_provider, api, retries=2)
    client, conversation = chat
    local_provider.script(text("Order 7 was delivered."))
    assert settle(send(client, conversation, "where is order 7?")).status == RunStatus.COMPLETED
    before = items_of(conversation)
    local_provider.script(drop(after_words=3))

    run = settle(send(client, conversation, "where is order 42?"))

    assert run.status == RunStatus.FAILED
    assert run.error == model_errors.DROPPED
    assert run.error_detail["kind"] == "dropped"
    assert len(local_provider.requests) == 2  # a stream under way is not retried
    # The session is as the first turn left it: no half reply, and no unanswered message.
    after = items_of(conversation)
    assert after == before
    assert "Let me think" not in json.dumps(after)
    assert run.streamed_text == ""
    page = page_text(client.get(reverse("chat", args=[conversation.session_id])))
    assert "where is order 42?" in page and model_errors.DROPPED in page
    assert "Let me think" not in page


@both_apis
@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("answer", "kind", "message"),
    [
        (fail(500), "unavailable", model_errors.UNAVAILABLE),
        (malformed(), "malformed", model_errors.MALFORMED),
    ],
)
def test_a_server_error_and_malformed_json_each_say_so(
    settings: Any,
    local_provider: LocalProvider,
    chat: tuple[Client, Any],
    api: str,
    answer: Any,
    kind: str,
    message: str,
) -> None:
    run = failed_turn(settings, local_provider, chat, api, answer)

    assert (run.error_detail["kind"], run.error) == (kind, message)
    if kind == "unavailable":
        assert run.error_detail["status_code"] == 500
        assert run.error_detail["request_id"].startswith("req_")
        assert len(local_provider.requests) == 2  # retried once
    else:
        assert len(local_provider.requests) == 1  # an answer had begun: not retried
    assert items_of(chat[1]) == []


@both_apis
@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
def test_an_unknown_model_is_named_with_the_provider_s_status_and_request_id(
    settings: Any, local_provider: LocalProvider, chat: tuple[Client, Any], api: str
) -> None:
    use_local_provider(settings, local_provider, api, retries=2)
    settings.AGENTSITE_MODEL = "gpt-nope"
    local_provider.models = {"test-model"}
    client, conversation = chat

    run = settle(send(client, conversation, "where is order 42?"))

    assert run.status == RunStatus.FAILED
    assert run.error == "The model gpt-nope is not available on the model service."
    assert run.error_detail["status_code"] == 404
    assert run.error_detail["error_code"] == "model_not_found"
    assert run.error_detail["request_id"].startswith("req_")
    assert run.error_detail["model"] == "gpt-nope"
    assert len(local_provider.requests) == 1  # a 404 is not retried


@pytest.mark.usefixtures("orders", "fresh_registry")
@pytest.mark.django_db(transaction=True)
def test_a_401_that_echoes_the_key_keeps_it_out_of_the_run_the_page_and_the_log(
    settings: Any,
    local_provider: LocalProvider,
    chat: tuple[Client, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.OPENAI_API_KEY = CANARY_KEY
    with caplog.at_level(logging.WARNING, logger="engine.runs"):
        run = failed_turn(
            settings,
            local_provider,
            chat,
            "chat_completions",
            fail(401, message=f"Incorrect API key provided: {CANARY_KEY}."),
        )

    assert local_provider.requests[0].headers["authorization"] == f"Bearer {CANARY_KEY}"
    assert run.error == model_errors.REFUSED_KEY
    assert CANARY_KEY not in json.dumps(run.error_detail) + run.error
    assert run.error_detail["message"] == "Incorrect API key provided: [API key]."
    assert CANARY_KEY not in caplog.text
    client, conversation = chat
    assert CANARY_KEY not in client.get(reverse("chat", args=[conversation.session_id])).text
