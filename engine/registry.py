"""The registry of agents, by public name.

`settings.AGENTSITE_AGENTS` maps each public name (what a conversation stores) to the dotted
path of an `agents.Agent`; the first is the default. A deployment swaps the demo for its own
agents by changing that one setting.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

# This module is `engine.registry`; absolute imports make `agents` the SDK, not this file.
from agents import Agent
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

_cache: dict[str, Agent[Any]] = {}


class UnknownAgent(KeyError):
    """No agent is registered under this name."""

    def __init__(self, name: str, registered: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.registered = registered

    def __str__(self) -> str:
        # KeyError's own str() is the repr of its key; people read this message.
        names = ", ".join(repr(name) for name in self.registered) or "none"
        return f"No agent is registered as {self.name!r}. Registered agents: {names}."


def _registry() -> dict[str, str]:
    registry = settings.AGENTSITE_AGENTS
    if not isinstance(registry, dict):
        raise ImproperlyConfigured(
            "AGENTSITE_AGENTS must map agent names to dotted paths of agents.Agent objects."
        )
    return registry


def agent_names() -> list[str]:
    """The registered agent names, the default first."""
    return list(_registry())


def default_agent_name() -> str:
    names = agent_names()
    if not names:
        raise ImproperlyConfigured("AGENTSITE_AGENTS is empty: register at least one agent.")
    return names[0]


def get_agent(name: str) -> Agent[Any]:
    """The agent registered as `name`, or, for "<registered>/<agent name>", the agent of that
    name reachable from the registered one (a handoff target: see `public_name`).

    Raises:
        UnknownAgent: no agent has that name.
        ImproperlyConfigured: its dotted path does not import, or is not an `agents.Agent`.
    """
    registry = _registry()
    if name not in registry:
        start, separator, inner = name.partition(HANDOFF_SEPARATOR)
        if separator and start in registry:
            for reachable in walk(get_agent(start)):
                if reachable.name == inner:
                    return reachable
        raise UnknownAgent(name, list(registry))
    path = registry[name]
    agent = _cache.get(path)
    if agent is None:
        agent = _import_agent(name, path)
        _cache[path] = agent
    return agent


# Between a registered name and the name of an agent reachable from it: "support/Billing".
HANDOFF_SEPARATOR = "/"
PUBLIC_NAME_MAX = 100  # what `Conversation.current_agent` and `AgentRun.agent_name` hold


def public_name(start_name: str, agent: Agent[Any]) -> str | None:
    """The name `get_agent` knows `agent` by, in a conversation started with the agent
    registered as `start_name`: `start_name` for that agent itself, "<start_name>/<its name>"
    for an agent reachable from it (a handoff target, `result.last_agent`). None when `agent`
    is not reachable from it (or the name would not fit): the conversation keeps its agent."""
    start = get_agent(start_name)
    if agent is start:
        return start_name
    if not any(reachable is agent for reachable in walk(start)):
        return None
    name = f"{start_name}{HANDOFF_SEPARATOR}{agent.name}"
    return name if len(name) <= PUBLIC_NAME_MAX else None


def display_name(name: str) -> str:
    """How a person reads the agent `name` stands for: its own name ("Billing"), or `name`
    itself when it no longer resolves."""
    try:
        return get_agent(name).name
    except Exception:
        return name


def tool_description(name: str, agent_name: str, tool_name: str) -> str:
    """The description of the tool `tool_name` of the agent called `agent_name`, reachable
    from the agent `name` stands for; "" when there is no such tool (any more)."""
    try:
        start = get_agent(name)
    except Exception:
        return ""
    for agent in walk(start):
        if agent.name != agent_name:
            continue
        for tool in agent.tools:
            if getattr(tool, "name", None) == tool_name:
                return str(getattr(tool, "description", "") or "")
    return ""


def reset() -> None:
    """Forget the agents imported so far: the next `get_agent` imports its path anew (after
    `AGENTSITE_AGENTS` or an agent's module changed, as in tests)."""
    _cache.clear()


def _import_agent(name: str, path: str) -> Agent[Any]:
    try:
        agent = import_string(path)
    except ImportError as error:
        raise ImproperlyConfigured(
            f"AGENTSITE_AGENTS[{name!r}] = {path!r} does not import: {error}"
        ) from error
    if not isinstance(agent, Agent):
        raise ImproperlyConfigured(
            f"AGENTSITE_AGENTS[{name!r}] = {path!r} is a {type(agent).__name__}, "
            "not an agents.Agent."
        )
    return agent


def agents_as_tools(agent: Agent[Any]) -> list[Agent[Any]]:
    """The agents that `agent` uses as tools (`Agent.as_tool`)."""
    # The SDK keeps no public link from such a tool to its agent: this is the one place that
    # reads its private attribute.
    inner = (getattr(tool, "_agent_instance", None) for tool in agent.tools)
    return [other for other in inner if isinstance(other, Agent)]


def walk(agent: Agent[Any]) -> Iterator[Agent[Any]]:
    """`agent` and every agent reachable from it through agents used as tools and handoffs,
    depth first (an agent's tools before its handoffs), each name once."""
    seen: set[str] = set()
    stack = [agent]
    while stack:
        current = stack.pop()
        if current.name in seen:
            continue
        seen.add(current.name)
        yield current
        nested = [*agents_as_tools(current), *(h for h in current.handoffs if isinstance(h, Agent))]
        stack.extend(reversed(nested))


def is_agent_as_tool(agent: Agent[Any], name: str) -> bool:
    """Whether an agent named `name` is used as a tool anywhere in `agent`'s graph."""
    return any(inner.name == name for current in walk(agent) for inner in agents_as_tools(current))


def fingerprint(agent: Agent[Any]) -> str:
    """A hash of what a saved run depends on: the agent graph, not its wording.

    It covers every agent reachable through handoffs and agents used as tools, their tools'
    names, JSON schemas and approval settings. Instructions and models are left out: changing
    a prompt must not strand the runs that wait for a reviewer, while changing a tool's
    schema or whether it needs approval must.
    """
    graph = {current.name: _describe(current) for current in walk(agent)}
    canonical = json.dumps(graph, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _approval_setting(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"


def _describe(agent: Agent[Any]) -> dict[str, Any]:
    tools = [
        {
            "name": tool.name,
            "type": type(tool).__name__,
            "schema": getattr(tool, "params_json_schema", None),
            "needs_approval": _approval_setting(getattr(tool, "needs_approval", False)),
        }
        for tool in agent.tools
    ]
    handoffs: list[Any] = [
        handoff.name
        if isinstance(handoff, Agent)
        else {
            "agent": handoff.agent_name,
            "tool": handoff.tool_name,
            "schema": handoff.input_json_schema,
        }
        for handoff in agent.handoffs
    ]
    return {"tools": sorted(tools, key=lambda t: t["name"]), "handoffs": handoffs}
