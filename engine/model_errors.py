"""What a failed model call means, in one sentence for the user and a detail for operators.

`describe(exc)` reads what a run raised (the openai client's errors, the SDK's, the httpx2
transport's beneath them: it walks `__cause__` / `__context__`, as the SDK and the client
wrap each other's) and returns a `ModelFailure`:

- `message`: what the chat shows ("The model is busy (rate limited); try again in a minute.")
  instead of the exception's text;
- `detail`: for the run's admin page, its trace and the log: the kind, the HTTP status, the
  request id, the provider's error type, code and message, the attempts the client made, the
  model and the endpoint. Every text in it has the API key masked
  (`common.secrets.mask_api_key`): a 401's body can echo the key that was sent.

The openai client retries a request that failed before its answer began
(`AGENTSITE_MODEL_RETRIES`, engine/providers.py); what reaches here is what is left once it
gave up, or broke off mid-answer (never retried: part of the answer was already streamed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError, ModelTimeoutError
from django.conf import settings

from common import secrets
from engine.mcp import ServerUnavailable

# The provider's message is kept whole up to this (a 400 can explain at length).
MAX_DETAIL_CHARS = 2_000
# Chains longer than this are cut (a cycle is stopped anyway).
MAX_CHAIN = 12

RATE_LIMITED = "The model is busy (rate limited); try again in a minute."
QUOTA_EXHAUSTED = (
    "The model service refused: this site's quota with it is used up. "
    "An administrator has to look at it."
)
TIMED_OUT = "The model did not answer in {seconds} s."
UNAVAILABLE = "The model service is unavailable; try again in a moment."
DROPPED = "The model service broke off its answer; try again in a moment."
UNKNOWN_MODEL = "The model {model} is not available on the model service."
NOT_FOUND = (
    "The model service does not offer what this site asked it for (HTTP 404); "
    "an administrator has to check its address."
)
REFUSED_KEY = (
    "The model service refused this site's credentials; an administrator has to check its API key."
)
FORBIDDEN = (
    "The model service refused this site's request (no permission); an administrator has to "
    "check its access."
)
TOO_LONG = "This conversation is too long for the model; start a new conversation."
BAD_REQUEST = (
    "The model service refused the request (HTTP {status}); the details are kept for the "
    "site's administrators."
)
SERVICE_ERROR = "The model service reported an error; try again in a moment."
MALFORMED = (
    "The model service sent an answer this site could not read; try again, or tell an "
    "administrator if it keeps happening."
)
MAX_TURNS = "The agent took too many steps without finishing its reply."
MISBEHAVED = "The model answered in a way the agent could not use; try again."
UNEXPECTED = (
    "The agent stopped because of an unexpected error; the details are kept for the site's "
    "administrators."
)


@dataclass(frozen=True)
class ModelFailure:
    kind: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it was raised from or during, and so on (each once)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < MAX_CHAIN:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def describe(exc: BaseException) -> ModelFailure:
    """What `exc`, raised by a run, means for the user and for operators."""
    links = list(chain(exc))
    kind, message = _classify(links)
    detail = _detail(links, kind)
    return ModelFailure(kind=kind, message=secrets.mask_api_key(message), detail=detail)


def _first[E: BaseException](links: list[BaseException], *types: type[E]) -> E | None:
    for link in links:
        if isinstance(link, types):
            return link
    return None


def _classify(links: list[BaseException]) -> tuple[str, str]:
    server = _first(links, ServerUnavailable)
    if server is not None:
        # Not the model's failure: an MCP server of the agent's did not start. Its reason names
        # the server and what went wrong; nothing of the call it was needed for ran.
        return "tool_server", str(server)
    status = _first(links, openai.APIStatusError)
    if status is not None:
        return _by_status(status)
    timeout = _first(links, ModelTimeoutError)
    if timeout is not None:
        return "timeout", TIMED_OUT.format(seconds=_seconds(timeout.timeout_seconds))
    if _first(links, httpx2.ConnectTimeout, httpx2.ConnectError) is not None:
        return "unavailable", UNAVAILABLE
    if _first(links, openai.APITimeoutError, httpx2.TimeoutException, TimeoutError) is not None:
        return "timeout", TIMED_OUT.format(seconds=_seconds(settings.AGENTSITE_MODEL_TIMEOUT))
    if _first(links, httpx2.RemoteProtocolError, httpx2.ReadError) is not None:
        return "dropped", DROPPED
    if _first(links, openai.APIConnectionError, httpx2.TransportError) is not None:
        return "unavailable", UNAVAILABLE
    if _first(links, json.JSONDecodeError, openai.APIResponseValidationError) is not None:
        return "malformed", MALFORMED
    if _first(links, openai.APIError) is not None:
        # An error event inside a stream that had begun well.
        return "service_error", SERVICE_ERROR
    if _first(links, MaxTurnsExceeded) is not None:
        return "max_turns", MAX_TURNS
    if _first(links, ModelBehaviorError) is not None:
        return "model_behavior", MISBEHAVED
    return "error", UNEXPECTED


def _by_status(error: openai.APIStatusError) -> tuple[str, str]:
    code = (error.code or "").lower()
    status = error.status_code
    if status == 429:
        if code == "insufficient_quota":
            return "quota", QUOTA_EXHAUSTED
        return "rate_limit", RATE_LIMITED
    if status == 401:
        return "auth", REFUSED_KEY
    if status == 403:
        return "forbidden", FORBIDDEN
    if status == 404:
        text = _provider_message(error).lower()
        if "model" in code or "model" in text:
            return "unknown_model", UNKNOWN_MODEL.format(model=_model(error) or "asked for")
        return "not_found", NOT_FOUND
    if status in (408, 504):
        return "timeout", TIMED_OUT.format(seconds=_seconds(settings.AGENTSITE_MODEL_TIMEOUT))
    if status >= 500:
        return "unavailable", UNAVAILABLE
    if code == "context_length_exceeded":
        return "context_length", TOO_LONG
    return "bad_request", BAD_REQUEST.format(status=status)


def _seconds(value: float) -> str:
    return f"{value:g}"


def _detail(links: list[BaseException], kind: str) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "kind": kind,
        "exception": _name(links[0]),
        "chain": [_name(link) for link in links[1:]],
    }
    api = _first(links, openai.APIError)
    status = _first(links, openai.APIStatusError)
    request = _request(api)
    if status is not None:
        detail["status_code"] = status.status_code
        detail["request_id"] = status.request_id or status.response.headers.get("x-request-id")
        retry_after = _retry_after(status.response)
        if retry_after:
            detail["retry_after"] = retry_after
    if api is not None:
        detail["error_type"] = api.type
        detail["error_code"] = api.code
        detail["message"] = _provider_message(api)
    else:
        detail["message"] = str(links[0]) or _name(links[0])
    if request is not None:
        detail["endpoint"] = f"{request.method} {request.url.path}"
        model = _model(api)
        if model:
            detail["model"] = model
        retries = request.headers.get("x-stainless-retry-count")
        if retries is not None and retries.isdigit():
            detail["attempts"] = int(retries) + 1
    timeout = _first(links, ModelTimeoutError)
    if timeout is not None:
        detail["timeout_seconds"] = timeout.timeout_seconds
    elif kind == "timeout":
        detail["timeout_seconds"] = settings.AGENTSITE_MODEL_TIMEOUT
    return _masked(detail)


def _name(exc: BaseException) -> str:
    cls = type(exc)
    module = cls.__module__.split(".", 1)[0]
    return cls.__name__ if module == "builtins" else f"{module}.{cls.__name__}"


def _request(error: openai.APIError | None) -> httpx2.Request | None:
    if error is None:
        return None
    try:
        return error.request
    except (AttributeError, RuntimeError):  # httpx2 raises when none was set
        return None


def _provider_message(error: openai.APIError) -> str:
    """The provider's own message (`{"error": {"message": ...}}`), else the client's."""
    body = error.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    elif isinstance(body, str) and body.strip():
        return body.strip()
    return error.message


def _model(error: openai.APIError | None) -> str:
    """The model the failed request asked for, read from its JSON body."""
    request = _request(error)
    if request is None:
        return ""
    try:
        body = json.loads(request.content or b"{}")
    except (ValueError, httpx2.RequestNotRead):
        return ""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""


def _retry_after(response: httpx2.Response) -> str:
    headers = response.headers
    if headers.get("retry-after-ms"):
        return f"{headers['retry-after-ms']} ms"
    return headers.get("retry-after", "")


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return secrets.mask_api_key(value)[:MAX_DETAIL_CHARS]
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked(item) for item in value]
    return value
