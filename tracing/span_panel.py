"""One span's panel on the trace page (`trace_detail.html#span-panel`): the facts every span
has, then what its type carries, one function per span type (`DETAILS`).

Raw text throughout: spans hold model and user text, and the template escapes all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from common import formatting
from tracing import pricing
from tracing import tree as trees
from tracing.messages import Message, conversation, pretty
from tracing.models import Span, Trace


@dataclass
class Details:
    """What a span's type adds to its panel."""

    headline: str = ""
    facts: list[dict[str, str]] = field(default_factory=list)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    priced: pricing.Shown | None = None
    messages: dict[str, list[Message]] | None = None

    def fact(self, label: str, value: str, tone: str = "") -> None:
        self.facts.append({"label": label, "value": value, "tone": tone})

    def block(self, title: str, value: Any, *, open: bool = True) -> None:
        """A value as pretty JSON, folded open or not; none when it is empty."""
        text = pretty(value)
        if text:
            self.blocks.append({"title": title, "text": text, "open": open})


# Each reads the span, its `span_data` (a dict) and whether model names link to the price form.
Reader = Callable[[Span, dict[str, Any], bool], Details]


def span_panel_context(trace: Trace, span: Span, *, price_links: bool = False) -> dict[str, Any]:
    """What `trace_detail.html#span-panel` shows for a span: common facts, then what its
    type carries."""
    data = span.span_data if isinstance(span.span_data, dict) else {}
    kind = span.span_type
    is_decision = trees.is_decision(kind, span.name)
    read = _decision if is_decision else DETAILS.get(kind, _nothing)
    details = read(span, data, price_links)
    offset = None
    if trace.started_at is not None and span.started_at is not None:
        offset = (span.started_at - trace.started_at).total_seconds()
    return {
        "trace": trace,
        "span": span,
        "kind": kind,
        "kind_class": trees.kind_class(kind, span.name),
        "is_decision": is_decision,
        "headline": details.headline,
        "facts": details.facts,
        "blocks": details.blocks,
        "duration": formatting.duration(span.duration_seconds),
        "offset": formatting.duration(offset) if offset is not None else "—",
        "started": _clock(span.started_at),
        "ended": _clock(span.ended_at),
        "error": pretty(span.error),
        "raw": pretty(span.span_data),
        "priced": details.priced,
        "messages": details.messages,
    }


def _decision(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    """A reviewer's decision (`tracing.recording` writes it as a custom span)."""
    inner = span.data
    decision = str(inner.get("decision") or "")
    tone = {"approve": "ok", "reject": "bad"}.get(decision, "quiet")
    details = Details(headline="Approval decision")
    details.fact("Reviewer", str(inner.get("reviewer") or "—"))
    details.fact("Decision", decision or "—", tone)
    details.fact("Tool", str(inner.get("tool") or "—"), "mono")
    if inner.get("always"):
        details.fact("Always", "for the rest of this run")
    if inner.get("call_id"):
        details.fact("Call id", str(inner["call_id"]), "mono")
    # Shown even when empty: a decision without a message says so.
    details.blocks.append(
        {"title": "Message", "text": str(inner.get("message") or ""), "open": True}
    )
    return details


def _model_call(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    """A generation or a response: model, usage, cost, and its messages as a conversation."""
    details = Details()
    model = data.get("model") or span.model
    if model:
        details.fact("Model", str(model), "mono")
    if data.get("response_id"):
        details.fact("Response", str(data["response_id"]), "mono")
    details.facts += _usage_facts(data.get("usage"))
    if span.cached_tokens and not any(f["label"].startswith("Cached") for f in details.facts):
        details.fact("Cached input tokens", f"{span.cached_tokens:,}", "num")
    cost = pricing.PriceBook.load().span_cost(span)
    if cost is not None:
        details.priced = pricing.shown(cost, links=price_links)
    details.messages = {
        "input": conversation(data.get("input")),
        "output": conversation(data.get("output")),
    }
    # The messages as they were stored, one click away.
    details.block("Output", data.get("output"), open=False)
    details.block("Input", data.get("input"), open=False)
    details.block("Model settings", data.get("model_config"), open=False)
    return details


def _function(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    details = Details()
    details.fact("Tool", str(data.get("name") or "—"), "mono")
    details.block("Input", data.get("input"))
    details.block("Output", data.get("output"))
    details.block("MCP", data.get("mcp_data"), open=False)
    return details


def _handoff(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    details = Details(headline=f"{data.get('from_agent') or '?'} → {data.get('to_agent') or '?'}")
    details.fact("From", str(data.get("from_agent") or "—"))
    details.fact("To", str(data.get("to_agent") or "—"))
    return details


def _guardrail(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    tripped = trees.truthy(data.get("triggered"))
    details = Details()
    details.fact("Guardrail", str(data.get("name") or "—"), "mono")
    details.fact("Tripped", "yes, it tripped" if tripped else "no", "bad" if tripped else "ok")
    return details


def _agent(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    tools = data.get("tools") or []
    handoffs = data.get("handoffs") or []
    details = Details()
    details.fact("Tools", ", ".join(map(str, tools)) or "none", "mono")
    details.fact("Handoffs", ", ".join(map(str, handoffs)) or "none")
    details.fact("Output type", str(data.get("output_type") or "—"), "mono")
    return details


def _task_or_turn(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    """A task or a turn (custom spans that carry their SDK type): which turn, whose, usage."""
    inner = span.data
    details = Details()
    if inner.get("turn") is not None:
        details.fact("Turn", str(inner["turn"]), "num")
    if inner.get("agent_name"):
        details.fact("Agent", str(inner["agent_name"]))
    details.facts += _usage_facts(inner.get("usage"))
    return details


def _custom(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    details = Details()
    details.block("Data", span.data or data.get("data"))
    return details


def _nothing(span: Span, data: dict[str, Any], price_links: bool) -> Details:
    """Any other type: the common facts and the raw JSON say it all."""
    return Details()


DETAILS: dict[str, Reader] = {
    "generation": _model_call,
    "response": _model_call,
    "function": _function,
    "handoff": _handoff,
    "guardrail": _guardrail,
    "agent": _agent,
    "task": _task_or_turn,
    "turn": _task_or_turn,
    "custom": _custom,
}


def _label(key: str) -> str:
    return key.replace("_", " ").capitalize()


def _usage_facts(usage: Any) -> list[dict[str, str]]:
    if not isinstance(usage, dict):
        return []
    facts = [
        {"label": _label(key), "value": f"{value:,}", "tone": "num"}
        for key, value in usage.items()
        if isinstance(value, int)
        and not isinstance(value, bool)
        and (value or key in ("input_tokens", "output_tokens"))
    ]
    if "total_tokens" not in usage:
        parts = [usage.get("input_tokens"), usage.get("output_tokens")]
        total = sum(part for part in parts if isinstance(part, int))
        if total:
            facts.append({"label": "Total tokens", "value": f"{total:,}", "tone": "num"})
    return facts


def _clock(value: datetime | None) -> str:
    """A time of day to the millisecond, as spans are read."""
    if value is None:
        return "—"
    return f"{value:%H:%M:%S}.{value.microsecond // 1000:03d}"
