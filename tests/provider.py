"""A local model provider for tests: a real HTTP server on 127.0.0.1 that speaks OpenAI's two
wire formats, Chat Completions (`/v1/chat/completions`) and Responses (`/v1/responses`), and
plays a script of answers, one per request, in order.

    provider.script(
        tool_call("lookup_order", {"order_id": 42}),
        text("Order 42 has shipped."),
    )
    provider.always(fail(429, retry_after=0.05))

Text streams word by word; a tool call's arguments stream in several pieces; usage comes in the
last chunk (Chat Completions, when `stream_options.include_usage` asks) or in
`response.completed` (Responses). Every chunk and event is built from the `openai` package's
own types, so what the client reads is what OpenAI sends. Misbehaviours: `fail` (an HTTP error
with OpenAI's error body and headers), `stall` and `drop` (a stream that goes silent or is cut
in the middle), `malformed` (a chunk that is not JSON), and an unknown model (`models`).

The server is the standard library's `ThreadingHTTPServer`, speaking HTTP/1.1 with chunked
bodies and keep-alive; it runs in a thread of the test process, so a live site in a subprocess
reaches it at `provider.url` while the test scripts it.
"""

from __future__ import annotations

import contextlib
import json
import math
import select
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agents.util._transforms import transform_string_function_style
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion_usage import CompletionUsage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
    ResponseUsage,
)

# ---------------------------------------------------------------------------------------------
# The script: what the model answers


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str


@dataclass(frozen=True)
class Answer:
    """One model response: text and/or tool calls, in this order on the wire."""

    parts: tuple[Text | ToolCall, ...]
    usage: tuple[int, int] | None = None  # (input, output) tokens; counted when None


@dataclass(frozen=True)
class Fail:
    """An HTTP error before any answer, with OpenAI's error body and headers."""

    status: int
    message: str
    type: str
    code: str | None
    retry_after: float | None = None


@dataclass(frozen=True)
class Stall:
    """Streams `after_words` words, then nothing, until the client gives up."""

    after_words: int
    text: str


@dataclass(frozen=True)
class Drop:
    """Streams `after_words` words, then closes the connection in the middle of the body."""

    after_words: int
    text: str


@dataclass(frozen=True)
class Malformed:
    """Starts a stream, then sends a chunk that is not JSON (a whole body, when not streamed)."""


Scripted = Answer | Fail | Stall | Drop | Malformed
Part = Text | ToolCall


def text(words: str) -> Text:
    """A text reply, streamed word by word."""
    return Text(words)


def tool_call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> ToolCall:
    """A function call, its JSON arguments streamed in several pieces."""
    return ToolCall(name, arguments, call_id or _new_id("call_"))


def handoff(agent_name: str, call_id: str | None = None) -> ToolCall:
    """The call of the SDK's handoff tool to `agent_name` (`transfer_to_billing`)."""
    return tool_call(transform_string_function_style(f"transfer_to_{agent_name}"), {}, call_id)


def answer(*parts: Part, usage: tuple[int, int] | None = None) -> Answer:
    """One response made of several parts: `answer(tool_call(...), tool_call(...))` calls two
    tools in parallel."""
    return Answer(tuple(parts), usage)


# OpenAI's own error bodies, by status: (message, type, code).
_ERRORS: dict[int, tuple[str, str, str | None]] = {
    400: ("Invalid request.", "invalid_request_error", None),
    401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
    403: ("You are not allowed to use this model.", "invalid_request_error", None),
    404: (
        "The model does not exist or you do not have access to it.",
        "invalid_request_error",
        "model_not_found",
    ),
    429: (
        "Rate limit reached for requests. Please try again later.",
        "requests",
        "rate_limit_exceeded",
    ),
    500: (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def fail(
    status: int,
    *,
    message: str | None = None,
    code: str | None = None,
    type: str | None = None,
    retry_after: float | None = None,
) -> Fail:
    """An HTTP error: `fail(429, retry_after=0.05)`, `fail(500)`,
    `fail(404, code="model_not_found")`, `fail(401, message="Incorrect API key: sk-...")`."""
    default_message, default_type, default_code = _ERRORS.get(
        status,
        (f"Error {status}.", "server_error" if status >= 500 else "invalid_request_error", None),
    )
    return Fail(
        status,
        message if message is not None else default_message,
        type if type is not None else default_type,
        code if code is not None else default_code,
        retry_after,
    )


STALL_TEXT = "Let me think about that for a moment, please wait."


def stall(after_words: int = 2, text: str = STALL_TEXT) -> Stall:
    return Stall(after_words, text)


def drop(after_words: int = 2, text: str = STALL_TEXT) -> Drop:
    return Drop(after_words, text)


def malformed() -> Malformed:
    return Malformed()


def as_scripted(item: Scripted | Part) -> Scripted:
    return Answer((item,)) if isinstance(item, Text | ToolCall) else item


# ---------------------------------------------------------------------------------------------
# The provider: a server, its script, and what it received


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    # What was answered: the script's item, and the usage sent with it (None: no usage sent).
    answered: Scripted | None = None
    usage: dict[str, int] | None = None
    answer_id: str = (
        ""  # the id of the chat completion or response sent ("chatcmpl-...", "resp_...")
    )
    at: float = field(default_factory=time.monotonic)  # when it arrived (`time.monotonic()`)


NO_SCRIPT = fail(500, message="The local provider has no script for this request.")


@dataclass
class LocalProvider:
    """A real HTTP server on 127.0.0.1; `start()` it, `script()` it, read `requests`."""

    host: str = "127.0.0.1"
    # Models the server knows; a request for any other gets 404 model_not_found. None: any.
    models: set[str] | None = None
    # Seconds between two pieces of a stream, so that a browser sees a reply grow.
    pace: float = 0.0
    requests: list[Recorded] = field(default_factory=list)
    _answers: deque[Scripted] = field(default_factory=deque)
    _always: Scripted = NO_SCRIPT
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the provider is not started"
        return f"http://{self.host}:{self._server.server_address[1]}/v1"

    def start(self) -> LocalProvider:
        self._stopping.clear()
        self._server = _Server((self.host, 0), _Handler)
        self._server.provider = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="local-provider", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends stalled streams
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> LocalProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def script(self, *answers: Scripted | Part) -> None:
        """The next requests' answers, one answer per request, in order (after any still
        queued)."""
        with self._lock:
            self._answers.extend(as_scripted(item) for item in answers)

    def always(self, item: Scripted | Part) -> None:
        """The answer to every request once the script is used up."""
        with self._lock:
            self._always = as_scripted(item)

    def reset(self) -> None:
        """No script, nothing received, every model known: as new, on the same port."""
        with self._lock:
            self._answers.clear()
            self._always = NO_SCRIPT
            self.requests.clear()
            self.models = None
            self.pace = 0.0

    @property
    def unused(self) -> list[Scripted]:
        """What the script still holds."""
        with self._lock:
            return list(self._answers)

    def _next(self, recorded: Recorded) -> Scripted:
        with self._lock:
            self.requests.append(recorded)
            model = recorded.body.get("model")
            if self.models is not None and model not in self.models:
                return fail(
                    404,
                    message=f"The model `{model}` does not exist or you do not have access to it.",
                    code="model_not_found",
                )
            return self._answers.popleft() if self._answers else self._always


# ---------------------------------------------------------------------------------------------
# The wire: HTTP/1.1, chunked server-sent events


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # idle keep-alive connections must not hold up `stop()`
    provider: LocalProvider


class _Dropped(Exception):
    """The connection was closed on purpose, or by the client."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # each chunk leaves at once
    timeout = 60  # an idle keep-alive connection ends
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- requests

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            models = sorted(self.server.provider.models or {"test-model"})
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "local"} for m in models]
            self._send_json(200, {"object": "list", "data": data})
        else:
            self._send_not_found()

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/v1/responses"):
            self._send_not_found()
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send_error(fail(400, message="We could not parse the JSON body of your request."))
            return
        provider = self.server.provider
        recorded = Recorded(path, body, {k.lower(): v for k, v in self.headers.items()})
        item = provider._next(recorded)
        recorded.answered = item
        wire: _Wire = _Chat(body) if path.endswith("/chat/completions") else _Responses(body)
        recorded.answer_id = wire.id
        try:
            self._answer(wire, item, recorded)
        except (_Dropped, BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _answer(self, wire: _Wire, item: Scripted, recorded: Recorded) -> None:
        if isinstance(item, Fail):
            self._send_error(item)
            return
        if not wire.stream:
            self._answer_whole(wire, item, recorded)
            return
        self._start_stream()
        if isinstance(item, Malformed):
            self._send_chunk(wire.first_event())
            self._send_chunk(wire.broken_event())
            self._end_stream()
        elif isinstance(item, Stall | Drop):
            words = split_words(item.text)[: item.after_words]
            for event in wire.events(Answer((Text(item.text),)), words_override=words):
                self._send_piece(event)
            if isinstance(item, Stall):
                self._wait_for_client_to_leave()
            self._drop_connection()
        else:
            # Recorded first: a test may read it as soon as its client has the last chunk.
            recorded.usage = wire.usage(item) if wire.sends_usage else None
            for event in wire.events(item):
                self._send_piece(event)
            self._end_stream()

    def _answer_whole(self, wire: _Wire, item: Scripted, recorded: Recorded) -> None:
        if isinstance(item, Malformed):
            self._send_bytes(200, b'{"id": "broken", "choices": [', "application/json")
        elif isinstance(item, Drop):
            self._drop_connection()
        elif isinstance(item, Stall):
            self._wait_for_client_to_leave()
            self._drop_connection()
        elif isinstance(item, Answer):
            recorded.usage = wire.usage(item)
            self._send_bytes(200, wire.whole(item).encode(), "application/json")

    # -- writing

    def _common_headers(self) -> None:
        self.send_header("x-request-id", _new_id("req_"))
        self.send_header("openai-processing-ms", "1")

    def _send_bytes(self, status: int, data: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self._common_headers()
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        self._send_bytes(status, json.dumps(payload).encode(), "application/json")

    def _send_error(self, item: Fail) -> None:
        body = {
            "error": {"message": item.message, "type": item.type, "param": None, "code": item.code}
        }
        headers = {}
        if item.retry_after is not None:
            # HTTP's retry-after is whole seconds; OpenAI sends the exact wait in milliseconds
            # beside it, which the openai client prefers.
            headers["retry_after"] = str(math.ceil(item.retry_after))
            headers["retry_after_ms"] = str(round(item.retry_after * 1000))
        self._send_bytes(item.status, json.dumps(body).encode(), "application/json", **headers)

    def _send_not_found(self) -> None:
        self._send_error(fail(404, message=f"Invalid URL (POST {self.path})", code="unknown_url"))

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        self._common_headers()
        self.end_headers()

    def _send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _send_piece(self, data: bytes) -> None:
        pace = self.server.provider.pace
        if pace:
            time.sleep(pace)
        self._send_chunk(data)

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _wait_for_client_to_leave(self) -> None:
        """Send nothing until the client closes the connection (its read timeout), the
        provider stops, or two minutes pass."""
        stopping = self.server.provider._stopping
        deadline = time.monotonic() + 120
        while not stopping.is_set() and time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 0.05)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                return

    def _drop_connection(self) -> None:
        """Close the connection without ending the chunked body."""
        with contextlib.suppress(OSError):  # the client may have gone already
            self.connection.shutdown(socket.SHUT_RDWR)
        raise _Dropped


# ---------------------------------------------------------------------------------------------
# The two wire formats, built from the openai package's types


def split_words(words: str) -> list[str]:
    """ "Order 42 has shipped." -> ["Order", " 42", " has", " shipped."]: a piece per word, its
    space in front, as models stream tokens."""
    pieces = words.split(" ")
    return [pieces[0], *(" " + piece for piece in pieces[1:])] if words else []


def split_arguments(arguments: str, pieces: int = 4) -> list[str]:
    """A JSON string in `pieces` parts (fewer when it is shorter)."""
    size = max(1, math.ceil(len(arguments) / pieces))
    return [arguments[i : i + size] for i in range(0, len(arguments), size)]


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _sse(payload: str, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class _Wire:
    sends_usage = True
    id: str

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.model = str(body.get("model") or "test-model")
        self.stream = bool(body.get("stream"))
        self.created = int(time.time())

    def usage(self, item: Answer) -> dict[str, int]:
        """Tokens: as given, or counted (a token per 4 characters of the request, one per piece
        of the answer)."""
        if item.usage is not None:
            prompt, completion = item.usage
        else:
            prompt = max(
                1, len(json.dumps(self.body.get("messages") or self.body.get("input"))) // 4
            )
            completion = sum(
                len(split_words(p.text))
                if isinstance(p, Text)
                else len(split_arguments(json.dumps(p.arguments)))
                for p in item.parts
            )
        return {
            "input_tokens": prompt,
            "output_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def first_event(self) -> bytes:
        raise NotImplementedError

    def broken_event(self) -> bytes:
        raise NotImplementedError

    def events(self, item: Answer, words_override: list[str] | None = None) -> Iterator[bytes]:
        raise NotImplementedError

    def whole(self, item: Answer) -> str:
        raise NotImplementedError


class _Chat(_Wire):
    """`/v1/chat/completions`: `data: {chunk}` lines, then `data: [DONE]`."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.id = _new_id("chatcmpl-")
        self.sends_usage = not self.stream or bool(
            (body.get("stream_options") or {}).get("include_usage")
        )

    def _chunk(
        self,
        delta: dict[str, Any] | None,
        finish_reason: str | None = None,
        usage: CompletionUsage | None = None,
    ) -> bytes:
        choices = (
            []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
        )
        chunk = ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            system_fingerprint="fp_local",
        )
        return _sse(chunk.model_dump_json(exclude_unset=True))

    def _usage(self, item: Answer) -> CompletionUsage:
        counts = self.usage(item)
        return CompletionUsage(
            prompt_tokens=counts["input_tokens"],
            completion_tokens=counts["output_tokens"],
            total_tokens=counts["total_tokens"],
            prompt_tokens_details={"cached_tokens": 0},
            completion_tokens_details={"reasoning_tokens": 0},
        )

    def first_event(self) -> bytes:
        return self._chunk({"role": "assistant", "content": "", "refusal": None})

    def broken_event(self) -> bytes:
        return (
            b'data: {"id": "' + self.id.encode() + b'", "choices": [{"delta": {"content": "Or\n\n'
        )

    def events(self, item: Answer, words_override: list[str] | None = None) -> Iterator[bytes]:
        yield self.first_event()
        calls = 0
        for part in item.parts:
            if isinstance(part, Text):
                for word in (
                    words_override if words_override is not None else split_words(part.text)
                ):
                    yield self._chunk({"content": word})
                if words_override is not None:
                    return  # a stall or a drop: the rest never comes
            else:
                index = calls
                calls += 1
                yield self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": part.call_id,
                                "type": "function",
                                "function": {"name": part.name, "arguments": ""},
                            }
                        ]
                    }
                )
                for piece in split_arguments(json.dumps(part.arguments)):
                    yield self._chunk(
                        {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                    )
        yield self._chunk({}, finish_reason="tool_calls" if calls else "stop")
        if self.sends_usage:
            yield self._chunk(None, usage=self._usage(item))
        yield _sse("[DONE]")

    def whole(self, item: Answer) -> str:
        content = "".join(p.text for p in item.parts if isinstance(p, Text)) or None
        calls = [
            {
                "id": p.call_id,
                "type": "function",
                "function": {"name": p.name, "arguments": json.dumps(p.arguments)},
            }
            for p in item.parts
            if isinstance(p, ToolCall)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        completion = ChatCompletion(
            id=self.id,
            object="chat.completion",
            created=self.created,
            model=self.model,
            choices=[
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": "tool_calls" if calls else "stop",
                }
            ],
            usage=self._usage(item),
            system_fingerprint="fp_local",
        )
        return completion.model_dump_json(exclude_unset=True)


class _Responses(_Wire):
    """`/v1/responses`: `event: <type>` / `data: {event}` pairs, ending in
    `response.completed`."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.id = _new_id("resp_")
        self.sequence = -1

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence

    def _event(self, event: Any) -> bytes:
        return _sse(event.model_dump_json(exclude_unset=True), event.type)

    def _response(self, status: str, output: list[Any], usage: ResponseUsage | None) -> Response:
        return Response(
            id=self.id,
            object="response",
            created_at=self.created,
            model=self.model,
            status=status,
            output=output,
            usage=usage,
            parallel_tool_calls=True,
            tool_choice="auto",
            tools=[],
            error=None,
            incomplete_details=None,
            instructions=self.body.get("instructions"),
            previous_response_id=self.body.get("previous_response_id"),
        )

    def _usage(self, item: Answer) -> ResponseUsage:
        counts = self.usage(item)
        return ResponseUsage(
            input_tokens=counts["input_tokens"],
            output_tokens=counts["output_tokens"],
            total_tokens=counts["total_tokens"],
            input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0},
            output_tokens_details={"reasoning_tokens": 0},
        )

    def first_event(self) -> bytes:
        return self._event(
            ResponseCreatedEvent(
                type="response.created",
                sequence_number=self._next(),
                response=self._response("in_progress", [], None),
            )
        )

    def broken_event(self) -> bytes:
        return b'event: response.output_text.delta\ndata: {"type": "response.output_text.de\n\n'

    def events(self, item: Answer, words_override: list[str] | None = None) -> Iterator[bytes]:
        yield self.first_event()
        yield self._event(
            ResponseInProgressEvent(
                type="response.in_progress",
                sequence_number=self._next(),
                response=self._response("in_progress", [], None),
            )
        )
        output: list[Any] = []
        for index, part in enumerate(item.parts):
            if isinstance(part, Text):
                words = words_override if words_override is not None else split_words(part.text)
                yield from self._message(index, part, words, output)
                if words_override is not None:
                    return  # a stall or a drop: the rest never comes
            else:
                yield from self._function_call(index, part, output)
        yield self._event(
            ResponseCompletedEvent(
                type="response.completed",
                sequence_number=self._next(),
                response=self._response("completed", output, self._usage(item)),
            )
        )

    def _message(
        self, index: int, part: Text, words: list[str], output: list[Any]
    ) -> Iterator[bytes]:
        item_id = _new_id("msg_")
        empty = ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[])
        yield self._event(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                sequence_number=self._next(),
                output_index=index,
                item=ResponseOutputMessage(
                    id=item_id, type="message", role="assistant", status="in_progress", content=[]
                ),
            )
        )
        yield self._event(
            ResponseContentPartAddedEvent(
                type="response.content_part.added",
                sequence_number=self._next(),
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=empty,
            )
        )
        for word in words:
            yield self._event(
                ResponseTextDeltaEvent(
                    type="response.output_text.delta",
                    sequence_number=self._next(),
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    delta=word,
                    logprobs=[],
                )
            )
        if len(words) < len(split_words(part.text)):
            return  # a stall or a drop: the rest never comes
        done = ResponseOutputText(type="output_text", text=part.text, annotations=[], logprobs=[])
        yield self._event(
            ResponseTextDoneEvent(
                type="response.output_text.done",
                sequence_number=self._next(),
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=part.text,
                logprobs=[],
            )
        )
        yield self._event(
            ResponseContentPartDoneEvent(
                type="response.content_part.done",
                sequence_number=self._next(),
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=done,
            )
        )
        message = ResponseOutputMessage(
            id=item_id, type="message", role="assistant", status="completed", content=[done]
        )
        output.append(message)
        yield self._event(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=index,
                item=message,
            )
        )

    def _function_call(self, index: int, part: ToolCall, output: list[Any]) -> Iterator[bytes]:
        item_id = _new_id("fc_")
        arguments = json.dumps(part.arguments)
        yield self._event(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                sequence_number=self._next(),
                output_index=index,
                item=ResponseFunctionToolCall(
                    id=item_id,
                    type="function_call",
                    call_id=part.call_id,
                    name=part.name,
                    arguments="",
                    status="in_progress",
                ),
            )
        )
        for piece in split_arguments(arguments):
            yield self._event(
                ResponseFunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta",
                    sequence_number=self._next(),
                    item_id=item_id,
                    output_index=index,
                    delta=piece,
                )
            )
        yield self._event(
            ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                sequence_number=self._next(),
                item_id=item_id,
                output_index=index,
                arguments=arguments,
            )
        )
        call = ResponseFunctionToolCall(
            id=item_id,
            type="function_call",
            call_id=part.call_id,
            name=part.name,
            arguments=arguments,
            status="completed",
        )
        output.append(call)
        yield self._event(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                sequence_number=self._next(),
                output_index=index,
                item=call,
            )
        )

    def whole(self, item: Answer) -> str:
        output: list[Any] = []
        for index, part in enumerate(item.parts):
            if isinstance(part, Text):
                list(self._message(index, part, split_words(part.text), output))
            else:
                list(self._function_call(index, part, output))
        return self._response("completed", output, self._usage(item)).model_dump_json(
            exclude_unset=True
        )


# ---------------------------------------------------------------------------------------------
# Fixtures (registered in tests/conftest.py)


@pytest.fixture(scope="session")
def local_provider_server() -> Iterator[LocalProvider]:
    with LocalProvider() as provider:
        yield provider


@pytest.fixture
def local_provider(local_provider_server: LocalProvider) -> Iterator[LocalProvider]:
    """The session's local provider, with no script and nothing received."""
    local_provider_server.reset()
    yield local_provider_server
    local_provider_server.reset()


TEST_MODEL = "test-model"


def use_local_provider(
    settings: Any,
    provider: LocalProvider,
    api: str = "chat_completions",
    *,
    timeout: float = 5.0,
    retries: int = 2,
) -> dict[str, str]:
    """Point this test's settings at `provider`, speaking `api` ("chat_completions" or
    "responses"), with model `test-model`, a short silence timeout and the usual retries.

    Returns:
        The same settings as environment variables, for a live site
        (`tests/live.py::start_site(..., extra_env=...)`).
    """
    assert api in ("chat_completions", "responses"), api
    settings.OPENAI_BASE_URL = provider.url
    settings.AGENTSITE_MODEL_API = api
    settings.AGENTSITE_MODEL = TEST_MODEL
    settings.AGENTSITE_MODEL_TIMEOUT = timeout
    settings.AGENTSITE_MODEL_RETRIES = retries
    return {
        "OPENAI_BASE_URL": provider.url,
        "AGENTSITE_MODEL_API": api,
        "AGENTSITE_MODEL": TEST_MODEL,
        "AGENTSITE_MODEL_TIMEOUT": str(timeout),
        "AGENTSITE_MODEL_RETRIES": str(retries),
    }
