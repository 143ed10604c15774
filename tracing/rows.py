"""From the SDK's exported traces and spans to the rows the exporter writes: pure functions
over the dicts `Trace.export()` and `Span.export()` return (no database; `tracing.exporter`
writes the rows, with the statements of `tracing.sql`).

A span's row holds its type (a task or turn span's real type, read from its custom data), a
name for people, its times, its data and error masked (`tracing.redaction`; inputs and
outputs dropped when the trace leaves sensitive data out), and a model call's model and
tokens, for its cost (`tracing.pricing`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeGuard

from tracing import calls, redaction

# What `trace_include_sensitive_data=False` removes, per span type; the exporter removes it
# again, because the SDK lets some through (a rejection message in a function span's output).
SENSITIVE_FIELDS: dict[str, tuple[str, ...]] = {
    "generation": ("input", "output"),
    "response": ("input", "output"),
    "function": ("input", "output"),
    "transcription": ("input", "output"),
    "speech": ("input", "output"),
    "speech_group": ("input",),
}


class TraceInsert(NamedTuple):
    """A trace as the exporter writes it, upserted (its run is looked up when it is written)."""

    trace_id: str
    workflow_name: str
    group_id: str
    metadata: dict[str, Any]


class SpanInsert(NamedTuple):
    """A span as the exporter writes it, inserted: `Span`'s fields, masked."""

    span_id: str
    trace_id: str
    parent_id: str | None
    span_type: str
    name: str
    started_at: datetime | None
    ended_at: datetime | None
    span_data: dict[str, Any]
    error: Any
    total_tokens: int
    model: str = ""
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    agent: str = ""  # a model call's: its trace's (`exporter._agents_of`), filled in when written


def with_response_model(item: Any, exported: dict[str, Any]) -> dict[str, Any]:
    """A response span (the Responses API) exports its response's id and usage but neither
    the model that wrote it nor its messages, which a generation span has: take them from
    what the span holds (the SDK keeps the input and the response only when the trace
    includes data): the model, the input (the response's instructions first, as a system
    message, as a generation span's input has them) and the response's output items."""
    data = exported.get("span_data")
    if not isinstance(data, dict) or data.get("type") != "response":
        return exported
    span_data = getattr(item, "span_data", None)
    response = getattr(span_data, "response", None)
    if response is None:
        return exported
    added: dict[str, Any] = {}
    model = getattr(response, "model", None)
    if not data.get("model") and isinstance(model, str) and model:
        added["model"] = model
    given = getattr(span_data, "input", None)
    if given is not None and data.get("input") is None:
        items = [{"role": "user", "content": given}] if isinstance(given, str) else given
        instructions = getattr(response, "instructions", None)
        system = (
            [{"role": "system", "content": instructions}]
            if isinstance(instructions, str) and instructions
            else []
        )
        added["input"] = system + [_plain(each) for each in items or []]
    output = getattr(response, "output", None)
    if output and data.get("output") is None:
        added["output"] = [_plain(each) for each in output]
    return {**exported, "span_data": {**data, **added}} if added else exported


def with_tool_output(item: Any, exported: dict[str, Any]) -> dict[str, Any]:
    """A function span's output as text: the SDK exports `str()` of it, a Python repr for a
    structured output (an MCP tool's `{'type': 'text', 'text': ...}`); its text parts are
    taken instead (joined), anything else as JSON."""
    data = exported.get("span_data")
    if not isinstance(data, dict) or data.get("type") != "function":
        return exported
    output = getattr(getattr(item, "span_data", None), "output", None)
    if not isinstance(output, dict | list) or not output:
        return exported
    parts = output if isinstance(output, list) else [output]
    texts = [p.get("text") for p in parts if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) == len(parts) and all(isinstance(text, str) for text in texts):
        shown = "\n".join(str(text) for text in texts)
    else:
        shown = json.dumps(_plain(output), ensure_ascii=False, default=str)
    return {**exported, "span_data": {**data, "output": shown}}


def _plain(value: Any) -> Any:
    """An SDK item as plain JSON-able data (a pydantic model dumped, its unset fields left
    out, as the SDK exports a generation's items)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {key: _plain(each) for key, each in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(each) for each in value]
    return value


# The spans the engine writes into a run's trace itself (`tracing.recording`), by name.
DECISION_SPAN_NAME = "approval decision"
STOP_SPAN_NAME = "stopped by the user"
FAILURE_SPAN_NAME = "run failed"


def with_waiting_mark(exported: dict[str, Any]) -> dict[str, Any]:
    """A tool span of a call that paused for a reviewer (`tracing.calls`) marked
    `awaiting_approval`: the SDK's span says nothing of it, and it did not run."""
    data = exported.get("span_data")
    if not isinstance(data, dict) or data.get("type") != "function":
        return exported
    if not calls.awaited(
        str(exported.get("trace_id")), str(exported.get("id")), data, exported.get("error")
    ):
        return exported
    return {**exported, "span_data": {**data, "awaiting_approval": True}}


def trace_row(exported: dict[str, Any], *, cleaner: redaction.Cleaner | None = None) -> TraceInsert:
    """A trace's row, masked by `cleaner` (one per batch: each distinct string once)."""
    clean = (cleaner or redaction.Cleaner()).clean
    metadata = clean(exported.get("metadata") or {})
    return TraceInsert(
        trace_id=str(exported["id"]),
        workflow_name=str(clean(exported.get("workflow_name") or ""))[:255],
        group_id=str(exported.get("group_id") or "")[:255],
        metadata=metadata if isinstance(metadata, dict) else {"metadata": metadata},
    )


def span_row(
    exported: dict[str, Any], *, cleaner: redaction.Cleaner | None = None, sensitive: bool = True
) -> SpanInsert:
    """A span's row, masked by `cleaner`; without `sensitive`, the inputs and outputs its
    type may carry (`SENSITIVE_FIELDS`) are dropped first."""
    clean = (cleaner or redaction.Cleaner()).clean
    raw_data = exported.get("span_data") or {}
    kind, inner = span_kind(raw_data)
    tokens = usage_tokens(kind, raw_data)
    model, input_tokens, cached_tokens, output_tokens = model_usage(kind, raw_data)
    if not sensitive:
        raw_data = {**raw_data}
        for name in SENSITIVE_FIELDS.get(kind, ()):
            if raw_data.get(name) is not None:
                raw_data[name] = None
    if exported.get("metadata") and "metadata" not in raw_data:
        raw_data = {**raw_data, "metadata": exported["metadata"]}
    data = clean(raw_data)
    error = exported.get("error")
    return SpanInsert(
        span_id=str(exported["id"]),
        trace_id=str(exported["trace_id"]),
        parent_id=exported.get("parent_id") or None,
        span_type=kind[:40],
        name=str(clean(span_name(kind, raw_data, inner)))[:255],
        started_at=parse_time(exported.get("started_at")),
        ended_at=parse_time(exported.get("ended_at")),
        span_data=data if isinstance(data, dict) else {"data": data},
        error=None if error is None else clean(error),
        total_tokens=tokens,
        model=model,
        input_tokens=input_tokens,
        cached_tokens=cached_tokens,
        output_tokens=output_tokens,
    )


def span_kind(span_data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The span's type, and a custom span's `data`: task and turn spans are custom spans
    that carry their real type in `data.sdk_span_type`."""
    kind = str(span_data.get("type") or "custom")
    inner = span_data.get("data") if kind == "custom" else None
    if not isinstance(inner, dict):
        return kind, {}
    return str(inner.get("sdk_span_type") or kind), inner


def span_name(kind: str, data: dict[str, Any], inner: dict[str, Any]) -> str:
    if kind == "handoff":
        return f"{data.get('from_agent') or '?'} → {data.get('to_agent') or '?'}"
    if kind == "task":
        return str(inner.get("name") or data.get("name") or "task")
    if kind == "turn":
        turn = f"turn {inner.get('turn', '')}".strip()
        return f"{turn}: {inner['agent_name']}" if inner.get("agent_name") else turn
    if kind in ("generation", "transcription", "speech"):
        return str(data.get("model") or kind)
    if kind == "response":
        return str(data.get("response_id") or "response")
    if kind == "mcp_tools":
        return str(data.get("server") or "MCP tools")
    return str(data.get("name") or kind)


def usage_tokens(kind: str, data: dict[str, Any]) -> int:
    """Tokens of one model call (task and turn spans repeat their calls' usage: not counted)."""
    if kind not in ("generation", "response"):
        return 0
    usage = data.get("usage")
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if _is_count(total):
        return int(total)
    parts = [usage.get("input_tokens"), usage.get("output_tokens")]
    return sum(int(part) for part in parts if _is_count(part))


def model_usage(kind: str, data: dict[str, Any]) -> tuple[str, int, int, int]:
    """A model call's model and its input, cached input and output tokens, for its cost
    (`tracing.pricing`); ("", 0, 0, 0) for a span that is no model call. A call whose
    model is not named is stored as "unknown model", so its cost is "no price for unknown
    model", not missing."""
    if kind not in ("generation", "response"):
        return "", 0, 0, 0
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    model = data.get("model")
    name = model.strip()[:200] if isinstance(model, str) and model.strip() else "unknown model"
    input_tokens = usage.get("input_tokens")
    output_tokens = usage.get("output_tokens")
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = usage.get("cached_input_tokens")
    prompt = int(input_tokens) if _is_count(input_tokens) else 0
    return (
        name,
        prompt,
        min(int(cached), prompt) if _is_count(cached) else 0,
        int(output_tokens) if _is_count(output_tokens) else 0,
    )


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:  # what `timezone.is_naive` says of what `fromisoformat` makes
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def run_id_of(metadata: Any) -> int | None:
    """The run a trace's metadata names (`run_id`, which the engine writes), if a number."""
    if not isinstance(metadata, dict):
        return None
    try:
        return int(str(metadata.get("run_id")))
    except ValueError:
        return None


def trace_agent(metadata: Any, workflow_name: str) -> str:
    """A trace's agent: the registry name the engine wrote in its metadata, else (a trace no
    run of ours made) its workflow name."""
    agent = metadata.get("agent") if isinstance(metadata, dict) else None
    return str(agent)[:255] if agent else workflow_name[:255]
