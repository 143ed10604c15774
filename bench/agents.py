"""The agents the benchmarks run: one tool call, then a reply.

`ReplyingModel` answers as `agents.testing.ScriptedModel` does (each call is served by a
fresh one-step `ScriptedModel`), but chooses its answer from the input: a call to its tool
first, and a short reply once the tool's output is there. So one agent serves any number of
runs, at the same time or resumed later, and every call id is new.

Registered by `bench/__main__.py` as `AGENTSITE_AGENTS`:
`bench_tool=bench.agents.TOOL_AGENT,bench_approval=bench.agents.APPROVAL_AGENT,...`.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelResponse, function_tool
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool import Tool
from openai.types.responses.response_prompt_param import ResponsePromptParam

# Model latency of the slow agent (the concurrency benchmark), in seconds per model call.
SLOW_LATENCY = 0.2
# A turn of these agents: the model asks for the tool, then replies to its output.
MODEL_CALLS_PER_TURN = 2


class ReplyingModel(Model):
    def __init__(self, tool_name: str, arguments: dict[str, Any], latency: float = 0.0) -> None:
        self.tool_name = tool_name
        self.arguments = arguments
        self.latency = latency

    def _scripted(self, input: str | list[TResponseInputItem]) -> ScriptedModel:
        last = input[-1] if isinstance(input, list) and input else None
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            step = [assistant_message("Done.", item_id=f"msg_{uuid.uuid4().hex}")]
        else:
            step = [
                function_call(self.tool_name, self.arguments, call_id=f"call_{uuid.uuid4().hex}")
            ]
        return ScriptedModel([step])

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        if self.latency:
            await asyncio.sleep(self.latency)
        return await self._scripted(input).get_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        if self.latency:
            await asyncio.sleep(self.latency)
        async for event in self._scripted(input).stream_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        ):
            yield event


@function_tool
def lookup_order(order_id: int) -> str:
    """Look an order up."""
    return f"Order {order_id} shipped yesterday."


@function_tool(needs_approval=True)
def refund_order(order_id: int) -> str:
    """Refund an order (a reviewer must approve)."""
    return f"Order {order_id} refunded."


async def _no_person_needed(*_: Any) -> bool:
    return False


# The SDK's own way to let a call run without a person: its `needs_approval` says no. The
# peer of a call an approval policy approves (`bench/approvals.py`).
@function_tool(name_override="refund_order", needs_approval=_no_person_needed)
def refund_order_unreviewed(order_id: int) -> str:
    """Refund an order (a reviewer must approve)."""
    return f"Order {order_id} refunded."


TOOL_AGENT: Agent[Any] = Agent(
    name="Bench tool",
    instructions="Look orders up.",
    model=ReplyingModel("lookup_order", {"order_id": 7}),
    tools=[lookup_order],
)
APPROVAL_AGENT: Agent[Any] = Agent(
    name="Bench approval",
    instructions="Refund orders.",
    model=ReplyingModel("refund_order", {"order_id": 42}),
    tools=[refund_order],
)
UNREVIEWED_AGENT: Agent[Any] = Agent(
    name="Bench approval",
    instructions="Refund orders.",
    model=ReplyingModel("refund_order", {"order_id": 42}),
    tools=[refund_order_unreviewed],
)
SLOW_AGENT: Agent[Any] = Agent(
    name="Bench slow",
    instructions="Look orders up, slowly.",
    model=ReplyingModel("lookup_order", {"order_id": 7}, latency=SLOW_LATENCY),
    tools=[lookup_order],
)

# No model of its own: it answers through the configured provider (`bench/http_turn.py`
# points OPENAI_BASE_URL at a local HTTP server).
HTTP_AGENT: Agent[Any] = Agent(
    name="Bench HTTP",
    instructions="Look orders up.",
    tools=[lookup_order],
)

REGISTRY = {
    "bench_tool": "bench.agents.TOOL_AGENT",
    "bench_http": "bench.agents.HTTP_AGENT",
    "bench_approval": "bench.agents.APPROVAL_AGENT",
    "bench_slow": "bench.agents.SLOW_AGENT",
}


def sdk_copy(agent: Agent[Any]) -> Agent[Any]:
    """`agent` with its own copy of each tool, for the bare SDK's side of a comparison: the
    site gives the function tools of the agents it runs an approval-policy gate
    (`engine.policies.guard`), which the SDK alone has not. Made at import, before any
    gate."""
    return agent.clone(tools=[copy.copy(tool) for tool in agent.tools])


SDK_TOOL_AGENT = sdk_copy(TOOL_AGENT)
SDK_APPROVAL_AGENT = sdk_copy(APPROVAL_AGENT)
SDK_SLOW_AGENT = sdk_copy(SLOW_AGENT)
SDK_HTTP_AGENT = sdk_copy(HTTP_AGENT)
