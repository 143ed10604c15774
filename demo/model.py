"""The offline demo model: a deterministic stand-in for an LLM, so the site runs with no API key.

It reads the latest user message, recognises a handful of phrases (see `EXAMPLES`) and answers
with a tool call or a short text, the way a real model would, but only ever calls a tool or a
handoff it was given. Once the latest turn holds a tool result it answers with text, so it can
never loop.

Any agent's tools, not only the demo's, answer to an explicit instruction (`CALL`): `call
<tool> {"argument": value, ...}` calls that tool of the agent with exactly those arguments,
so a developer tries an agent of their own without a model key (docs/agents.md).

Responses are built with the SDK's own test building blocks (`agents.testing.ScriptedModel`,
`assistant_message`, `function_call`), so their shape and stream events are the SDK's; text is
re-cut into one `response.output_text.delta` per word so that streaming looks like streaming.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool import Tool
from agents.tracing import generation_span
from agents.usage import Usage
from django.conf import settings
from django.utils import timezone
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseInProgressEvent,
    ResponseTextDeltaEvent,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from common import formatting

# What the model reports as its name; engine.providers.OFFLINE_MODEL_NAME says the same.
MODEL_NAME = "offline-demo"

# What to type for each tool the model knows, in the order they are offered to the user.
EXAMPLES: dict[str, str] = {
    "lookup_order": "where is order 44",
    "cancel_order": "cancel order 42",
    "issue_refund": "refund 30 on order 42",
    "send_email": "email alice@example.com about my refund",
    "research": "research refund policy",
    "search_knowledge_base": "what is the refund policy",
    "stock_level": "how many grinders are in stock",
    "restock": "restock 5 grinders",
}

# What each tool does, for "I can ..." sentences.
ABILITIES: dict[str, str] = {
    "lookup_order": "look up an order",
    "cancel_order": "cancel an order",
    "issue_refund": "issue a refund",
    "send_email": "email a customer",
    "research": "research the shop's policies",
    "search_knowledge_base": "search the knowledge base",
    "stock_level": "check the warehouse's stock",
    "restock": "order a restock",
}

# How a reply about a tool's result begins.
RESULT_LEADS: dict[str, str] = {
    "lookup_order": "Here is what I found",
    "cancel_order": "The order system replied",
    "issue_refund": "The payment system replied",
    "send_email": "The mail system replied",
    "research": "The researcher reported back",
    "search_knowledge_base": "From the knowledge base",
    "stock_level": "The warehouse says",
    "restock": "The warehouse replied",
}

# The SDK hands a reviewer's rejection message to the model verbatim (by default "Tool execution
# was not approved."), so a rejection can only be recognised by its wording.
REJECTION_MARKERS = re.compile(r"not approved|rejected|declined|denied", re.IGNORECASE)
# What the engine tells the model when the person who asked withdrew the request.
WITHDRAWAL_MARKER = re.compile(r"\buser withdrew\b", re.IGNORECASE)
EMAIL_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
ORDER_NUMBER = re.compile(r"\border\s*(?:number|no\.?|#)?\s*#?\s*(\d+)\b|#(\d+)\b", re.IGNORECASE)
MONEY = re.compile(r"\$?\s*(\d+(?:\.\d{1,2})?)")
# The warehouse's items ("5 grinders", "a kettle"): what its MCP server stocks.
WAREHOUSE_ITEM = re.compile(r"\b(grinder|kettle|mug|filter)s?\b", re.IGNORECASE)
# "call <tool> {json arguments}": the tool by its exact name, the arguments as given (none: {}).
CALL = re.compile(r"^\s*call\s+([A-Za-z0-9_.-]+)\s*(.*?)\s*$", re.IGNORECASE | re.DOTALL)
POLICY_QUESTION = re.compile(r"\bpolic(?:y|ies)\b|\bwarranty\b|\bhow long\b", re.IGNORECASE)
MAX_QUOTE = 1200
ORDER_TOOLS = {"lookup_order", "cancel_order", "issue_refund", "send_email"}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Say:
    text: str


Reply = ToolCall | Say


class OfflineDemoModel(Model):
    """A `Model` that answers from rules instead of a network. Stateless; safe to share."""

    @staticmethod
    def examples(tools: Sequence[Tool], handoffs: Sequence[Handoff]) -> list[str]:
        """What to type to see it act, for an agent with these tools and handoffs: the demo's
        phrases for its tools, then a `call` line for each tool it has no phrase for (the
        chat's empty page offers them; `engine.providers.offline_examples`)."""
        names = {getattr(tool, "name", "") for tool in tools}
        phrases = [EXAMPLES[name] for name in EXAMPLES if name in names]
        phrases += [f"I have a {handoff.agent_name.lower()} question" for handoff in handoffs]
        return phrases + [_example_call(tool.name, tools) for tool in _others(tools)]

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
        step = make_step(system_instructions, input, tools, handoffs)
        with generation_span(
            model=MODEL_NAME,
            model_config=model_settings.to_traceable_dict(),
            disabled=tracing.is_disabled(),
        ) as span:
            response = await ScriptedModel([step]).get_response(
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
            if tracing.include_data():
                span.span_data.input = _as_items(input, system_instructions)
                span.span_data.output = [_dump(item) for item in response.output]
            span.span_data.usage = _span_usage(response.usage)
        return response

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
        step = make_step(system_instructions, input, tools, handoffs)
        # Started without becoming current, as the SDK's own streaming models do: the stream
        # is consumed across awaits in the caller's context.
        span = generation_span(
            model=MODEL_NAME,
            model_config=model_settings.to_traceable_dict(),
            disabled=tracing.is_disabled(),
        )
        span.start(mark_as_current=False)
        try:
            if tracing.include_data():
                span.span_data.input = _as_items(input, system_instructions)
            events = ScriptedModel([step]).stream_response(
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
            sequence_number = 0
            # A pause between words, so people watching the demo see it stream like a model.
            delay = float(getattr(settings, "AGENTSITE_DEMO_STREAM_DELAY", 0) or 0)
            async for event in events:
                if isinstance(event, ResponseCompletedEvent):
                    if tracing.include_data():
                        span.span_data.output = [_dump(item) for item in event.response.output]
                    span.span_data.usage = _span_usage(step.usage)
                for piece in _rechunk(event):
                    if delay and isinstance(piece, ResponseTextDeltaEvent):
                        await asyncio.sleep(delay)
                    yield piece.model_copy(update={"sequence_number": sequence_number})
                    sequence_number += 1
        finally:
            span.finish(reset_current=False)


def make_step(
    system_instructions: str | None,
    input: str | list[TResponseInputItem],
    tools: Sequence[Tool],
    handoffs: Sequence[Handoff],
) -> ModelStep:
    """The whole response to one model call: the reply as an output item, with its usage."""
    items = _as_items(input)
    reply = decide(items, tools, handoffs)
    if isinstance(reply, ToolCall):
        output = function_call(reply.name, reply.arguments, call_id=new_id("call"))
        produced = f"{reply.name} {json.dumps(reply.arguments)}"
    else:
        output = assistant_message(reply.text, item_id=new_id("msg"))
        produced = reply.text
    consumed = f"{system_instructions or ''} {json.dumps(items, default=str)}"
    input_tokens, output_tokens = count_tokens(consumed), count_tokens(produced)
    usage = Usage(
        requests=1,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )
    return ModelStep(output=[output], usage=usage, response_id=new_id("resp"))


def new_id(prefix: str) -> str:
    # Random, not counted: a call id must stay unique across a run, its resumes and restarts.
    return f"{prefix}_{uuid.uuid4().hex}"


def count_tokens(text: str) -> int:
    """A rough token count: words and punctuation marks."""
    return len(re.findall(r"\w+|[^\w\s]", text))


# --- Deciding what to say ------------------------------------------------------------------


def decide(
    items: list[dict[str, Any]], tools: Sequence[Tool], handoffs: Sequence[Handoff]
) -> Reply:
    """The reply to a conversation, given the tools and handoffs the agent has."""
    tool_names = [getattr(tool, "name", "") for tool in tools]
    latest = _latest_turn(items)
    result = _last_tool_result(latest, items)
    if result is not None:
        return Say(_about_result(*result, tool_names))
    text = _latest_user_text(items)
    instruction = CALL.match(text)
    if instruction is not None:
        return _explicit_call(instruction.group(1), instruction.group(2), tools, handoffs)
    reply = _answer(text, set(tool_names), handoffs)
    if isinstance(reply, Say) and _others(tools):
        # An agent with tools the phrases above do not know: say how to call them.
        reply = Say(f"{reply.text.rstrip()} {_how_to_call(tools)}")
    return reply


def _explicit_call(
    name: str, given: str, tools: Sequence[Tool], handoffs: Sequence[Handoff]
) -> Reply:
    """`call <name> <given>`: the agent's tool `name` with the JSON object `given` ("": none),
    or why not."""
    callable_names = [getattr(tool, "name", "") for tool in tools] + [
        handoff.tool_name for handoff in handoffs
    ]
    if name not in callable_names:
        offered = _join([f"“{each}”" for each in callable_names if each], "or")
        return Say(
            f"This agent has no tool named “{name}”."
            + (f" Its tools: {offered}." if offered else " It has no tools.")
        )
    try:
        arguments = json.loads(given) if given else {}
    except json.JSONDecodeError as error:
        return Say(
            f"The arguments for {name} are not valid JSON ({error.msg}, at character "
            f"{error.pos + 1}). Write them as an object, like {_example_call(name, tools)}."
        )
    if not isinstance(arguments, dict):
        return Say(
            f"The arguments for {name} must be a JSON object, like {_example_call(name, tools)}."
        )
    return ToolCall(name, arguments)


def _others(tools: Sequence[Tool]) -> list[Tool]:
    """The tools the demo's phrases do not know (an agent a developer wrote)."""
    return [tool for tool in tools if getattr(tool, "name", "") not in EXAMPLES]


def _how_to_call(tools: Sequence[Tool]) -> str:
    examples = [f"“{_example_call(tool.name, tools)}”" for tool in _others(tools)]
    return (
        f"To call a tool yourself, say “call <tool> {{JSON arguments}}”: {_join(examples, 'or')}."
    )


def _example_call(name: str, tools: Sequence[Tool]) -> str:
    """`call <name> {...}` with a placeholder for each required argument of the tool's schema."""
    tool = next((tool for tool in tools if getattr(tool, "name", "") == name), None)
    schema = getattr(tool, "params_json_schema", None) or {}
    properties = schema.get("properties") or {}
    required = [key for key in schema.get("required") or list(properties) if key in properties]
    example = {key: _placeholder(properties[key]) for key in required}
    return f"call {name} {json.dumps(example, ensure_ascii=False)}" if example else f"call {name}"


def _placeholder(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((each for each in kind if each != "null"), None)
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(low) + 1 if kind == "integer" else float(low) + 1
    if schema.get("format") == "date":
        return timezone.localdate().isoformat()
    return {"boolean": True, "array": [], "object": {}}.get(str(kind), "…")


def _answer(text: str, tools: set[str], handoffs: Sequence[Handoff]) -> Reply:
    lowered = text.lower().strip()
    number = _order_number(text)

    research = re.match(r"\s*(?:please\s+)?research\b[\s:,-]*(.*)", text, re.IGNORECASE | re.DOTALL)
    if research and "research" in tools:
        topic = research.group(1).strip(" ?.!") or text.strip()
        return ToolCall("research", {"input": topic})

    if "research" in tools and number is None and POLICY_QUESTION.search(text):
        return ToolCall("research", {"input": text.strip(" ?.!")})

    if "search_knowledge_base" in tools:
        query = (research.group(1) if research else text).strip(" ?.!") or text.strip()
        # A researcher that also had order tools should still use them for order requests.
        if number is None or not tools & ORDER_TOOLS:
            return ToolCall("search_knowledge_base", {"query": query})

    warehouse = _warehouse_call(text, tools)
    if warehouse is not None:
        return warehouse

    address = EMAIL_ADDRESS.search(text)
    if re.search(r"\b(e-?mail|mail|write)\b", lowered) and address:
        if "send_email" not in tools:
            return Say(_cannot("email customers", tools, handoffs))
        return ToolCall("send_email", _email_arguments(address.group(0), text, number))

    if re.search(r"\bcancel", lowered):
        if "cancel_order" not in tools:
            return Say(_cannot("cancel orders", tools, handoffs))
        if number is None:
            return Say("Which order should I cancel? Give me its number, like “cancel order 42”.")
        return ToolCall("cancel_order", {"order_id": number})

    if re.search(r"\brefund", lowered) and (number is not None or MONEY.search(text)):
        if "issue_refund" not in tools:
            return Say(_cannot("issue refunds", tools, handoffs))
        amount = _refund_amount(text)
        if number is None or amount is None:
            return Say(
                "To issue a refund I need the order number and the amount, like "
                "“refund 30 on order 42”."
            )
        return ToolCall("issue_refund", {"order_id": number, "amount": float(amount)})

    for handoff in handoffs:
        if re.search(rf"\b{re.escape(handoff.agent_name.lower())}\b", lowered):
            return ToolCall(handoff.tool_name, {})

    if number is not None:
        if "lookup_order" not in tools:
            return Say(_cannot("look up orders", tools, handoffs))
        return ToolCall("lookup_order", {"order_id": number})

    return Say(_introduction(tools, handoffs))


def _warehouse_call(text: str, tools: set[str]) -> Reply | None:
    """The warehouse's tools (its MCP server's), for an agent that has them: "restock 5
    grinders", "how many mugs are in stock"."""
    item = WAREHOUSE_ITEM.search(text)
    if "restock" in tools and re.search(r"\brestock\b", text, re.IGNORECASE):
        if item is None:
            return Say("Which item should I restock? Say, for example, “restock 5 grinders”.")
        quantity = re.search(r"\b(\d+)\b", text)
        return ToolCall(
            "restock",
            {"sku": item.group(1).lower(), "quantity": int(quantity.group(1)) if quantity else 1},
        )
    if "stock_level" in tools and item is not None and re.search(r"\bstock\b", text, re.I):
        return ToolCall("stock_level", {"sku": item.group(1).lower()})
    return None


def _order_number(text: str) -> int | None:
    match = ORDER_NUMBER.search(text)
    if match:
        return int(match.group(1) or match.group(2))
    numbers = re.findall(r"(?<![\w.$])\d+(?![\w.])", text)
    # A lone bare number is taken as an order number; with several it is anyone's guess.
    return int(numbers[0]) if len(numbers) == 1 and not re.search(r"\brefund", text, re.I) else None


def _refund_amount(text: str) -> Decimal | None:
    # The order number is taken out first, so that the number left is the amount.
    without_order = ORDER_NUMBER.sub(" ", text)
    dollars = re.search(
        r"\$\s*(\d+(?:\.\d{1,2})?)|(\d+(?:\.\d{1,2})?)\s*(?:dollars|usd)\b", without_order, re.I
    )
    match = dollars or MONEY.search(without_order)
    if match is None:
        return None
    try:
        return Decimal(next(group for group in match.groups() if group))
    except (InvalidOperation, StopIteration):
        return None


def _email_arguments(to: str, text: str, number: int | None) -> dict[str, Any]:
    about = re.search(r"\babout\s+(.+)$", text, re.IGNORECASE | re.DOTALL)
    topic = about.group(1).strip(" .!?") if about else ""
    topic = re.sub(r"^(my|our)\b", "your", topic, flags=re.IGNORECASE)
    if topic:
        subject = f"About {topic}"
        if number is not None and str(number) not in topic:
            subject += f" (order {number})"
        purpose = f"We are writing to you about {topic}."
    else:
        subject = (
            f"About your order {number}"
            if number is not None
            else "A message from our support desk"
        )
        purpose = "We are following up on your request."
    body = (
        f"Hello,\n\n{purpose} If you have any question, just reply to this email.\n\n"
        "Kind regards,\nThe support desk"
    )
    return {"to": to, "subject": subject, "body": body, "order_id": number}


def _about_result(
    tool_name: str, arguments: dict[str, Any], output: str, tools: Sequence[str]
) -> str:
    if _is_transfer(output):
        return _greeting(json.loads(output)["assistant"], tools)
    quoted = _quote(output)
    if WITHDRAWAL_MARKER.search(output):
        action = _describe_call(tool_name, arguments)
        return f"You withdrew the request to {action}, so nothing was done."
    if REJECTION_MARKERS.search(output):
        action = _describe_call(tool_name, arguments)
        return f"The request to {action} was not approved, so nothing was done: {quoted}"
    lead = RESULT_LEADS.get(tool_name, f"The {tool_name or 'tool'} result")
    return f"{lead}: {quoted}"


def _describe_call(tool_name: str, arguments: dict[str, Any]) -> str:
    order = arguments.get("order_id")
    if tool_name == "cancel_order" and order is not None:
        return f"cancel order {order}"
    if tool_name == "issue_refund" and order is not None:
        amount = arguments.get("amount")
        shown = formatting.money(amount, "USD") or str(amount)
        return f"refund {shown} on order {order}"
    if tool_name == "send_email" and arguments.get("to"):
        return f"email {arguments['to']}"
    return f"run {tool_name}"


def _greeting(agent_name: str, tools: Sequence[str]) -> str:
    abilities = [ABILITIES[name] for name in EXAMPLES if name in tools]
    examples = [f"“{EXAMPLES[name]}”" for name in EXAMPLES if name in tools]
    if not abilities:
        return f"Hi, this is {agent_name}. How can I help?"
    return (
        f"Hi, this is {agent_name}. I can {_join(abilities)}; for example, say "
        f"{_join(examples, 'or')}."
    )


def _cannot(what: str, tools: set[str], handoffs: Sequence[Handoff]) -> str:
    return f"I can't {what} from here. {_capabilities(tools, handoffs)}"


def _introduction(tools: set[str], handoffs: Sequence[Handoff]) -> str:
    return "I'm the offline demo model, so I only understand a few requests. " + _capabilities(
        tools, handoffs
    )


def _capabilities(tools: set[str], handoffs: Sequence[Handoff]) -> str:
    examples = [f"“{EXAMPLES[name]}”" for name in EXAMPLES if name in tools]
    examples += [f"“I have a {handoff.agent_name.lower()} question”" for handoff in handoffs]
    if not examples:
        # Tools without a phrase of their own are explained by `_how_to_call`.
        return "" if tools else "I have no tools to act with, so I can only chat."
    return f"Try: {_join(examples, 'or')}."


def _join(parts: Sequence[str], conjunction: str = "and") -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return f"{', '.join(parts[:-1])} {conjunction} {parts[-1]}"


def _quote(output: str) -> str:
    # Quotes inside the quote become single quotes, as in print.
    text = " ".join(output.split()).replace("“", "‘").replace("”", "’")
    if len(text) > MAX_QUOTE:
        text = text[: MAX_QUOTE - 1].rstrip() + "…"
    return f"“{text}”"


# --- Reading the conversation --------------------------------------------------------------


def _as_items(input: str | Iterable[Any], system: str | None = None) -> list[dict[str, Any]]:
    """What the model was given, as the SDK's chat completions model traces it: the agent's
    instructions as a system message first."""
    given = [{"role": "system", "content": system}] if system else []
    if isinstance(input, str):
        return [*given, {"role": "user", "content": input}]
    return [*given, *(_dump(item) for item in input)]


def _dump(item: Any) -> dict[str, Any]:
    if isinstance(item, Mapping):
        return dict(item)
    if hasattr(item, "model_dump"):
        dumped = item.model_dump(exclude_unset=True)
        return dumped if isinstance(dumped, dict) else {}
    return {}


def _is_user_message(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type", "message") == "message"


def _latest_turn(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for index in range(len(items) - 1, -1, -1):
        if _is_user_message(items[index]):
            return items[index + 1 :]
    return items


def _latest_user_text(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if _is_user_message(item):
            return _text(item.get("content"))
    return ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text(part) for part in content)
    if isinstance(content, Mapping):
        value = content.get("text", content.get("refusal", ""))
        return value if isinstance(value, str) else ""
    return ""


def _last_tool_result(
    turn: list[dict[str, Any]], items: list[dict[str, Any]]
) -> tuple[str, dict[str, Any], str] | None:
    """(tool name, arguments, output) of the latest turn's last tool result, if it has one."""
    for item in reversed(turn):
        if item.get("type") != "function_call_output":
            continue
        call = next(
            (
                candidate
                for candidate in items
                if candidate.get("type") == "function_call"
                and candidate.get("call_id") == item.get("call_id")
            ),
            {},
        )
        try:
            arguments = json.loads(call.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        if not isinstance(arguments, dict):
            arguments = {}
        return str(call.get("name", "")), arguments, _text(item.get("output"))
    return None


def _is_transfer(output: str) -> bool:
    # The SDK answers a handoff call with {"assistant": "<agent name>"}.
    try:
        parsed = json.loads(output)
    except ValueError:
        return False
    return isinstance(parsed, dict) and list(parsed) == ["assistant"]


# --- Stream and trace helpers --------------------------------------------------------------


def _words_of(text: str) -> list[str]:
    # Split before every word that follows whitespace, so the pieces join back to the text.
    return [piece for piece in re.split(r"(?<=\s)(?=\S)", text) if piece]


def _rechunk(event: TResponseStreamEvent) -> list[TResponseStreamEvent]:
    if isinstance(event, ResponseTextDeltaEvent):
        return [
            event.model_copy(update={"delta": word, "logprobs": []})
            for word in _words_of(event.delta)
        ]
    if isinstance(event, ResponseCreatedEvent | ResponseInProgressEvent | ResponseCompletedEvent):
        response = event.response.model_copy(update={"model": MODEL_NAME})
        return [event.model_copy(update={"response": response})]
    return [event]


def _span_usage(usage: Usage) -> dict[str, Any]:
    return {
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "input_tokens_details": usage.input_tokens_details.model_dump(),
        "output_tokens_details": usage.output_tokens_details.model_dump(),
    }
