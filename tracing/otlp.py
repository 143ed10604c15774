"""OpenTelemetry out: a run's spans as OpenTelemetry's own span type, with the GenAI semantic
conventions, encoded by OpenTelemetry's own OTLP encoders (protobuf and JSON).

One converter serves every way out: the trace viewer's downloads (`/traces/<id>.otlp.pb`,
`/traces/<id>.otlp.json`: the stored rows, `otlp_views`), the forwarding exporter
(`exporter.OtlpExporter`: the SDK's items, read and masked by the database exporter's own code,
so nothing unmasked leaves the site) and a reviewer's decision, forwarded as it is recorded
(`recording.record_decision`). It reads anything shaped like a `Span` row (`SpanLike`: the
model, or the exporter's `rows.SpanInsert`) and makes `opentelemetry.sdk.trace.ReadableSpan`s,
which OpenTelemetry's exporters send (`tracing.forwarding`) and its encoders write.

Ids. A trace's id is the 32 hex of the SDK's `trace_<32 hex>`, so it is the same id in both
places. A span's is 16 hex, the first 16 of the SDK's `span_<24 hex>`: the SDK draws those
from a uuid4, so its first 64 bits are as random as any digest, and the OTLP id is then found
inside the SDK's (a prefix search finds the row). An id of another shape (a foreign or
explicit one) takes the start of its SHA-256 instead. Either way the SDK's own id travels in
the attributes `agents.trace_id` and `agents.span_id`, so a receiver's span leads back to its
row exactly.

Attributes follow the GenAI semantic conventions of OpenTelemetry semconv 1.38 (`SEMCONV`;
development status): model calls are `chat <model>` client spans (`gen_ai.operation.name`,
`gen_ai.provider.name` and the older `gen_ai.system`, request/response model,
`gen_ai.usage.*` with the cached input as `gen_ai.usage.cache_read.input_tokens`) with their
messages as the conventions' JSON (`gen_ai.input.messages`, `gen_ai.output.messages`,
`gen_ai.system_instructions`: role and typed parts), only what the site stores (masked; none
with AGENTSITE_TRACE_SENSITIVE_DATA off); agent spans `invoke_agent <name>`, function spans
`execute_tool <name>`. Every span also carries OpenInference's kind
(`openinference.span.kind`: LLM, AGENT, TOOL, GUARDRAIL, CHAIN, EVALUATOR), and model calls
its input and output values and flattened messages (`input.value`, `llm.input_messages.<i>.*`),
which viewers such as Arize Phoenix read. A call that waited for a reviewer says so: at the
pause its span is `await_approval <tool>` (a CHAIN: the call did not run; the call that runs
after the approval is the one `execute_tool`), with the decision, once known, as its status
(a rejected or expired call is an error, `agentsite.tool.outcome`); the decision itself is an
EVALUATOR span `review <tool>` under the agent span that asked. What neither convention names
keeps the SDK's or the site's names, under `agents.*` (the SDK's span types) and
`agentsite.*` (approval decisions).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any, Protocol

from opentelemetry.exporter.otlp.json.common.trace_encoder import encode_spans as encode_json
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as encode_proto
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tracing.messages import Message, conversation
from tracing.rows import DECISION_SPAN_NAME

logger = logging.getLogger(__name__)

SCOPE_NAME = "agentsite"
PROVIDER = "openai"
SEMCONV = "https://opentelemetry.io/schemas/1.38.0"
# A string attribute is cut here: collectors and backends refuse or drop far smaller values
# than a long conversation in a generation's input (the JSON export has all of it).
ATTRIBUTE_CHARS = 32_768
# Messages flattened into OpenInference's `llm.*_messages.<i>.*`, the last ones of a call.
FLAT_MESSAGES = 20

OPENINFERENCE_KIND = "openinference.span.kind"
# What a call that waited for a reviewer became (`agentsite.tool.outcome`) by the decision's
# word (`recording._decision`), and whether that is an error of the call.
CALL_OUTCOMES = {
    "approve": ("approved", False),
    "edit and approve": ("approved with edits", False),
    "respond": ("answered by the reviewer", False),
    "reject": ("rejected", True),
    "expired": ("expired", True),
    "withdrawn": ("withdrawn", True),
}

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


def attribute(value: Any) -> Any:
    """A value as an OpenTelemetry attribute takes it: text (cut), a number, a flag, or a
    list of text; anything else as its JSON; None (and empty text) as nothing."""
    if value is None or value == "":
        return None
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _cut(value)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return [_cut(item) for item in value]
    return _cut(_json(value))


def attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` as OpenTelemetry attributes, those that are None (or empty text) left out."""
    cleaned = {key: attribute(value) for key, value in values.items()}
    return {key: value for key, value in cleaned.items() if value is not None}


def _cut(text: str) -> str:
    return text if len(text) <= ATTRIBUTE_CHARS else text[: ATTRIBUTE_CHARS - 1] + "…"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def unix_nanos(value: datetime | None) -> int:
    """A time as OTLP has it: nanoseconds since the epoch."""
    if value is None:
        return 0
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return micros * 1000


# --- spans ----------------------------------------------------------------------------------


def readable_span(
    span: SpanLike,
    trace: TraceLike | None = None,
    *,
    resource: Resource | None = None,
    outcome: str | None = None,
) -> ReadableSpan:
    """One span as OpenTelemetry's `ReadableSpan` (`trace`, when known, adds its conversation
    and, on a root span, its workflow, run and outcome; `outcome`, on a call that waited for
    a reviewer, the decision on it)."""
    data = span.span_data if isinstance(span.span_data, dict) else {}
    inner = _mapping(data.get("data"))
    name, kind, open_kind, values = _semantics(span, data, inner)
    status = Status(StatusCode.UNSET)
    if outcome is not None:
        values = {**values, **_waited(outcome)}
        said, failed = CALL_OUTCOMES.get(outcome, (outcome, False))
        if failed:
            status = Status(StatusCode.ERROR, f"the call was {said}, not run")
    elif span.name == DECISION_SPAN_NAME:
        said, failed = CALL_OUTCOMES.get(_text(inner.get("decision")), ("", False))
        if failed:
            status = Status(StatusCode.ERROR, f"{_text(inner.get('tool'))} {said}")
    values = {
        **values,
        OPENINFERENCE_KIND: open_kind,
        "agents.trace_id": span.trace_id,
        "agents.span_id": span.span_id,
        "agents.span_type": span.span_type,
    }
    if trace is not None:
        values["gen_ai.conversation.id"] = trace.group_id
        values["session.id"] = trace.group_id  # OpenInference's
        if not span.parent_id:
            metadata = trace.metadata if isinstance(trace.metadata, dict) else {}
            values["agentsite.workflow"] = trace.workflow_name
            values["agentsite.run_id"] = _text(metadata.get("run_id"))
            values["agentsite.agent"] = _text(metadata.get("agent"))
            # How the run ended, where the engine stored it (a stored trace; not forwarded).
            values["agentsite.outcome"] = _text(getattr(trace, "outcome", ""))
            values["agentsite.outcome_reason"] = _text(getattr(trace, "outcome_reason", ""))
    values["agents.span_data"] = _json(data) if data else None
    if span.error is not None:
        error = span.error if isinstance(span.error, dict) else {"message": span.error}
        status = Status(StatusCode.ERROR, _cut(_text(error.get("message"))))
        if error.get("data") is not None:
            values["agents.error.data"] = _json(error["data"])
    trace_id = int(trace_id_hex(span.trace_id), 16)
    started = span.started_at or span.ended_at
    return ReadableSpan(
        name=name,
        context=_context(trace_id, span.span_id),
        parent=_context(trace_id, span.parent_id) if span.parent_id else None,
        resource=resource or project_resource(),
        attributes=attributes(values),
        kind=kind,
        status=status,
        start_time=unix_nanos(started),
        end_time=unix_nanos(span.ended_at or started),
        instrumentation_scope=_scope(),
    )


def _context(trace_id: int, span_id: str) -> SpanContext:
    return SpanContext(
        trace_id, int(span_id_hex(span_id), 16), is_remote=False, trace_flags=SAMPLED
    )


SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def _semantics(
    span: SpanLike, data: dict[str, Any], inner: dict[str, Any]
) -> tuple[str, SpanKind, str, dict[str, Any]]:
    """The span's OTLP name, kind, OpenInference kind and attributes, by its SDK type."""
    kind = span.span_type
    if kind in ("generation", "response"):
        return _model_call(span, data)
    if kind == "agent":
        agent = _text(data.get("name"))
        values = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": PROVIDER,
            "gen_ai.agent.name": agent,
            "agents.agent.tools": _strings(data.get("tools")),
            "agents.agent.handoffs": _strings(data.get("handoffs")),
            "agents.agent.output_type": _text(data.get("output_type")),
        }
        return f"invoke_agent {agent}".strip(), SpanKind.INTERNAL, "AGENT", values
    if kind == "function":
        return _tool_call(data)
    if kind == "handoff":
        handoff = {
            "agents.handoff.from": data.get("from_agent"),
            "agents.handoff.to": data.get("to_agent"),
        }
        return span.name, SpanKind.INTERNAL, "CHAIN", handoff
    if kind == "guardrail":
        guardrail = {
            "agents.guardrail.name": data.get("name"),
            "agents.guardrail.triggered": _flag(data.get("triggered")),
        }
        return span.name, SpanKind.INTERNAL, "GUARDRAIL", guardrail
    if span.name == DECISION_SPAN_NAME:
        tool = _text(inner.get("tool"))
        return f"review {tool}".strip(), SpanKind.INTERNAL, "EVALUATOR", _decision(inner)
    return span.name or kind, SpanKind.INTERNAL, "CHAIN", {}


def _tool_call(data: dict[str, Any]) -> tuple[str, SpanKind, str, dict[str, Any]]:
    tool = _text(data.get("name"))
    mcp = _mapping(data.get("mcp_data"))
    values: dict[str, Any] = {
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "function",
        # Opt-in in the conventions; here only what the site stores (masked, and none with
        # AGENTSITE_TRACE_SENSITIVE_DATA off).
        "gen_ai.tool.call.arguments": _text(data.get("input")),
        "gen_ai.tool.call.result": _text(data.get("output")),
        "tool.name": tool,  # OpenInference's
        "input.value": _text(data.get("input")),
        "output.value": _text(data.get("output")),
        "agents.mcp.server": _text(mcp.get("server")),
    }
    if data.get("awaiting_approval"):
        # The SDK's span of a call that paused for a reviewer: it did not run (the call that
        # runs after an approval has a span of its own).
        values["agentsite.tool.outcome"] = "awaiting approval"
        values["gen_ai.operation.name"] = "await_approval"
        return f"await_approval {tool}".strip(), SpanKind.INTERNAL, "CHAIN", values
    values["gen_ai.operation.name"] = "execute_tool"
    return f"execute_tool {tool}".strip(), SpanKind.INTERNAL, "TOOL", values


def _waited(outcome: str) -> dict[str, Any]:
    said, _ = CALL_OUTCOMES.get(outcome, (outcome, False))
    return {"agentsite.tool.outcome": said, "agentsite.approval.decision": outcome}


def _model_call(span: SpanLike, data: dict[str, Any]) -> tuple[str, SpanKind, str, dict[str, Any]]:
    requested = data.get("model") if isinstance(data.get("model"), str) else ""
    # The exporter names a call without a model "unknown model" (for its cost): no model here.
    answered = span.model if span.model and span.model != "unknown model" else requested
    config = _mapping(data.get("model_config"))
    model = requested or answered
    values: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,  # its name before semconv 1.37, which most tools still read
        "gen_ai.request.model": model,
        "gen_ai.response.model": answered,
        "gen_ai.response.id": _text(data.get("response_id")),
        "gen_ai.request.temperature": _number(config.get("temperature")),
        "gen_ai.request.top_p": _number(config.get("top_p")),
        "gen_ai.request.max_tokens": _number(config.get("max_tokens")),
        "gen_ai.usage.input_tokens": span.input_tokens,
        "gen_ai.usage.output_tokens": span.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": span.cached_tokens,
        # OpenInference's names of the same
        "llm.model_name": answered,
        "llm.provider": PROVIDER,
        "llm.token_count.prompt": span.input_tokens,
        "llm.token_count.completion": span.output_tokens,
        "llm.token_count.total": span.input_tokens + span.output_tokens,
        "llm.token_count.prompt_details.cache_read": span.cached_tokens,
    }
    values.update(messages_attributes(data.get("input"), data.get("output")))
    return f"chat {model}".strip(), SpanKind.CLIENT, "LLM", values


# --- messages (semconv 1.38's JSON, and OpenInference's flattened form) --------------------


def messages_attributes(given: Any, answered: Any) -> dict[str, Any]:
    """A model call's messages as the GenAI conventions have them: `gen_ai.input.messages`,
    `gen_ai.output.messages`, `gen_ai.system_instructions`, each a JSON array of messages
    with a role and typed parts; and as OpenInference's `input.value`, `output.value` and
    `llm.{input,output}_messages.<i>.message.{role,content}`. From the SDK's items (chat or
    Responses shape), as stored: nothing when the site stores no inputs and outputs."""
    system, inputs = _messages(given)
    _, outputs = _messages(answered)
    if outputs:
        calls = any(part.get("type") == "tool_call" for m in outputs for part in m["parts"])
        outputs[-1]["finish_reason"] = "tool_call" if calls else "stop"
    values: dict[str, Any] = {
        "gen_ai.system_instructions": _json_or_none(system),
        "gen_ai.input.messages": _json_or_none(inputs),
        "gen_ai.output.messages": _json_or_none(outputs),
    }
    if inputs or system:
        values["input.value"] = _json({"messages": _flat(system, inputs)})
        values["input.mime_type"] = "application/json"
    if outputs:
        values["output.value"] = _json({"messages": _flat([], outputs)})
        values["output.mime_type"] = "application/json"
    for prefix, listed in (
        ("llm.input_messages", _flat(system, inputs)),
        ("llm.output_messages", _flat([], outputs)),
    ):
        for index, message in enumerate(listed[-FLAT_MESSAGES:]):
            values[f"{prefix}.{index}.message.role"] = message["role"]
            values[f"{prefix}.{index}.message.content"] = message["content"]
    return values


def _json_or_none(value: list[Any]) -> str | None:
    return _json(value) if value else None


def _messages(items: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system instruction parts, messages) of the SDK's items, in either shape, read as the
    span panel reads them (`tracing.messages.conversation`): an answer's text and tool calls
    are one assistant message, each tool result one tool message."""
    system: list[dict[str, Any]] = []
    found: list[dict[str, Any]] = []
    for said in conversation(items):
        part = _part(said)
        if part is None:
            continue
        if said.role == "system":
            system.append(part)
        elif said.role == "assistant" and found and found[-1]["role"] == "assistant":
            found[-1]["parts"].append(part)
        else:
            found.append({"role": said.role, "parts": [part]})
    return system, found


def _part(said: Message) -> dict[str, Any] | None:
    """One message of the conversation as a part of the conventions' message."""
    if said.kind == "tool_call":
        arguments = _arguments(said.arguments)
        return {"type": "tool_call", "id": said.call_id, "name": said.name, "arguments": arguments}
    if said.kind == "tool_result":
        return {"type": "tool_call_response", "id": said.call_id, "response": said.text}
    if said.kind == "text":
        return {"type": "text", "content": said.text} if said.text else None
    kind = "reasoning" if said.kind == "reasoning" else said.name or "other"
    return {"type": kind, "content": said.text}


def _arguments(value: str) -> Any:
    """A call's arguments as JSON when they are (the panel's text is indented JSON)."""
    try:
        return json.loads(value) if value else {}
    except ValueError:
        return value


def _flat(system: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Messages as role and text, as OpenInference flattens them."""
    flat = [{"role": "system", "content": _texts(system)}] if system else []
    for message in messages:
        flat.append({"role": message["role"], "content": _texts(message["parts"])})
    return flat


def _texts(parts: list[dict[str, Any]]) -> str:
    said = []
    for part in parts:
        if part.get("type") == "text":
            said.append(_text(part.get("content")))
        elif part.get("type") == "tool_call":
            said.append(f"{part.get('name')}({_json(part.get('arguments'))})")
        elif part.get("type") == "tool_call_response":
            said.append(_text(part.get("response")))
        else:
            said.append(_text(part.get("content")))
    return "\n".join(said)


def _decision(data: dict[str, Any]) -> dict[str, Any]:
    """A reviewer's decision (`recording.record_decision`): what the site adds to the run."""
    reviewer = _text(data.get("reviewer"))
    return {
        "agentsite.approval.decision": _text(data.get("decision")),
        "agentsite.approval.reviewer": reviewer,
        "agentsite.approval.tool": _text(data.get("tool")),
        "agentsite.approval.policy": _text(data.get("policy")),
        "agentsite.approval.message": _text(data.get("message")),
        "agentsite.approval.always": _flag(data.get("always")),
        "agentsite.approval.edited": _flag(data.get("edited")),
        "agentsite.approval.waited_seconds": _number(data.get("waited_seconds")),
        "agentsite.approval.arguments_hash": _text(data.get("arguments_hash")),
        "agentsite.approval.edited_arguments_hash": _text(data.get("edited_arguments_hash")),
        "agentsite.approval.edited_arguments": _text(data.get("edited_arguments")),
        "agentsite.approval.changed": _strings(data.get("changed")),
        "gen_ai.tool.name": _text(data.get("tool")),
        "gen_ai.tool.call.id": _text(data.get("call_id")),
        "user.id": reviewer,  # OpenInference's: who decided
        "output.value": _text(data.get("decision")),
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


@cache
def _version() -> str:
    try:
        return importlib.metadata.version("agentsite")
    except importlib.metadata.PackageNotFoundError:
        return ""


@cache
def _scope() -> InstrumentationScope:
    return InstrumentationScope(SCOPE_NAME, _version() or None, SEMCONV)


@cache
def project_resource(project: str = "agentsite") -> Resource:
    """The resource every span is sent with: the project's name as `service.name` and as
    OpenInference's `openinference.project.name` (Phoenix's project)."""
    values = {"service.name": project, "openinference.project.name": project}
    if _version():
        values["service.version"] = _version()
    return Resource(values)


def readable_spans(
    spans: Iterable[SpanLike],
    traces: Mapping[str, TraceLike] | None = None,
    *,
    project: str = "agentsite",
) -> list[ReadableSpan]:
    """`spans` as OpenTelemetry's spans, a call that waited for a reviewer with the decision
    on it when one of `spans` holds it (a stored trace); `traces`, by trace id, adds what is
    known of their traces."""
    known = traces or {}
    listed = list(spans)
    outcomes = _call_outcomes(listed)
    resource = project_resource(project)
    return [
        readable_span(
            span, known.get(span.trace_id), resource=resource, outcome=outcomes.get(span.span_id)
        )
        for span in listed
    ]


def _call_outcomes(spans: Sequence[SpanLike]) -> dict[str, str]:
    """The decision on each call that waited (its span id: the decision's word): a tool's
    waiting calls and its decisions, in the order they happened, pair up."""
    waiting: dict[str, list[SpanLike]] = {}
    decided: dict[str, list[str]] = {}
    for span in sorted(spans, key=lambda span: span.started_at or datetime.min.replace(tzinfo=UTC)):
        data = span.span_data if isinstance(span.span_data, dict) else {}
        if span.span_type == "function" and data.get("awaiting_approval"):
            waiting.setdefault(_text(data.get("name")), []).append(span)
        elif span.name == DECISION_SPAN_NAME:
            inner = _mapping(data.get("data"))
            decided.setdefault(_text(inner.get("tool")), []).append(_text(inner.get("decision")))
    return {
        span.span_id: decision
        for tool, calls in waiting.items()
        for span, decision in zip(calls, decided.get(tool, ()), strict=False)
    }


def protobuf_request(
    spans: Iterable[SpanLike],
    traces: Mapping[str, TraceLike] | None = None,
    *,
    project: str = "agentsite",
) -> bytes:
    """An OTLP `ExportTraceServiceRequest` of `spans`, in protobuf (OpenTelemetry's own
    encoder: what its OTLP/HTTP exporter sends)."""
    return encode_proto(readable_spans(spans, traces, project=project)).SerializeToString()


def json_request(
    spans: Iterable[SpanLike],
    traces: Mapping[str, TraceLike] | None = None,
    *,
    project: str = "agentsite",
) -> str:
    """The same request in OTLP/JSON (OpenTelemetry's own JSON encoder: hex ids, times as
    strings, enums as numbers)."""
    return encode_json(readable_spans(spans, traces, project=project)).to_json()
