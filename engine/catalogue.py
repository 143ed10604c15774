"""What an approval policy may name: the agents and tools whose calls it can match.

A rule (`engine.policies`) matches a call by the name of the agent that made it (the agent's
own name, `Agent.name`, as a paused call carries it: "Support desk", not the name it is
registered under) and the name of the tool. A rule naming an agent or tool that no call can
carry matches nothing, silently: a typo in a rule that rejects or always asks protects
nothing. So the rule forms check the names against what is known (`unknown_names`) and
suggest the known ones (`catalogue`).

What is known: every agent reachable from the registered ones (`registry.walk`), with its
tools (function tools, agents used as tools, the tools a hosted MCP server is allowed), the
tools its MCP servers list (`engine.mcp.tools_of`: listed on demand with a timeout, kept a
while), the tools declared for a server by name (`registry.review(server, tool_name=...)`), and
the MCP tools that past requests were for (a hosted server's tools are known no other way).
A server that does not answer in time is named in the refusal: its tools are not known then.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agents import Agent, HostedMCPTool

from approvals.models import MCP_KINDS, ApprovalRequest
from engine import mcp, registry


@dataclass(frozen=True)
class KnownTool:
    agent_name: str
    tool_name: str
    description: str
    arguments: tuple[str, ...]
    # The MCP server (a local server's name, a hosted one's label) whose tool it is; "" for one
    # of the agent's own.
    server: str = ""


@dataclass(frozen=True)
class Catalogue:
    """The agents and tools a rule may name, for the rule forms' suggestions and checks: every
    agent reachable from the registered ones (`registry.walk`) by the name its calls carry,
    with its tools (function tools, agents used as tools, the tools its MCP servers list);
    `unlisted`: the MCP servers whose tools are not in it (not asked, or they did not answer)."""

    agents: tuple[str, ...]
    tools: tuple[KnownTool, ...]
    unlisted: tuple[str, ...] = ()

    def tool_names(self) -> set[str]:
        return {tool.tool_name for tool in self.tools}

    def tools_of(self, agent_name: str) -> set[str]:
        return {tool.tool_name for tool in self.tools if tool.agent_name == agent_name}

    def holders(self, tool_name: str) -> list[str]:
        return sorted({tool.agent_name for tool in self.tools if tool.tool_name == tool_name})


def catalogue(*, list_servers: bool = True) -> Catalogue:
    """What a rule may name now. The tools of the agents' MCP servers come from what each
    server lists (`engine.mcp.tools_of`: listed on demand, kept a while; only with
    `list_servers`), what was declared for a server's tool by name (`registry.review(server,
    tool_name=...)`), and the MCP tools past requests were for (a hosted server's are known no
    other way)."""
    agents: dict[str, Agent[Any]] = {}
    for start_name in registry.agent_names():
        try:
            start = registry.get_agent(start_name)
        except Exception:
            continue
        for agent in registry.walk(start):
            agents.setdefault(agent.name, agent)
    found: dict[tuple[str, str], KnownTool] = {}

    def add(tool: KnownTool) -> None:
        found.setdefault((tool.agent_name, tool.tool_name), tool)

    servers: dict[str, list[str]] = {}  # server name -> the agents that use it
    run_servers: list[tuple[str, mcp.RunServer]] = []
    for agent in agents.values():
        for tool in agent.tools:
            for known in _own_tools(agent.name, tool):
                add(known)
                if known.server:
                    servers.setdefault(known.server, []).append(agent.name)
        for server in agent.mcp_servers:
            servers.setdefault(server.name, []).append(agent.name)
            if isinstance(server, mcp.RunServer):
                run_servers.append((agent.name, server))
    unlisted: set[str] = set()
    listed = mcp.tools_of([server for _, server in run_servers]) if list_servers else {}
    for agent_name, server in run_servers:
        tools = listed.get(server.key)
        if tools is None:
            unlisted.add(server.name)
        for tool in tools or ():
            add(_listed_tool(agent_name, server.name, tool))
    for server_name, tool_name in registry.declared_server_tools():
        for agent_name in servers.get(server_name, ()):
            add(KnownTool(agent_name, tool_name, "", (), server_name))
    seen = (
        ApprovalRequest.objects.filter(kind__in=MCP_KINDS)
        .order_by()
        .values_list("agent_name", "tool_name", "server")
        .distinct()
    )
    for agent_name, tool_name, server_name in seen:
        if agent_name in agents and tool_name:
            add(KnownTool(agent_name, tool_name, "", (), server_name))
    return Catalogue(tuple(sorted(agents)), tuple(found.values()), tuple(sorted(unlisted)))


def _own_tools(agent_name: str, tool: Any) -> list[KnownTool]:
    """The names an agent's tool gives its calls: its own; for a hosted MCP server, the tools
    it allows (its calls are named after the server's tools), when it lists them."""
    if isinstance(tool, HostedMCPTool):
        config = dict(tool.tool_config)
        allowed = config.get("allowed_tools")
        names = allowed.get("tool_names") if isinstance(allowed, dict) else allowed
        label = str(config.get("server_label") or "")
        return [
            KnownTool(agent_name, str(name), "", (), label)
            for name in (names if isinstance(names, list) else [])
        ]
    name = getattr(tool, "name", None)
    if not isinstance(name, str):
        return []
    schema = getattr(tool, "params_json_schema", None) or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    description = str(getattr(tool, "description", "") or "").strip()
    return [
        KnownTool(
            agent_name,
            name,
            description.splitlines()[0] if description else "",
            tuple(properties) if isinstance(properties, dict) else (),
        )
    ]


def _listed_tool(agent_name: str, server: str, tool: Any) -> KnownTool:
    schema = mcp.input_schema(tool)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    description = str(getattr(tool, "description", None) or "").strip()
    return KnownTool(
        agent_name,
        str(tool.name),
        description.splitlines()[0] if description else "",
        tuple(properties) if isinstance(properties, dict) else (),
        server,
    )


@dataclass(frozen=True)
class UnknownName:
    """A name a rule gives that no call carries: the form's field, the name, the closest known
    names, what is missing (a clause: "no registered agent has a tool called “x”") and the
    sentences people read."""

    field: str
    name: str
    closest: tuple[str, ...]
    missing: str
    message: str


def unknown_names(agent_name: str, tool_name: str) -> list[UnknownName]:
    """What of a rule's agent and tool names matches no call, as far as is known now: an agent
    that is not reachable from the registered ones, a tool none of them has and no MCP server
    of theirs lists, or a tool its agent has not."""
    return unknown_in([(agent_name, tool_name)])[0]


def unknown_in(named: Sequence[tuple[str, str]]) -> list[list[UnknownName]]:
    """`unknown_names` of each (agent name, tool name), from one `catalogue` (two when a name
    is not found without the tools the MCP servers list: then they are asked)."""
    known = catalogue(list_servers=False)
    found = [_unknown(agent_name, tool_name, known) for agent_name, tool_name in named]
    if any(found) and known.unlisted:
        known = catalogue()
        found = [_unknown(agent_name, tool_name, known) for agent_name, tool_name in named]
    return found


def _unknown(agent_name: str, tool_name: str, known: Catalogue) -> list[UnknownName]:
    problems: list[UnknownName] = []
    agent_known = not agent_name or agent_name in known.agents
    if not agent_known:
        problems.append(_unknown_agent(agent_name, known))
    if not tool_name:
        return problems
    if tool_name not in known.tool_names():
        closest = _closest(tool_name, known.tool_names())
        missing = f"no registered agent has a tool called “{tool_name}”"
        message = (
            f"No registered agent has a tool called “{tool_name}”, and no MCP server of theirs "
            f"listed one: {NO_CALL}"
        )
        if known.unlisted:
            servers = _words(known.unlisted)
            plural = len(known.unlisted) > 1
            message += (
                f" (The MCP server{'s' if plural else ''} {servers} did not list "
                f"{'their' if plural else 'its'} tools just now, so they are not known here.)"
            )
        problems.append(
            UnknownName("tool_name", tool_name, closest, missing, _with(message, closest))
        )
    elif agent_name and agent_known and tool_name not in known.tools_of(agent_name):
        closest = _closest(tool_name, known.tools_of(agent_name))
        holders = known.holders(tool_name)
        missing = f"{agent_name} has no tool called “{tool_name}”"
        message = (
            f"{missing} ({_words(holders)} {'has' if len(holders) == 1 else 'have'}): {NO_CALL}"
        )
        problems.append(
            UnknownName("tool_name", tool_name, closest, missing, _with(message, closest))
        )
    return problems


NO_CALL = "the rule would match no call."


def _unknown_agent(name: str, known: Catalogue) -> UnknownName:
    try:
        registered = registry.get_agent(name).name if name in registry.agent_names() else None
    except Exception:
        registered = None
    if registered is not None:
        return UnknownName(
            "agent_name",
            name,
            (registered,),
            f"no agent's calls carry the name “{name}”",
            f"“{name}” is the name the agent {registered} is registered under; a rule names "
            f"an agent as its calls do: {registered}.",
        )
    closest = _closest(name, known.agents)
    missing = f"no registered agent is called “{name}”"
    message = f"No registered agent is called “{name}”: {NO_CALL}"
    return UnknownName("agent_name", name, closest, missing, _with(message, closest))


def _closest(name: str, known: Iterable[str]) -> tuple[str, ...]:
    """The known names most like `name`, ignoring case, best first."""
    by_folded: dict[str, str] = {}
    for candidate in sorted(known):
        by_folded.setdefault(candidate.casefold(), candidate)
    found = difflib.get_close_matches(name.casefold(), list(by_folded), n=3, cutoff=0.6)
    return tuple(by_folded[folded] for folded in found)


def _with(message: str, closest: Sequence[str]) -> str:
    return f"{message} Did you mean {_words(closest, 'or')}?" if closest else message


def _words(names: Sequence[str], last: str = "and") -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"
