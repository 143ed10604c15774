"""The registry of agents, by public name.

`settings.AGENTSITE_AGENTS` maps each public name (what a conversation stores) to the dotted
path of an `agents.Agent`; the first is the default. A deployment swaps the demo for its own
agents by changing that one setting.

An entry may instead be `{"agent": "dotted.path", "model": "...", "model_settings": {...}}`:
the deployment's model and settings (`SETTING_RULES`) for that agent, over the ones its code
declares. They are applied to the imported agent object itself, so that the agent answers
with them wherever it answers: registered, as another agent's handoff target, or in a
conversation that went on with it. So every such entry is applied before any agent is handed
out, one agent object takes settings from one entry only, and `reset()` restores what its code
declared.

What reviewers read about a tool (`tool_sheet`): its description and JSON schema (the SDK's),
and what its author declares beside it with `review(...)`: a risk level, which arguments are
money, and a hook for the facts a call would touch (docs/agents.md, "Explaining a tool to
reviewers").
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

# This module is `engine.registry`; absolute imports make `agents` the SDK, not this file.
import jsonschema
from agents import Agent, ModelSettings
from agents.mcp import MCPServer
from agents.models.interface import Model
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from approvals.models import MCP_KINDS, ToolKind
from engine import mcp

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


def _registry() -> dict[str, str | dict[str, Any]]:
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
    # Any agent may hand off to one an entry gives settings: apply them all first.
    _sync(registry)
    entry = _entry(name, registry[name])
    agent = _load(name, entry.path)
    if not entry.overrides:
        applied = _applied.get(id(agent))
        if applied is not None and applied.name != name:
            raise _conflict(agent, applied.name, name)
    return agent


def _load(name: str, path: str) -> Agent[Any]:
    agent = _cache.get(path)
    if agent is None:
        with _lock:
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


def find_tool(
    name: str | None, agent_name: str, tool_name: str, kind: str = ToolKind.FUNCTION
) -> Any | None:
    """The tool `tool_name` of the agent called `agent_name`, reachable from the agent `name`
    stands for (from any registered agent when `name` is None); None when there is no such
    tool (any more). A call of `kind` MCP is for a tool of an MCP server, never one of the
    agent's own: none is found for it, so that a tool of the same name lends it nothing (its
    description, schema, risk, facts)."""
    if kind in MCP_KINDS:
        return None
    for start_name in agent_names() if name is None else [name]:
        try:
            start = get_agent(start_name)
        except Exception:
            continue
        for agent in walk(start):
            if agent.name != agent_name:
                continue
            for tool in agent.tools:
                if getattr(tool, "name", None) == tool_name:
                    return tool
    return None


def reachable_tool(name: str, tool_name: str) -> Any | None:
    """The first function tool `tool_name` of any agent reachable from the agent `name`
    stands for (a call in a conversation, whichever of its agents made it); None when there is
    none (any more), or for an MCP server's tool (not among the agents' own)."""
    try:
        start = get_agent(name)
    except Exception:
        return None
    for agent in walk(start):
        for tool in agent.tools:
            if getattr(tool, "name", None) == tool_name:
                return tool
    return None


# --- what reviewers read about a tool -------------------------------------------------------


class Risk(enum.StrEnum):
    """How much a call can hurt, as the tool's author declares it."""

    LOW = "low"  # reads, or changes what is easily put back
    HIGH = "high"  # changes something that matters, but it can be put right
    IRREVERSIBLE = "irreversible"  # money sent, an email gone, an order cancelled


# What may happen to a call nobody decided in time (`approvals.models.ExpiryAction`'s values).
EXPIRY_ACTIONS = ("reject", "escalate", "approve")

# A tool whose author declared nothing: it asks a person, so it is taken to matter. "low" would
# lull the reviewer about a tool nobody described; "irreversible" would drown the tools whose
# authors said so. The inbox says "not declared" beside it.
UNDECLARED_RISK = Risk.HIGH

# (arguments, user) of each call -> its facts, in the same order: each fact a (label, value)
# pair, or (label, value, True) for a warning (`engine.facts.Fact`).
FactsHook = Callable[[Sequence[tuple[dict[str, Any], Any]]], Sequence[Sequence[Any]]]


@dataclass(frozen=True)
class Review:
    """What a tool's author declares for the reviewers of its calls."""

    risk: Risk = UNDECLARED_RISK
    declared: bool = False
    # Arguments that are amounts of money in `currency` (an ISO 4217 code): shown as money.
    money: tuple[str, ...] = ()
    currency: str = "USD"
    facts: FactsHook | None = None
    # Whether a reviewer may change the call's arguments before approving it ("edit, then
    # approve"); a tool's author forbids it with `review(..., editable=False)`.
    editable: bool = True
    # Whether an approval policy may approve a call without a person (`engine.policies`); a
    # tool's author requires a person with `review(..., auto_approve=False)`.
    auto_approve: bool = True
    # When nobody decides a call in time (`engine.runs.expire_overdue`): "reject", "escalate"
    # (to the auth Group `escalate_to`) or "approve"; an approval policy's rule may say
    # otherwise, and approve only where `expiry_approval`.
    on_expiry: str = "reject"
    escalate_to: str = ""
    expiry_approval: bool = False


# id(tool) -> (the tool, its declarations); the tool is kept so that its id stays its own.
_reviews: dict[int, tuple[Any, Review]] = {}
_T = TypeVar("_T")


def review(
    tool: Any = None,
    /,
    *,
    risk: Risk | str,
    money: Sequence[str] = (),
    currency: str = "USD",
    facts: FactsHook | None = None,
    editable: bool = True,
    auto_approve: bool = True,
    on_expiry: str = "reject",
    escalate_to: str = "",
    expiry_approval: bool | None = None,
    tool_name: str | None = None,
) -> Any:
    """Declare, for a tool (an SDK `FunctionTool`, or any tool object), what its reviewers
    read: `review(tool, risk="irreversible", money=["amount"], facts=hook)`, or
    `@review(risk=...)` above `@function_tool`. Returns the tool itself.

    For a tool of an MCP server, give the server and the tool's name:
    `review(server, tool_name="git_create_branch", risk="high", facts=hook)` (no `tool_name`:
    every tool of the server not declared by name). The server is known by its name, as its
    calls' requests are; its calls' description and arguments are what the server lists. A
    server's tool declared so may also have its calls' arguments edited by reviewers (checked
    against the schema the server listed), unless `editable=False`; one declared nothing may
    not.

    `editable=False`
    forbids reviewers to change a call's arguments before approving it (they may still
    approve, reject or answer as the tool). `auto_approve=False` lets no approval policy
    approve a call without a person (a policy may still reject it).

    `on_expiry` says what happens when nobody decides a call in time: "reject" (the default),
    "escalate" (the deadline is extended once by AGENTSITE_ESCALATION_SECONDS and the Django
    auth Group named `escalate_to` is told; then it is rejected) or "approve". An approval
    policy's rule may choose otherwise for the calls it sends to a person, but approve only
    where `expiry_approval` (True by default only with `on_expiry="approve"`).

    Raises:
        ValueError: `risk` is not one of low, high, irreversible; `money` names an argument
            the tool's JSON schema does not have; `on_expiry` is not one of reject, escalate,
            approve, escalates to no group, or approves where `expiry_approval` is False.
    """
    level = Risk(risk)
    if on_expiry not in EXPIRY_ACTIONS:
        raise ValueError(f"review(on_expiry=...) is one of {', '.join(EXPIRY_ACTIONS)}")
    if on_expiry == "escalate" and not escalate_to.strip():
        raise ValueError("review(on_expiry='escalate') needs escalate_to, a group's name")
    allowed = on_expiry == "approve" if expiry_approval is None else expiry_approval
    if on_expiry == "approve" and not allowed:
        raise ValueError("review(on_expiry='approve') with expiry_approval=False")

    declared = Review(
        level,
        True,
        tuple(money),
        currency.upper(),
        facts,
        editable,
        auto_approve,
        on_expiry,
        escalate_to.strip(),
        allowed,
    )

    def declare(target: _T) -> _T:
        if isinstance(target, MCPServer):
            if money:
                raise ValueError("review(money=...) is not for a server's tools")
            _server_reviews[(target.name, tool_name or "")] = declared
            return target
        if tool_name is not None:
            raise ValueError("review(tool_name=...) names a tool of an MCP server given first")
        schema = getattr(target, "params_json_schema", None) or {}
        properties = schema.get("properties") if isinstance(schema, dict) else None
        unknown = [n for n in money if isinstance(properties, dict) and n not in properties]
        if unknown:
            raise ValueError(f"review(money=...) names arguments the tool has not: {unknown}")
        _reviews[id(target)] = (target, declared)
        return target

    return declare if tool is None else declare(tool)


def declared_review(tool: Any) -> Review:
    """What `tool`'s author declared (`review`), or the defaults when nothing."""
    found = _reviews.get(id(tool))
    return found[1] if found is not None and found[0] is tool else Review()


# (server name, tool name or "" for all its tools) -> what a deployment declared for them.
_server_reviews: dict[tuple[str, str], Review] = {}


def declared_server_tools() -> list[tuple[str, str]]:
    """The (server name, tool name) of each MCP server's tool declared by name."""
    return sorted(key for key in _server_reviews if key[1])


def declared_server_review(server: str, tool: str) -> Review:
    """What was declared for the MCP server `server`'s tool `tool` (by name, else for all of
    the server's tools), or the defaults when nothing."""
    return _server_reviews.get((server, tool)) or _server_reviews.get((server, "")) or Review()


@dataclass(frozen=True)
class ToolSheet:
    """What reviewers read about a tool: the SDK tool's description and its schema's
    properties (name -> schema, in the schema's order), and its author's `Review`."""

    name: str
    found: bool
    description: str
    properties: list[tuple[str, dict[str, Any]]]
    review: Review
    # The tool's whole JSON schema (`params_json_schema`): what edited arguments must satisfy.
    schema: dict[str, Any] = field(default_factory=dict)

    @property
    def editable(self) -> bool:
        """Whether a reviewer may edit a call's arguments: a function tool with a JSON schema
        of an object, whose author did not forbid it."""
        return (
            self.found
            and self.review.editable
            and self.schema.get("type") == "object"
            and isinstance(self.schema.get("properties"), dict)
        )


def tool_sheet(
    name: str | None, agent_name: str, tool_name: str, kind: str = ToolKind.FUNCTION
) -> ToolSheet:
    """The sheet of the tool `find_tool` finds; an empty one when there is none (any more)."""
    tool = find_tool(name, agent_name, tool_name, kind)
    if tool is None:
        return ToolSheet(tool_name, False, "", [], Review())
    return sheet_of(
        tool_name,
        getattr(tool, "description", ""),
        getattr(tool, "params_json_schema", None),
        declared_review(tool),
    )


def request_sheet(run_agent: str | None, request: Any) -> ToolSheet:
    """The sheet of the tool an approval request is for: for a local MCP server's tool, what
    the server listed when the run paused (`ApprovalRequest.tool_sheet`, in the server's
    order) with what was declared for it (`review(server, tool_name=...)`); else `tool_sheet`."""
    if request.kind not in MCP_KINDS:
        return tool_sheet(run_agent, request.agent_name, request.tool_name, request.kind)
    stored = request.tool_sheet if isinstance(request.tool_sheet, dict) else {}
    review = declared_server_review(request.server, request.tool_name)
    if not stored:
        return ToolSheet(request.tool_name, False, "", [], review)
    sheet = sheet_of(request.tool_name, stored.get("description"), stored.get("schema"), review)
    order = stored.get("order")
    if isinstance(order, list):
        # As the server listed them (`saving._server_tool_sheet`), whatever the database kept.
        place = {str(name): index for index, name in enumerate(order)}
        sheet.properties.sort(key=lambda item: place.get(item[0], len(place)))
    return sheet


def sheet_of(name: str, description: Any, schema: Any, review: Review | None = None) -> ToolSheet:
    """The sheet of a tool described by `description` and its JSON `schema` (the agent's
    own tool's, or what an MCP server listed: `ApprovalRequest.tool_sheet`)."""
    schema = schema if isinstance(schema, dict) else {}
    properties = schema.get("properties")
    return ToolSheet(
        name=name,
        found=True,
        description=str(description or ""),
        properties=[
            (str(key), value if isinstance(value, dict) else {})
            for key, value in (properties.items() if isinstance(properties, dict) else [])
        ],
        review=review or Review(),
        schema=schema,
    )


def argument_errors(schema: dict[str, Any], arguments: Any) -> list[str]:
    """Why `arguments` do not satisfy the tool's JSON `schema`, one sentence per problem
    (none: they do). Checked with `jsonschema` (the validator of the schema's own draft)."""
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        return [f"The tool's schema cannot be checked: {exc.message}"]
    errors = sorted(validator_class(schema).iter_errors(arguments), key=lambda e: list(e.path))
    return [
        f"{'.'.join(str(part) for part in error.path) or 'arguments'}: {error.message}"
        for error in errors
    ]


def reset() -> None:
    """Forget the agents imported so far: the next `get_agent` imports its path anew (after
    `AGENTSITE_AGENTS` or an agent's module changed, as in tests), and give the agents that
    entries gave a model or settings back the ones their code declared."""
    with _lock:
        for applied in list(_applied.values()):
            _restore(applied)
        _synced.clear()
        _cache.clear()
    mcp.forget_listings()


# --- entries with a model and settings ------------------------------------------------------

ENTRY_KEYS = ("agent", "model", "model_settings")


def _number(low: float, high: float) -> Callable[[Any], str | None]:
    def rule(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{value!r} is not a number"
        if not low <= value <= high:
            return f"{value!r} is outside {low:g}..{high:g}"
        return None

    return rule


def _positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"{value!r} is not a positive whole number"
    return None


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"{value!r} is not true or false"


# The model settings a deployment may give an agent in AGENTSITE_AGENTS, and what each takes;
# the same rules check what agents' code declares. Other `ModelSettings` are set in code.
SETTING_RULES: dict[str, Callable[[Any], str | None]] = {
    "temperature": _number(0, 2),
    "top_p": _number(0, 1),
    "frequency_penalty": _number(-2, 2),
    "presence_penalty": _number(-2, 2),
    "max_tokens": _positive_int,
    "parallel_tool_calls": _bool,
}


@dataclass(frozen=True)
class _Entry:
    path: str
    # What the entry sets over the agent's code: "model" and "model_settings", as given.
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Applied:
    name: str
    spec: Mapping[str, Any]
    overrides: dict[str, Any]
    agent: Agent[Any]
    code_model: Any
    code_settings: ModelSettings


# id(agent) -> the entry applied to it and what its code declared.
_applied: dict[int, _Applied] = {}
# The entries with settings that `_applied` reflects, by name.
_synced: dict[str, Any] = {}
_lock = threading.RLock()


def _entry(name: str, spec: Any) -> _Entry:
    """The entry `AGENTSITE_AGENTS[name]`, checked.

    Raises:
        ImproperlyConfigured: it is not a dotted path, nor an object of known keys and values.
    """
    if isinstance(spec, str):
        return _Entry(spec)
    where = f"AGENTSITE_AGENTS[{name!r}]"
    if not isinstance(spec, Mapping):
        raise ImproperlyConfigured(
            f'{where} is neither a dotted path nor {{"agent": "dotted.path", ...}}: {spec!r}'
        )
    problems = [f"unknown key {key!r}" for key in spec if key not in ENTRY_KEYS]
    path = spec.get("agent")
    if not isinstance(path, str) or not path.strip():
        problems.append('"agent" must be the dotted path of an agents.Agent')
    overrides: dict[str, Any] = {}
    if "model" in spec:
        problems += [f'"model": {problem}' for problem in model_problems(spec["model"])]
        overrides["model"] = spec["model"]
    if "model_settings" in spec:
        given = spec["model_settings"]
        if isinstance(given, Mapping):
            problems += setting_problems(given, unknown_allowed=False)
            overrides["model_settings"] = dict(given)
        else:
            problems.append(f'"model_settings" must be an object, not {given!r}')
    if problems:
        raise ImproperlyConfigured(
            f"{where}: {'; '.join(problems)}. An entry is a dotted path, or "
            '{"agent": "dotted.path", "model": "a model name", "model_settings": {...}} '
            f"with model settings among {', '.join(SETTING_RULES)}."
        )
    return _Entry(str(path), overrides)


def entry_problem(name: str) -> str | None:
    """What is wrong with the entry `AGENTSITE_AGENTS[name]` itself, before any import."""
    try:
        _entry(name, _registry()[name])
    except ImproperlyConfigured as error:
        return str(error)
    return None


def model_problems(model: Any) -> list[str]:
    """What is wrong with `model` as the name of an agent's model."""
    if not isinstance(model, str):
        return [f"{model!r} is not a model name"]
    return [] if model.strip() else ["the model name is empty"]


def setting_problems(values: Mapping[str, Any], *, unknown_allowed: bool = True) -> list[str]:
    """What is wrong with these model settings, by `SETTING_RULES` (None is "not set")."""
    problems = []
    for key, value in values.items():
        rule = SETTING_RULES.get(key)
        if rule is None:
            if not unknown_allowed:
                problems.append(f"unknown model setting {key!r}")
            continue
        problem = None if value is None else rule(value)
        if problem:
            problems.append(f"{key}: {problem}")
    return problems


def agent_problems(agent: Agent[Any]) -> list[str]:
    """What is wrong with the model and model settings of `agent` and of every agent reachable
    from it, as their code declares them or an entry applied them."""
    problems = []
    for current in walk(agent):
        said = f"agent {current.name!r}"
        if current.model is not None and not isinstance(current.model, Model):
            problems += [f"{said}: model {p}" for p in model_problems(current.model)]
        declared = {f.name: getattr(current.model_settings, f.name) for f in fields(ModelSettings)}
        problems += [f"{said}: {p}" for p in setting_problems(declared)]
    return problems


def _sync(registry: Mapping[str, Any]) -> None:
    """Apply every entry's model and settings to its agent, and undo those of entries that
    changed or went since (as tests change AGENTSITE_AGENTS)."""
    wanted = {name: spec for name, spec in registry.items() if not isinstance(spec, str)}
    if wanted == _synced:
        return
    with _lock:
        for applied in list(_applied.values()):
            if wanted.get(applied.name) != applied.spec:
                _restore(applied)
        for name, spec in wanted.items():
            entry = _entry(name, spec)
            _apply(name, spec, entry, _load(name, entry.path))
        _synced.clear()
        _synced.update(copy.deepcopy(wanted))


def _apply(name: str, spec: Mapping[str, Any], entry: _Entry, agent: Agent[Any]) -> None:
    applied = _applied.get(id(agent))
    if applied is not None:
        if applied.overrides != entry.overrides:
            raise _conflict(agent, applied.name, name)
        return
    overrides = entry.overrides
    # `clone` gives a new model the SDK's implicit settings for it (GPT-5's reasoning, say)
    # when the code declared none of its own.
    shaped = agent.clone(model=overrides["model"]) if "model" in overrides else agent
    _applied[id(agent)] = _Applied(
        name=name,
        spec=copy.deepcopy(dict(spec)),
        overrides=copy.deepcopy(overrides),
        agent=agent,
        code_model=agent.model,
        code_settings=agent.model_settings,
    )
    agent.model = shaped.model
    agent.model_settings = shaped.model_settings.resolve(overrides.get("model_settings"))


def _restore(applied: _Applied) -> None:
    applied.agent.model = applied.code_model
    applied.agent.model_settings = applied.code_settings
    del _applied[id(applied.agent)]


def _conflict(agent: Agent[Any], first: str, second: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(
        f"AGENTSITE_AGENTS[{first!r}] and AGENTSITE_AGENTS[{second!r}] register the same agent "
        f"({agent.name!r}) with different models or settings; an agent answers with one, "
        "wherever it answers: register it once, or give both entries the same."
    )


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
    # Each run talks to MCP servers of its own (engine/mcp.py), never to the agent's.
    mcp.install(walk(agent))
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


def fingerprint(agent: Agent[Any], mcp_tools: Mapping[str, Any] | None = None) -> str:
    """A hash of what a saved run depends on: the agent graph, not its wording.

    It covers every agent reachable through handoffs and agents used as tools, their tools'
    names, JSON schemas and approval settings, the MCP servers each uses, and the tools those
    of them that the run opened listed (`mcp_tools`, from `engine.mcp.listing`). Instructions
    and models are left out: changing a prompt must not strand the runs that wait for a
    reviewer, while changing a tool's schema or whether it needs approval must.
    """
    graph: dict[str, Any] = {current.name: _describe(current) for current in walk(agent)}
    if mcp_tools:
        # Under a key no agent has: an agent's name is never empty.
        graph[""] = {"mcp_tools": dict(mcp_tools)}
    canonical = json.dumps(graph, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


# On a `needs_approval` that wraps the tool's own (`engine.policies.Gate`): that own setting,
# which is what the fingerprint takes, so a saved run still matches its agent.
OWN_APPROVAL_SETTING = "own_needs_approval"


def _approval_setting(value: Any) -> Any:
    value = getattr(value, OWN_APPROVAL_SETTING, value)
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
    described: dict[str, Any] = {
        "tools": sorted(tools, key=lambda t: t["name"]),
        "handoffs": handoffs,
    }
    if agent.mcp_servers:  # only then: the fingerprints of runs saved before stay the same
        described["mcp_servers"] = mcp.server_keys(agent)
    return described
