"""The run's hooks that tell the trace what its spans cannot say themselves
(`tracing.calls`): which tool spans reached their tool (the others, in a trace of an engine
run, waited for a reviewer), and which agent span each agent of the run has, so that a
reviewer's decision, recorded in any process later, goes under the agent span that asked
(`ApprovalRequest.agent_span_id`) even before the exporter has stored it.

Three cheap calls a turn; none touches the database.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, RunContextWrapper, RunHooks, Tool
from agents.items import TResponseInputItem
from agents.tracing import AgentSpanData, get_current_span, get_current_trace

from engine import context as run_context
from tracing import calls


class SpanHooks(RunHooks[Any]):
    async def on_agent_start(self, context: RunContextWrapper[Any], agent: Agent[Any]) -> None:
        span = get_current_span()
        ours = context.context
        if span is None or not isinstance(ours, run_context.RunContext):
            return
        # Called inside the agent's span, or inside a turn's span under it.
        span_id = span.span_id if isinstance(span.span_data, AgentSpanData) else span.parent_id
        if span_id:
            ours.agent_spans[agent.name] = span_id

    async def on_llm_start(
        self,
        context: RunContextWrapper[Any],
        agent: Agent[Any],
        system_prompt: str | None,
        input_items: list[TResponseInputItem],
    ) -> None:
        trace = get_current_trace()
        if trace is not None and isinstance(context.context, run_context.RunContext):
            calls.watch(trace.trace_id)

    async def on_tool_start(
        self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool
    ) -> None:
        span = get_current_span()
        if span is not None:
            calls.ran(span.span_id)


HOOKS = SpanHooks()
