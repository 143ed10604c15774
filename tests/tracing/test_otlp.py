"""OpenTelemetry out (`tracing/otlp.py`): `/traces/<id>.otlp.json` and the forwarding of spans to
an OTLP/HTTP endpoint, both checked by a local OTLP receiver that parses each request with
OpenTelemetry's own protobuf schema, strictly (an unknown field is a 400)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agents import function_span, set_trace_processors, trace
from agents.tracing import ResponseSpanData, get_trace_provider
from agents.tracing.processors import default_processor
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import reverse
from google.protobuf.json_format import Parse as parse_json
from google.protobuf.json_format import ParseError
from google.protobuf.message import DecodeError
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as ProtobufSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as OtlpSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

from agentsite.settings import _otlp_endpoint
from demo import model as demo_model
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.agentsite.test_settings import import_settings
from tests.conftest import Traces
from tests.factories import (
    customer_for,
    make_conversation,
    make_reviewer,
    make_span,
    make_staff,
    make_trace,
    make_user,
    make_viewer,
)
from tests.services import free_port
from tracing import exporter as exporter_module
from tracing import forwarding, otlp
from tracing.models import Span
from tracing.recording import DECISION_SPAN_NAME

pytestmark = pytest.mark.django_db

# --- a local OTLP/HTTP receiver ---------------------------------------------------------------

# OTLP/JSON writes these ids as hex; the protobuf JSON mapping (which `Parse` reads) as base64.
ID_FIELDS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def hex_ids_to_base64(request: dict[str, Any]) -> dict[str, Any]:
    """What the OTLP specification asks a receiver of OTLP/JSON to do before the protobuf
    mapping: hex ids (of their exact length) to bytes. Anything else raises ValueError."""
    for resource in request.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            for span in scope.get("spans", []):
                for item in [span, *span.get("links", [])]:
                    for key, size in ID_FIELDS.items():
                        if key in item:
                            raw = bytes.fromhex(item[key])
                            if len(raw) != size:
                                raise ValueError(f"{key} {item[key]!r} is not {size} bytes")
                            item[key] = base64.b64encode(raw).decode()
    return request


def parse_otlp(body: bytes) -> ExportTraceServiceRequest:
    """An OTLP/JSON body as a receiver reads it: strictly (unknown fields fail)."""
    return parse_json(json.dumps(hex_ids_to_base64(json.loads(body))), ExportTraceServiceRequest())


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """A protobuf body as a receiver reads it: every byte a known field."""
    request = ExportTraceServiceRequest.FromString(body)
    if request.SerializeToString() != body:
        raise ValueError("fields the schema does not define")
    return request


@dataclass
class Receiver:
    url: str
    answer: list[int] = field(default_factory=lambda: [200])  # status codes, the last repeats
    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    types: list[str] = field(default_factory=list)
    parsed: list[ExportTraceServiceRequest] = field(default_factory=list)

    def spans(self) -> list[OtlpSpan]:
        return [
            span
            for request in self.parsed
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver on 127.0.0.1: POST /v1/traces with application/x-protobuf or
    application/json, parsed with OpenTelemetry's protobuf schema -> 200 `{}` (or what
    `answer` says), a bad request -> 400, another content type -> 415 (as Phoenix)."""
    server: ThreadingHTTPServer
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.bodies.append(body)
            state.headers.append({k.lower(): v for k, v in self.headers.items()})
            code = state.answer.pop(0) if len(state.answer) > 1 else state.answer[0]
            if code == 200:
                try:
                    if self.path != "/v1/traces":
                        raise ValueError(f"no such path {self.path}")
                    kind = self.headers.get("Content-Type")
                    state.types.append(kind or "")
                    if kind == "application/x-protobuf":
                        state.parsed.append(parse_protobuf(body))
                    elif kind == "application/json":
                        state.parsed.append(parse_otlp(body))
                    else:
                        return self._answer(415, json.dumps({"message": f"Unsupported {kind}"}))
                except (ValueError, ParseError, DecodeError) as refused:
                    return self._answer(400, json.dumps({"message": str(refused)}))
            self._answer(code, "{}")

        def _answer(self, code: int, text: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, format: str, *args: Any) -> None: ...

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def post(url: str, body: bytes, kind: str = "application/json") -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": kind}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def attrs(span: OtlpSpan) -> dict[str, Any]:
    """A span's attributes as Python values, by their OTLP type."""
    return {item.key: value_of(item.value) for item in span.attributes}


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(item) for item in value.array_value.values]
    return getattr(value, kind)


def nanos(value: datetime) -> int:
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def test_the_receiver_refuses_what_otlp_does_not_define(receiver: Receiver) -> None:
    good: dict[str, Any] = {"resourceSpans": [{"scopeSpans": [{"spans": []}]}]}
    assert post(receiver.url, json.dumps(good).encode()) == 200
    unknown = {"resourceSpans": [{"scopeSpans": [{"spans": [], "colour": "red"}]}]}
    assert post(receiver.url, json.dumps(unknown).encode()) == 400
    short_id = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab", "spanId": ""}]}]}]}
    assert post(receiver.url, json.dumps(short_id).encode()) == 400


# --- runs of the demo agent -------------------------------------------------------------------


TOOLS_AND_HANDOFF = [
    demo_model.ToolCall("lookup_order", {"order_id": 7}),
    demo_model.ToolCall("transfer_to_billing", {}),
    demo_model.ToolCall("issue_refund", {"order_id": 7, "amount": 20.0}),
    demo_model.Say("I refunded $20.00 on order 7; it reaches your card in 3–5 days."),
]


def run_demo(monkeypatch: pytest.MonkeyPatch, text: str) -> AgentRun:
    """A real run of the offline demo model through the engine, scripted to call tools and
    hand off (it still counts tokens and traces its generations as always)."""
    queue = list(TOOLS_AND_HANDOFF)
    monkeypatch.setattr(demo_model, "decide", lambda items, tools, handoffs: queue.pop(0))
    owner = customer_for(text)
    conversation = make_conversation(owner=owner, agent_name="support")
    run = runs.start_run(conversation, text, owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    return run


# --- /traces/<id>.otlp.json ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_otlp_export_of_a_demo_trace_is_accepted_and_round_trips_its_ids(
    client: Client,
    traces: Traces,
    demo: None,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = run_demo(monkeypatch, "I was charged for order 7 but want part of it back")
    traces.flush()
    client.force_login(make_viewer())

    url = reverse("trace_export_otlp_protobuf", args=[run.trace_id])
    assert url == f"/traces/{run.trace_id}.otlp.pb"
    response = client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-protobuf"
    assert response["Content-Disposition"] == (f'attachment; filename="{run.trace_id}.otlp.pb"')
    assert post(receiver.url, response.content, "application/x-protobuf") == 200
    # The same request in OTLP/JSON: a receiver reads the same spans from it.
    as_json = client.get(reverse("trace_export_otlp", args=[run.trace_id]))
    assert as_json["Content-Type"] == "application/json"
    assert as_json["Content-Disposition"] == (f'attachment; filename="{run.trace_id}.otlp.json"')
    assert post(receiver.url, as_json.content) == 200
    assert receiver.parsed[0] == receiver.parsed[1]
    receiver.parsed.pop()

    [request] = receiver.parsed
    [resource] = request.resource_spans
    assert {"service.name": "agentsite", "openinference.project.name": "agentsite"}.items() <= {
        a.key: a.value.string_value for a in resource.resource.attributes
    }.items()
    [scope] = resource.scope_spans
    assert scope.scope.name == "agentsite" and scope.scope.version
    assert scope.schema_url == otlp.SEMCONV
    rows = {span.span_id: span for span in Span.objects.filter(trace_id=run.trace_id)}
    got = receiver.spans()
    assert len(got) == len(rows) > 5
    by_row = {attrs(span)["agents.span_id"]: span for span in got}
    assert set(by_row) == set(rows)  # every span, each once, back to its row
    for span_id, span in by_row.items():
        row = rows[span_id]
        # The receiver's ids are the trace's: its 32 hex, the span's first 16.
        assert span.trace_id.hex() == run.trace_id.removeprefix("trace_")
        assert span.span_id.hex() == span_id.removeprefix("span_")[:16]
        assert span.parent_span_id.hex() == (
            row.parent_id.removeprefix("span_")[:16] if row.parent_id else ""
        )
        assert span.start_time_unix_nano == nanos(row.started_at)
        assert span.end_time_unix_nano == nanos(row.ended_at)
        assert attrs(span)["agents.trace_id"] == run.trace_id
        assert attrs(span)["gen_ai.conversation.id"] == run.conversation.session_id
    assert len({span.span_id for span in got}) == len(got)

    # The GenAI semantic conventions: model calls, agents, tools.
    chats = [span for span in got if attrs(span).get("gen_ai.operation.name") == "chat"]
    assert len(chats) == Span.objects.filter(trace_id=run.trace_id, span_type="generation").count()
    for chat in chats:
        row = rows[attrs(chat)["agents.span_id"]]
        values = attrs(chat)
        assert chat.name == "chat offline-demo"
        assert chat.kind == OtlpSpan.SPAN_KIND_CLIENT
        assert values["gen_ai.provider.name"] == values["gen_ai.system"] == "openai"
        assert values["gen_ai.request.model"] == values["gen_ai.response.model"] == "offline-demo"
        assert values["gen_ai.usage.input_tokens"] == row.input_tokens > 0
        assert values["gen_ai.usage.output_tokens"] == row.output_tokens > 0
        assert values["gen_ai.usage.cache_read.input_tokens"] == row.cached_tokens
        assert values["openinference.span.kind"] == "LLM"
        assert values["llm.token_count.prompt"] == row.input_tokens
        # Its messages, as the conventions' JSON: the user's words first, the model's answer.
        given = json.loads(values["gen_ai.input.messages"])
        assert given[0] == {
            "role": "user",
            "parts": [{"type": "text", "content": row.span_data["input"][1]["content"]}],
        }
        assert row.span_data["input"][0]["role"] == "system"
        assert json.loads(values["gen_ai.system_instructions"]) == [
            {"type": "text", "content": row.span_data["input"][0]["content"]}
        ]
        assert json.loads(values["input.value"])["messages"][1]["role"] == "user"
        assert values["llm.input_messages.0.message.role"] == "system"
        assert values["llm.input_messages.1.message.role"] == "user"
        answered = json.loads(values["gen_ai.output.messages"])
        assert [message["role"] for message in answered] == ["assistant"]
        assert answered[-1]["finish_reason"] in ("stop", "tool_call")
    # The first call asked for lookup_order; the last said the refund was made.
    first, last = sorted(chats, key=lambda span: span.start_time_unix_nano)[:: len(chats) - 1]
    [call] = json.loads(attrs(first)["gen_ai.output.messages"])[0]["parts"]
    assert call == {
        "type": "tool_call",
        "id": call["id"],
        "name": "lookup_order",
        "arguments": {"order_id": 7},
    }
    assert json.loads(attrs(first)["gen_ai.output.messages"])[0]["finish_reason"] == "tool_call"
    said = json.loads(attrs(last)["gen_ai.output.messages"])[0]
    assert said["parts"][0]["content"].startswith("I refunded $20.00")
    assert said["finish_reason"] == "stop"
    assert json.loads(attrs(last)["gen_ai.system_instructions"])[0]["type"] == "text"
    told = [m["role"] for m in json.loads(attrs(last)["gen_ai.input.messages"])]
    assert told[0] == "user" and "tool" in told and "assistant" in told
    # Every span has a kind a viewer understands: none is left UNKNOWN.
    kinds = {span.name.split(" ")[0]: attrs(span)["openinference.span.kind"] for span in got}
    assert kinds["invoke_agent"] == "AGENT" and kinds["execute_tool"] == "TOOL"
    assert kinds["chat"] == "LLM"
    assert set(kinds.values()) <= {"AGENT", "TOOL", "LLM", "CHAIN", "GUARDRAIL"}
    assert "GUARDRAIL" in kinds.values()
    agents = {attrs(s)["gen_ai.agent.name"]: s for s in got if s.name.startswith("invoke_agent")}
    assert set(agents) == {"Support desk", "Billing"}
    assert all(attrs(s)["gen_ai.operation.name"] == "invoke_agent" for s in agents.values())
    assert "lookup_order" in attrs(agents["Support desk"])["agents.agent.tools"]
    tools = {attrs(s)["gen_ai.tool.name"]: s for s in got if s.name.startswith("execute_tool ")}
    assert set(tools) == {"lookup_order", "issue_refund"}
    assert tools["issue_refund"].name == "execute_tool issue_refund"
    assert json.loads(attrs(tools["issue_refund"])["gen_ai.tool.call.arguments"]) == {
        "order_id": 7,
        "amount": 20.0,
    }
    [root] = [span for span in got if not span.parent_span_id]
    assert attrs(root)["agentsite.run_id"] == str(run.pk)
    assert attrs(root)["agentsite.outcome"] == "completed"
    assert (
        attrs(root)["agentsite.workflow"]
        == Span.objects.get(trace_id=run.trace_id, parent_id=None).trace.workflow_name
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("decision", "outcome", "failed"),
    [
        (runs.Decision.approve(), "approved", False),
        (runs.Decision.reject("Not this one"), "rejected", True),
        (runs.Decision.respond("Cancelled by hand"), "answered by the reviewer", False),
    ],
    ids=["approve", "reject", "respond"],
)
def test_a_real_approval_is_exported_with_its_decision(
    client: Client,
    traces: Traces,
    demo: None,
    receiver: Receiver,
    decision: runs.Decision,
    outcome: str,
    failed: bool,
) -> None:
    owner = customer_for("cancel order 42")
    conversation = make_conversation(owner=owner, agent_name="support")
    run = runs.start_run(conversation, "cancel order 42", owner)
    asyncio.run(runs.execute(run.pk))
    request = run.approval_requests.get()
    assert request.agent_span_id  # the agent span that asked, known at the pause
    runs.decide(request, make_reviewer("rita"), decision)
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    traces.flush()
    client.force_login(make_viewer())

    body = client.get(reverse("trace_export_otlp_protobuf", args=[run.trace_id])).content
    assert post(receiver.url, body, "application/x-protobuf") == 200
    got = receiver.spans()
    assert len(got) == Span.objects.filter(trace_id=run.trace_id).count()
    by_id = {span.span_id: span for span in got}
    # The decision: its own kind, under the agent span that asked (decided before the
    # exporter stored that span: it was known at the pause).
    [review] = [span for span in got if span.name == "review cancel_order"]
    assert attrs(review)["openinference.span.kind"] == "EVALUATOR"
    assert attrs(review)["agentsite.approval.reviewer"] == "rita"
    assert attrs(review)["agentsite.approval.waited_seconds"] >= 0
    assert by_id[review.parent_span_id].name == "invoke_agent Support desk"
    assert attrs(by_id[review.parent_span_id])["agents.span_id"] == request.agent_span_id
    # The call: its span at the pause did not run, and says what became of it.
    [waited] = [span for span in got if span.name == "await_approval cancel_order"]
    assert attrs(waited)["openinference.span.kind"] == "CHAIN"
    assert attrs(waited)["agentsite.tool.outcome"] == outcome
    error = waited.status.STATUS_CODE_ERROR
    assert (waited.status.code == error) is failed
    assert (review.status.code == error) is failed
    if failed:
        assert waited.status.message == "the call was rejected, not run"
    ran = [span for span in got if span.name == "execute_tool cancel_order"]
    if outcome == "approved":  # one call: the one that ran
        [tool] = ran
        assert attrs(tool)["openinference.span.kind"] == "TOOL"
        assert "cancelled" in attrs(tool)["gen_ai.tool.call.result"]
    else:
        assert ran == []
    # Paused, then resumed: one root span per part, both with the run and its outcome.
    roots = [span for span in got if not span.parent_span_id]
    assert len(roots) == 2


def test_approval_decisions_errors_and_foreign_ids_are_exported(
    client: Client, receiver: Receiver
) -> None:
    trace = make_trace(trace_id="a foreign trace", group_id="conv_x")
    agent = make_span(trace, "agent", "Support desk", span_data={"type": "agent", "name": "S"})
    tool = make_span(
        trace,
        "function",
        "cancel_order",
        parent=agent,
        span_data={"type": "function", "name": "cancel_order", "input": "{}", "output": None},
        error={"message": "Tool failed: no such order", "data": {"order": 99}},
    )
    decision = make_span(
        trace,
        "custom",
        DECISION_SPAN_NAME,
        parent=agent,
        span_id="decision-1",
        span_data={
            "type": "custom",
            "name": DECISION_SPAN_NAME,
            "data": {
                "reviewer": "rita",
                "decision": "reject",
                "message": "Not this one",
                "always": False,
                "tool": "cancel_order",
                "call_id": "call_1",
            },
        },
    )
    Span.objects.bulk_create([agent, tool, decision])
    client.force_login(make_staff())

    body = client.get(reverse("trace_export_otlp", args=[trace.trace_id])).content
    assert post(receiver.url, body) == 200
    got = {attrs(span)["agents.span_id"]: span for span in receiver.spans()}
    assert set(got) == {agent.span_id, tool.span_id, "decision-1"}

    # An id of another shape: the start of its digest, the same each time; its own in attributes.
    assert got["decision-1"].span_id.hex() == otlp.span_id_hex("decision-1")
    assert got["decision-1"].trace_id.hex() == otlp.trace_id_hex("a foreign trace")
    assert otlp.span_id_hex("decision-1") == otlp.span_id_hex("decision-1") != "0" * 16
    assert attrs(got["decision-1"])["agents.trace_id"] == "a foreign trace"
    assert got["decision-1"].parent_span_id == got[agent.span_id].span_id

    assert attrs(got["decision-1"]) | {
        "agentsite.approval.decision": "reject",
        "agentsite.approval.reviewer": "rita",
        "agentsite.approval.tool": "cancel_order",
        "agentsite.approval.message": "Not this one",
        "agentsite.approval.always": False,  # a boolValue
        "gen_ai.tool.call.id": "call_1",
    } == attrs(got["decision-1"])
    failed = got[tool.span_id]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    assert failed.status.message == "Tool failed: no such order"
    assert json.loads(attrs(failed)["agents.error.data"]) == {"order": 99}
    assert got[agent.span_id].status.code == failed.status.STATUS_CODE_UNSET


def test_the_otlp_export_is_for_operators_only() -> None:
    trace = make_trace()
    url = reverse("trace_export_otlp", args=[trace.trace_id])
    anonymous = Client().get(url)
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/accounts/login/?next=")
    expected = {"alice": 403, "rita": 403, "olga": 200, "sam": 200}
    people = [make_user(username="alice"), make_reviewer("rita"), make_viewer(), make_staff()]
    for person in people:
        visitor = Client()
        visitor.force_login(person)
        assert visitor.get(url).status_code == expected[person.username], person.username
        assert visitor.post(url).status_code in (403, 405)
    viewer = Client()
    viewer.force_login(people[2])
    assert viewer.get("/traces/trace_nope.otlp.json").status_code == 404
    # The SDK-shaped export still answers beside it.
    assert viewer.get(reverse("trace_export", args=[trace.trace_id])).status_code == 200


# --- ids and values -----------------------------------------------------------------------------


def test_ids_are_the_sdks_own_hex_or_a_stable_digest() -> None:
    assert otlp.trace_id_hex("trace_" + "0123456789abcdef" * 2) == "0123456789abcdef" * 2
    assert otlp.span_id_hex("span_0123456789abcdef01234567") == "0123456789abcdef"
    for odd in ("custom", "span_XYZ", "trace_" + "0" * 32, "span_" + "0" * 24):
        assert re.fullmatch(r"[0-9a-f]+", otlp.span_id_hex(odd))
        assert otlp.span_id_hex(odd).strip("0") and otlp.trace_id_hex(odd).strip("0")
        assert len(otlp.span_id_hex(odd)) == 16 and len(otlp.trace_id_hex(odd)) == 32
    assert otlp.span_id_hex("custom") == otlp.span_id_hex("custom") != otlp.span_id_hex("other")
    assert otlp.attribute(True) is True
    assert otlp.attribute(2**40) == 2**40
    assert otlp.attribute(float("nan")) == "nan"
    assert otlp.attribute({"a": 1}) == '{"a": 1}'
    assert otlp.attribute(["a", 1]) == '["a", 1]'  # a list of mixed types: its JSON
    assert otlp.attribute("x" * 40_000).endswith("…")
    assert len(otlp.attribute("x" * 40_000)) == otlp.ATTRIBUTE_CHARS
    assert otlp.attribute("") is None
    assert otlp.unix_nanos(datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)) == (
        1767323045678901000
    )


# --- forwarding -------------------------------------------------------------------------------


@pytest.fixture
def fresh_install(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[None]:
    """`exporter.install()` as at startup, in this test: its processors are this test's."""
    settings.AGENTSITE_TRACE_BATCH_DELAY = 3600.0  # exported when the test flushes
    monkeypatch.setattr(exporter_module, "_installed", None)
    monkeypatch.setattr(exporter_module, "_forwarding", None)
    monkeypatch.setattr(exporter_module.atexit, "register", lambda *a, **k: None)
    monkeypatch.setattr(forwarding.atexit, "register", lambda *a, **k: None)
    monkeypatch.setattr(forwarding.atexit, "unregister", lambda *a, **k: None)
    forwarding.reset()
    set_trace_processors([])
    yield
    installed = [exporter_module.installed(), exporter_module.forwarding()]
    set_trace_processors([])
    for processor in installed:
        if processor is not None:
            processor.shutdown()
    forwarding.reset()


def flush() -> None:
    for processor in (exporter_module.installed(), exporter_module.forwarding()):
        assert processor is not None
        processor.force_flush()
    sending = forwarding.current()
    assert sending is not None
    assert sending.flush(30)


def test_the_setting_adds_a_forwarding_processor_beside_ours(
    fresh_install: None, settings: Any, receiver: Receiver
) -> None:
    settings.AGENTSITE_OTLP_ENDPOINT = ""
    first = exporter_module.install()
    assert first is not None and exporter_module.forwarding() is None
    first.shutdown()
    exporter_module._installed = None

    settings.AGENTSITE_OTLP_ENDPOINT = receiver.url
    settings.AGENTSITE_OTLP_HEADERS = {"authorization": "Bearer t0ken"}
    settings.AGENTSITE_OTLP_SERVICE_NAME = "shop-agents"
    set_trace_processors([default_processor()])
    ours = exporter_module.install()
    processor = exporter_module.forwarding()
    registered = exporter_module.get_trace_provider()._multi_processor._processors  # type: ignore[attr-defined]
    assert registered == (ours, processor)  # the OpenAI uploader left, no key
    assert processor is not None and processor is not ours
    forwarder = processor._exporter
    assert isinstance(forwarder, exporter_module.OtlpExporter)
    assert forwarder.project == "shop-agents"
    # OpenTelemetry's own exporter, protobuf by default, behind its batch processor.
    sending = forwarder.forwarding
    assert isinstance(sending.processor, BatchSpanProcessor)
    assert isinstance(sending.forwarder.exporter, ProtobufSpanExporter)
    assert sending.forwarder.shown == receiver.url


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_the_forwarding_exporter_delivers_a_real_runs_spans_masked(
    fresh_install: None,
    settings: Any,
    demo: None,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    protocol: str,
) -> None:
    settings.AGENTSITE_OTLP_ENDPOINT = receiver.url
    settings.AGENTSITE_OTLP_HEADERS = {"authorization": "Bearer t0ken"}
    settings.AGENTSITE_OTLP_PROTOCOL = protocol
    settings.AGENTSITE_OTLP_SERVICE_NAME = "shop-agents"
    exporter_module.install()
    run = run_demo(monkeypatch, "Refund order 7 please, write to bob.smith@example.com")
    flush()

    assert set(receiver.types) == {
        "application/x-protobuf" if protocol == "http/protobuf" else "application/json"
    }
    rows = set(Span.objects.filter(trace_id=run.trace_id).values_list("span_id", flat=True))
    got = [span for span in receiver.spans() if attrs(span)["agents.trace_id"] == run.trace_id]
    assert len(rows) > 5
    assert {attrs(span)["agents.span_id"] for span in got} == rows
    assert {span.trace_id.hex() for span in got} == {run.trace_id.removeprefix("trace_")}
    assert all(headers["authorization"] == "Bearer t0ken" for headers in receiver.headers)
    resource = {
        a.key: a.value.string_value
        for a in receiver.parsed[0].resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == resource["openinference.project.name"] == "shop-agents"
    # Masked as the database holds it: the address never left the site.
    sent = b"".join(receiver.bodies)
    assert b"bob.smith@example.com" not in sent
    assert b"[email]" in sent
    chats = [span for span in got if span.name == "chat offline-demo"]
    assert chats and all(attrs(span)["gen_ai.usage.input_tokens"] > 0 for span in chats)
    assert all("gen_ai.input.messages" in attrs(span) for span in chats)
    # The trace item came first: its conversation is on every span.
    assert {attrs(span)["gen_ai.conversation.id"] for span in got} == {run.conversation.session_id}


@pytest.mark.django_db(transaction=True)
def test_a_decision_is_forwarded_live_under_the_agent_that_asked(
    fresh_install: None, settings: Any, demo: None, receiver: Receiver
) -> None:
    settings.AGENTSITE_OTLP_ENDPOINT = receiver.url
    exporter_module.install()
    owner = customer_for("cancel order 42")
    conversation = make_conversation(owner=owner, agent_name="support")
    run = runs.start_run(conversation, "cancel order 42", owner)
    asyncio.run(runs.execute(run.pk))
    flush()
    paused = {span.name: span for span in receiver.spans()}
    # At the pause: the call waits; it is no tool call (yet).
    assert "await_approval cancel_order" in paused
    assert "execute_tool cancel_order" not in paused
    assert attrs(paused["await_approval cancel_order"])["agentsite.tool.outcome"] == (
        "awaiting approval"
    )
    request = run.approval_requests.get()
    edited = {"order_id": 43}
    runs.decide(request, make_reviewer("rita"), runs.Decision.edit(edited))
    forwarding_now = forwarding.current()
    assert forwarding_now is not None and forwarding_now.flush(30)
    [review] = [span for span in receiver.spans() if span.name == "review cancel_order"]
    values = attrs(review)
    assert values["openinference.span.kind"] == "EVALUATOR"
    assert values["agentsite.approval.decision"] == "edit and approve"
    assert values["agentsite.approval.reviewer"] == "rita"
    assert values["agentsite.approval.changed"] == ["order_id"]
    assert values["agentsite.approval.waited_seconds"] >= 0
    agent = paused["invoke_agent Support desk"]
    assert review.parent_span_id == agent.span_id and review.trace_id == agent.trace_id


def test_forwarding_honours_the_sensitive_data_setting(settings: Any, receiver: Receiver) -> None:
    settings.AGENTSITE_TRACE_SENSITIVE_DATA = False
    settings.AGENTSITE_TRACE_BATCH_DELAY = 3600.0
    sending = forwarding.Forwarding(
        forwarding.span_exporter(receiver.url), queue=100, delay=3600.0, batch=100
    )
    processor = exporter_module.make_processor(exporter_module.OtlpExporter(sending))
    set_trace_processors([processor])
    try:
        with (
            trace("by hand", group_id="conv_1"),
            function_span(
                "lookup_order",
                input='{"email": "eve@example.com"}',
                output="Order of eve@example.com",
            ),
        ):
            pass
        processor.force_flush()
        assert sending.flush(30)
    finally:
        set_trace_processors([])
        processor.shutdown()
        sending.shutdown()
    [span] = receiver.spans()
    assert span.name == "execute_tool lookup_order"
    assert not {"gen_ai.tool.call.arguments", "gen_ai.tool.call.result"} & set(attrs(span))
    assert attrs(span)["gen_ai.conversation.id"] == "conv_1"
    assert b"eve@example.com" not in b"".join(receiver.bodies)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("collector", ["down", "500", "redirect"])
def test_a_collector_that_is_down_or_fails_costs_the_run_nothing_and_is_logged(
    fresh_install: None,
    settings: Any,
    demo: None,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    collector: str,
) -> None:
    if collector == "down":
        settings.AGENTSITE_OTLP_ENDPOINT = f"http://127.0.0.1:{free_port()}/v1/traces"
        settings.AGENTSITE_OTLP_TIMEOUT = 0.5
    else:
        settings.AGENTSITE_OTLP_ENDPOINT = receiver.url
        receiver.answer = [500 if collector == "500" else 307]
    exporter_module.install()
    with caplog.at_level(logging.WARNING, logger="tracing.forwarding"):
        run = run_demo(monkeypatch, "Refund order 7 please")
        flush()
    assert run.status == RunStatus.COMPLETED
    assert Span.objects.filter(trace_id=run.trace_id).count() > 5  # stored all the same
    warnings = [r for r in caplog.records if r.name == "tracing.forwarding"]
    assert len(warnings) == 1
    assert "spans were not delivered to" in warnings[0].getMessage()
    if collector == "500":
        assert "HTTP 500" in warnings[0].getMessage()
        assert len(receiver.bodies) == 1  # a 500 is final in OTLP: not retried
    if collector == "redirect":
        assert "HTTP 307: a redirect, not followed" in warnings[0].getMessage()
        assert len(receiver.bodies) == 1
    sending = forwarding.current()
    assert sending is not None
    assert sending.forwarder.lost == 1 and sending.forwarder.delivered == 0


def test_a_burst_of_failures_is_logged_once_and_retryable_answers_are_retried(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    sender = forwarding.span_exporter(receiver.url, timeout=5, clock=lambda: now[0])
    spans = otlp.readable_spans([make_span(make_trace(), "custom", "x", span_data={})])
    receiver.answer = [503, 503, 200]
    with caplog.at_level(logging.DEBUG, logger="tracing.forwarding"):
        # 503, then Retry-After-less backoff: OpenTelemetry's client retries (1 s, 2 s...).
        assert sender.export(spans) is SpanExportResult.SUCCESS
        assert len(receiver.bodies) == 3
        receiver.answer = [400]
        assert sender.export(spans) is SpanExportResult.FAILURE  # final: not retried
        assert len(receiver.bodies) == 4
        now[0] = 0.5
        assert sender.export(spans) is SpanExportResult.FAILURE  # paused for a second: no POST
        assert len(receiver.bodies) == 4
        now[0] = 1.5
        assert sender.export(spans) is SpanExportResult.FAILURE  # one probe, 400: paused 2 s
        assert len(receiver.bodies) == 5
        now[0] = 3.0
        assert sender.export(spans) is SpanExportResult.FAILURE
        assert len(receiver.bodies) == 5
        receiver.answer = [200]
        now[0] = 3.6
        assert sender.export(spans) is SpanExportResult.SUCCESS  # the probe is delivered
    assert len(receiver.bodies) == 6
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "tracing.forwarding" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 2
    assert "HTTP 400" in warnings[0] and "spans reach" in warnings[1]
    assert "4 batch(es) lost" in warnings[1]
    assert sender.lost == 4 and sender.delivered == 2


def test_a_sender_never_raises_and_logs_no_credentials(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    sender = forwarding.span_exporter(
        f"http://user:s3cret@127.0.0.1:{port}/v1/traces?token=s3cret", timeout=0.5
    )
    spans = otlp.readable_spans([make_span(make_trace(), "custom", "x", span_data={})])
    with caplog.at_level(logging.WARNING):
        assert sender.export(spans) is SpanExportResult.FAILURE
        assert sender.export(["not a span"]) is SpanExportResult.FAILURE
    assert f"http://127.0.0.1:{port}/v1/traces (could not connect" in caplog.text
    assert "s3cret" not in caplog.text


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    ["127.0.0.1:4318/v1/traces", "ftp://collector/v1/traces", "http://:4318/", "http://c:port/"],
)
def test_a_malformed_endpoint_is_refused(endpoint: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"AGENTSITE_OTLP_ENDPOINT='.*' is not"):
        _otlp_endpoint("AGENTSITE_OTLP_ENDPOINT", endpoint)
    assert _otlp_endpoint("X", " https://otel.example.com:4318/v1/traces ") == (
        "https://otel.example.com:4318/v1/traces"
    )
    assert _otlp_endpoint("X", "  ") == ""


def test_the_site_refuses_to_start_with_a_malformed_endpoint() -> None:
    imported = import_settings(DEBUG="1", AGENTSITE_OTLP_ENDPOINT="localhost:4318/v1/traces")
    assert imported.returncode != 0
    assert (
        "django.core.exceptions.ImproperlyConfigured: "
        "AGENTSITE_OTLP_ENDPOINT='localhost:4318/v1/traces' is not an http(s) URL with a host"
    ) in imported.stderr
    started = import_settings(
        DEBUG="1",
        AGENTSITE_OTLP_ENDPOINT="http://127.0.0.1:4318/v1/traces",
        AGENTSITE_OTLP_HEADERS="authorization=Bearer x,foo=bar",
    )
    assert started.returncode == 0, started.stderr


# --- a Responses API model's calls ---------------------------------------------------------------


@pytest.mark.parametrize("sensitive", [True, False])
def test_a_responses_models_call_keeps_its_messages_for_the_viewer_and_otlp(
    settings: Any, sensitive: bool
) -> None:
    """The SDK's response span exports only the response's id and usage; what it holds (the
    input and the response) is what a viewer shows of the call."""
    settings.AGENTSITE_TRACE_SENSITIVE_DATA = sensitive
    response = Response.model_construct(
        id="resp_1",
        model="gpt-4.1-2025-04-14",
        instructions="Be brief. Write to bob.smith@example.com only.",
        output=[
            ResponseFunctionToolCall(
                type="function_call",
                call_id="call_9",
                name="lookup_order",
                arguments='{"order_id": 7}',
            ),
            ResponseOutputMessage(
                id="msg_1",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text="Looking.", annotations=[])],
            ),
        ],
    )
    provider = get_trace_provider()
    sdk_trace = provider.create_trace("responses", trace_id=None, group_id="conv_r")
    sdk_trace.start()
    span = provider.create_span(
        ResponseSpanData(
            response=response,
            input=[{"role": "user", "content": "Where is order 7?"}],
            usage={"input_tokens": 30, "output_tokens": 9},
        ),
        parent=sdk_trace,
    )
    span.start()
    span.finish()
    sdk_trace.finish()
    exporter_module.DatabaseExporter().export([sdk_trace, span])

    row = Span.objects.get(trace_id=sdk_trace.trace_id, span_type="response")
    assert row.model == "gpt-4.1-2025-04-14"
    [otel] = otlp.readable_spans([row])
    values = dict(otel.attributes or {})
    assert values["openinference.span.kind"] == "LLM"
    assert otel.name == "chat gpt-4.1-2025-04-14"
    if not sensitive:
        assert row.span_data.get("input") is None and row.span_data.get("output") is None
        assert not any(key.startswith(("gen_ai.input", "gen_ai.output")) for key in values)
        return
    assert row.span_data["input"][0] == {
        "role": "system",
        "content": "Be brief. Write to [email] only.",  # masked as stored
    }
    assert json.loads(str(values["gen_ai.system_instructions"])) == [
        {"type": "text", "content": "Be brief. Write to [email] only."}
    ]
    assert json.loads(str(values["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "Where is order 7?"}]}
    ]
    assert json.loads(str(values["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_9",
                    "name": "lookup_order",
                    "arguments": {"order_id": 7},
                },
                {"type": "text", "content": "Looking."},
            ],
            "finish_reason": "tool_call",
        }
    ]
