"""OpenTelemetry out: traces as OTLP/JSON, with the GenAI semantic conventions, and the POST
that forwards them to an OTLP/HTTP endpoint.

One converter serves both ways out: the trace viewer's `/traces/<id>.otlp.json` (the stored
rows, `otlp_views`) and the forwarding exporter (`exporter.OtlpExporter`: the SDK's items,
read and masked by the database exporter's own code, so nothing unmasked leaves the site). It
reads anything shaped like a `Span` row (`SpanLike`: the model, or the exporter's
`rows.SpanInsert`), and writes an `ExportTraceServiceRequest` as the OTLP/JSON encoding has it:
ids in lowercase hex, times in nanoseconds as strings, 64-bit integers as strings, enums as
numbers.

Ids. A trace's id is the 32 hex of the SDK's `trace_<32 hex>`, so it is the same id in both
places. A span's is 16 hex, the first 16 of the SDK's `span_<24 hex>`: the SDK draws those
from a uuid4, so its first 64 bits are as random as any digest, and the OTLP id is then found
inside the SDK's (a prefix search finds the row). An id of another shape (a foreign or
explicit one) takes the start of its SHA-256 instead. Either way the SDK's own id travels in
the attributes `agents.trace_id` and `agents.span_id`, so a receiver's span leads back to its
row exactly.

Attributes follow the GenAI conventions (development status, as of semconv 1.37-1.41): model
calls are `chat <model>` client spans (`gen_ai.operation.name`, `gen_ai.provider.name` and the
older `gen_ai.system`, request/response model, `gen_ai.usage.*` with the cached input as
`gen_ai.usage.cache_read.input_tokens`), agent spans `invoke_agent <name>`, function spans
`execute_tool <name>`. What the conventions do not name keeps the SDK's or the site's names,
under `agents.*` (the SDK's span types) and `agentsite.*` (approval decisions).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from common import outbound
from tracing.recording import DECISION_SPAN_NAME

logger = logging.getLogger(__name__)

SCOPE_NAME = "agentsite"
PROVIDER = "openai"
# A string attribute is cut here: collectors and backends refuse or drop far smaller values
# than a long conversation in a generation's input (the JSON export has all of it).
ATTRIBUTE_CHARS = 32_768

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2

_SDK_TRACE_ID = re.compile(r"^trace_([0-9a-f]{32})$")
_SDK_SPAN_ID = re.compile(r"^span_([0-9a-f]{16})[0-9a-f]*$")


class SpanLike(Protocol):
    """What the converter reads of a span: a `tracing.models.Span` or an exporter's
    `rows.SpanInsert` (masked, as stored)."""

    @property
    def span_id(self) -> str: ...
    @property
    def trace_id(self) -> str: ...
    @property
    def parent_id(self) -> str | None: ...
    @property
    def span_type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def ended_at(self) -> datetime | None: ...
    @property
    def span_data(self) -> dict[str, Any]: ...
    @property
    def error(self) -> Any: ...
    @property
    def model(self) -> str: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...


class TraceLike(Protocol):
    @property
    def trace_id(self) -> str: ...
    @property
    def workflow_name(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def metadata(self) -> dict[str, Any]: ...


# --- ids ------------------------------------------------------------------------------------


def trace_id_hex(trace_id: str) -> str:
    """The OTLP trace id (32 hex) of an SDK trace id."""
    found = _SDK_TRACE_ID.match(trace_id)
    return _nonzero(found.group(1) if found else "", trace_id, 32)


def span_id_hex(span_id: str) -> str:
    """The OTLP span id (16 hex) of an SDK span id."""
    found = _SDK_SPAN_ID.match(span_id)
    return _nonzero(found.group(1) if found else "", span_id, 16)


def _nonzero(taken: str, original: str, length: int) -> str:
    # All zeros is OTLP's "no id": take the digest then too.
    if taken and taken.strip("0"):
        return taken
    return hashlib.sha256(original.encode()).hexdigest()[:length]


# --- values ---------------------------------------------------------------------------------


def any_value(value: Any) -> dict[str, Any]:
    """An OTLP `AnyValue`: typed; 64-bit integers as strings, as the JSON encoding has them."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value} if math.isfinite(value) else {"stringValue": str(value)}
    if isinstance(value, str):
        return {"stringValue": _cut(value)}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [any_value(item) for item in value if item is not None]}}
    return {"stringValue": _cut(_json(value))}


def attributes(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OTLP `KeyValue`s of `values`, those that are None (or empty text) left out."""
    return [
        {"key": key, "value": any_value(value)}
        for key, value in values.items()
        if value is not None and value != ""
    ]


def _cut(text: str) -> str:
    return text if len(text) <= ATTRIBUTE_CHARS else text[: ATTRIBUTE_CHARS - 1] + "…"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def unix_nanos(value: datetime | None) -> str:
    """A time as OTLP has it: nanoseconds since the epoch, a string."""
    if value is None:
        return "0"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return str(micros * 1000)


# --- spans ----------------------------------------------------------------------------------


def span_json(span: SpanLike, trace: TraceLike | None = None) -> dict[str, Any]:
    """One span as OTLP/JSON (`trace`, when known, adds its conversation and, on a root span,
    its workflow, run and outcome)."""
    data = span.span_data if isinstance(span.span_data, dict) else {}
    inner = _mapping(data.get("data"))
    name, kind, values = _semantics(span, data, inner)
    values = {
        **values,
        "agents.trace_id": span.trace_id,
        "agents.span_id": span.span_id,
        "agents.span_type": span.span_type,
    }
    if trace is not None:
        values["gen_ai.conversation.id"] = trace.group_id
        if not span.parent_id:
            metadata = trace.metadata if isinstance(trace.metadata, dict) else {}
            values["agentsite.workflow"] = trace.workflow_name
            values["agentsite.run_id"] = _text(metadata.get("run_id"))
            values["agentsite.agent"] = _text(metadata.get("agent"))
            # How the run ended, where the engine stored it (a stored trace; not forwarded).
            values["agentsite.outcome"] = _text(getattr(trace, "outcome", ""))
            values["agentsite.outcome_reason"] = _text(getattr(trace, "outcome_reason", ""))
    values["agents.span_data"] = _json(data) if data else None
    started = span.started_at or span.ended_at
    result: dict[str, Any] = {
        "traceId": trace_id_hex(span.trace_id),
        "spanId": span_id_hex(span.span_id),
        "name": name,
        "kind": kind,
        "startTimeUnixNano": unix_nanos(started),
        "endTimeUnixNano": unix_nanos(span.ended_at or started),
        "attributes": attributes(values),
    }
    if span.parent_id:
        result["parentSpanId"] = span_id_hex(span.parent_id)
    if span.error is not None:
        error = span.error if isinstance(span.error, dict) else {"message": span.error}
        result["status"] = {"code": STATUS_ERROR, "message": _cut(_text(error.get("message")))}
        if error.get("data") is not None:
            result["attributes"] += attributes({"agents.error.data": _json(error["data"])})
    return result


def _semantics(
    span: SpanLike, data: dict[str, Any], inner: dict[str, Any]
) -> tuple[str, int, dict[str, Any]]:
    """The span's OTLP name, kind and attributes, by its SDK type."""
    kind = span.span_type
    if kind in ("generation", "response"):
        return _model_call(span, data)
    if kind == "agent":
        agent = _text(data.get("name"))
        return (
            f"invoke_agent {agent}".strip(),
            SPAN_KIND_INTERNAL,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.agent.name": agent,
                "agents.agent.tools": _strings(data.get("tools")),
                "agents.agent.handoffs": _strings(data.get("handoffs")),
                "agents.agent.output_type": _text(data.get("output_type")),
            },
        )
    if kind == "function":
        tool = _text(data.get("name"))
        return (
            f"execute_tool {tool}".strip(),
            SPAN_KIND_INTERNAL,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.type": "function",
                # Opt-in in the conventions; here only what the site stores (masked, and
                # none with AGENTSITE_TRACE_SENSITIVE_DATA off).
                "gen_ai.tool.call.arguments": _text(data.get("input")),
                "gen_ai.tool.call.result": _text(data.get("output")),
            },
        )
    if kind == "handoff":
        handoff = {
            "agents.handoff.from": data.get("from_agent"),
            "agents.handoff.to": data.get("to_agent"),
        }
        return span.name, SPAN_KIND_INTERNAL, handoff
    if kind == "guardrail":
        guardrail = {
            "agents.guardrail.name": data.get("name"),
            "agents.guardrail.triggered": _flag(data.get("triggered")),
        }
        return span.name, SPAN_KIND_INTERNAL, guardrail
    if span.name == DECISION_SPAN_NAME:
        return span.name, SPAN_KIND_INTERNAL, _decision(inner)
    return span.name or kind, SPAN_KIND_INTERNAL, {}


def _model_call(span: SpanLike, data: dict[str, Any]) -> tuple[str, int, dict[str, Any]]:
    requested = data.get("model") if isinstance(data.get("model"), str) else ""
    # The exporter names a call without a model "unknown model" (for its cost): no model here.
    answered = span.model if span.model and span.model != "unknown model" else requested
    config = _mapping(data.get("model_config"))
    values: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,  # its name before semconv 1.37, which most tools still read
        "gen_ai.request.model": requested or answered,
        "gen_ai.response.model": answered,
        "gen_ai.response.id": _text(data.get("response_id")),
        "gen_ai.request.temperature": _number(config.get("temperature")),
        "gen_ai.request.top_p": _number(config.get("top_p")),
        "gen_ai.request.max_tokens": _number(config.get("max_tokens")),
        "gen_ai.usage.input_tokens": span.input_tokens,
        "gen_ai.usage.output_tokens": span.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": span.cached_tokens,
    }
    model = requested or answered
    return f"chat {model}".strip(), SPAN_KIND_CLIENT, values


def _decision(data: dict[str, Any]) -> dict[str, Any]:
    """A reviewer's decision (`recording.record_decision`): what the site adds to the run."""
    return {
        "agentsite.approval.decision": _text(data.get("decision")),
        "agentsite.approval.reviewer": _text(data.get("reviewer")),
        "agentsite.approval.tool": _text(data.get("tool")),
        "agentsite.approval.policy": _text(data.get("policy")),
        "agentsite.approval.message": _text(data.get("message")),
        "agentsite.approval.always": _flag(data.get("always")),
        "agentsite.approval.edited": _flag(data.get("edited")),
        "gen_ai.tool.name": _text(data.get("tool")),
        "gen_ai.tool.call.id": _text(data.get("call_id")),
    }


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _json(value)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, list) or not value:
        return None
    return [item if isinstance(item, str) else _json(item) for item in value]


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


# --- the request ----------------------------------------------------------------------------


def _version() -> str:
    try:
        return importlib.metadata.version("agentsite")
    except importlib.metadata.PackageNotFoundError:
        return ""


def export_request(
    spans: Iterable[SpanLike],
    traces: Mapping[str, TraceLike] | None = None,
    *,
    service_name: str = "agentsite",
) -> dict[str, Any]:
    """An OTLP/JSON `ExportTraceServiceRequest` of `spans` (one resource, one scope);
    `traces`, by trace id, adds what is known of their traces."""
    known = traces or {}
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": attributes(
                        {"service.name": service_name, "service.version": _version()}
                    )
                },
                "scopeSpans": [
                    {
                        "scope": {"name": SCOPE_NAME, "version": _version()},
                        "spans": [span_json(span, known.get(span.trace_id)) for span in spans],
                    }
                ],
            }
        ]
    }


# --- sending --------------------------------------------------------------------------------

# What OTLP/HTTP says a client retries (the specification's "Retryable Response Codes");
# any other answer is final.
RETRYABLE = frozenset({429, 502, 503, 504})
RETRY_AFTER_MOST = 5.0
# While the endpoint fails, batches are dropped without a POST for this long, doubling.
PAUSE_FIRST = 1.0
PAUSE_MOST = 60.0


@dataclass
class Answer:
    code: int | None  # None: no answer (refused, timed out)
    error: str = ""
    retry_after: float | None = None

    @property
    def delivered(self) -> bool:
        return self.code is not None and 200 <= self.code < 300

    @property
    def retryable(self) -> bool:
        return self.code is None or self.code in RETRYABLE


class Sender:
    """POSTs OTLP/JSON requests to one endpoint, never raising.

    Each attempt has a timeout; a retryable failure (no answer, 429, 502-504) is tried
    `retries` more times with exponential backoff (the server's Retry-After when it gives one,
    at most 5 s). A failure is logged once per burst (a warning), then quietly until a request
    is delivered again (logged too). While failing, it pauses: batches are dropped at once,
    with no POST, for 1 s after the first failure, doubling up to a minute, and then one
    attempt (no retries) probes the endpoint. An unreachable collector would otherwise hold
    the processor's thread for minutes per batch, while its queue filled and the SDK logged
    every span it then dropped.
    """

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        *,
        timeout: float = 10.0,
        retries: int = 2,
        backoff: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.shown = shown_endpoint(endpoint)
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.delivered = 0
        self.lost = 0
        self.stopping = False  # at shutdown: one attempt per batch, no retries
        self._clock = clock
        self._failing = False
        self._pause = 0.0
        self._paused_until = 0.0

    def send(self, payload: dict[str, Any]) -> bool:
        if self._failing and self._clock() < self._paused_until:
            self.lost += 1
            logger.debug("OpenTelemetry: a batch of spans was dropped (%s failing)", self.shown)
            return False
        retries = 0 if self._failing or self.stopping else self.retries
        try:
            body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
            answer = self._post(body)
            for attempt in range(retries):
                if answer.delivered or not answer.retryable:
                    break
                time.sleep(self._delay(attempt, answer))
                answer = self._post(body)
        except Exception as exc:  # never into the SDK's thread
            answer = Answer(None, f"{type(exc).__name__}: {exc}")
        if answer.delivered:
            self._recovered()
            return True
        self._failed(answer)
        return False

    def _delay(self, attempt: int, answer: Answer) -> float:
        if answer.retry_after is not None:
            return min(answer.retry_after, RETRY_AFTER_MOST)
        return outbound.doubling_backoff(self.backoff, attempt)

    def _post(self, body: bytes) -> Answer:
        request = urllib.request.Request(
            self.endpoint, data=body, headers=self.headers, method="POST"
        )
        try:
            # A redirect is a refusal: spans are not sent on to another address.
            with outbound.opener.open(request, timeout=self.timeout) as response:
                answer = response.read(64 * 1024)
                self._partial(answer)
                return Answer(response.status)
        except urllib.error.HTTPError as refused:
            retry_after = _seconds(refused.headers.get("Retry-After"))
            return Answer(refused.code, outbound.refusal(refused, 300), retry_after)
        except urllib.error.URLError as failed:
            return Answer(None, f"could not connect: {failed.reason}")
        except (OSError, ValueError) as failed:
            return Answer(None, f"{type(failed).__name__}: {failed}")

    def _partial(self, answer: bytes) -> None:
        """A 200 may still refuse some spans (OTLP's partial success): say so."""
        try:
            partial = json.loads(answer or b"{}").get("partialSuccess") or {}
        except (ValueError, AttributeError):
            return
        rejected = partial.get("rejectedSpans")
        if rejected and str(rejected) != "0":
            logger.warning(
                "OpenTelemetry: %s refused %s span(s): %s",
                self.shown,
                rejected,
                partial.get("errorMessage", ""),
            )

    def _failed(self, answer: Answer) -> None:
        self.lost += 1
        self._pause = min(PAUSE_MOST, max(PAUSE_FIRST, self._pause * 2))
        self._paused_until = self._clock() + self._pause
        if self._failing:
            logger.debug("OpenTelemetry: a batch of spans was not delivered: %s", answer.error)
            return
        self._failing = True
        logger.warning(
            "[non-fatal] OpenTelemetry: spans were not delivered to %s (%s); "
            "further failures are not logged until a delivery succeeds",
            self.shown,
            answer.error or f"HTTP {answer.code}",
        )

    def _recovered(self) -> None:
        self.delivered += 1
        self._pause = 0.0
        if self._failing:
            self._failing = False
            logger.warning(
                "OpenTelemetry: spans reach %s again (%d batch(es) lost so far)",
                self.shown,
                self.lost,
            )


def shown_endpoint(endpoint: str) -> str:
    """The endpoint as logs show it: no user or password, no query (a token may be there)."""
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: the backoff's own wait then
