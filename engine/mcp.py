"""MCP servers of registered agents, connected per run.

An agent in the registry may list MCP servers (`Agent(mcp_servers=[MCPServerStdio(...)])`, or
`MCPServerSse` / `MCPServerStreamableHttp`). The SDK leaves connecting them to the caller,
and a registered agent is one object shared by every run of the process, on whatever event
loop each run has (a worker's job may get a fresh one). So agentsite never connects the
server the agent was given: `install` puts a `RunServer` in its place, and each run talks to
a copy of its own, opened in the run's `scope`:

- a copy connects the first time the run needs it (the SDK lists an agent's tools when that
  agent answers), so a run that never reaches an agent with servers starts none; a resume
  connects the servers its pause had listed before anything else (`connect`), to hold their
  tools against the pause's fingerprint;
- it connects and later cleans up in a task of its own (`_Worker`), as the MCP client needs
  both in one task while the SDK calls the server from others;
- its tools as listed on connecting are what the fingerprint takes (`listing`), and what
  every turn of the run is given (the copy answers the SDK from that listing): a server
  whose tools changed since a pause fails the resume closed;
- a server that fails to start fails the run with the reason (`ServerUnavailable`);
- the scope cleans every copy up when the run ends, however it ends.

Outside a scope (a script that runs a registered agent itself) a `RunServer` is the server
it stands for, which that script connects as the SDK documents.

Outside a run, the approval policies' forms need the names of the servers' tools (a rule about
a tool no server lists matches no call): `tools_of` lists them on demand, each server in a
copy of its own as a run would, waiting at most `LIST_SECONDS`, and keeps what they listed for
`LISTED_FOR_SECONDS` (a server that did not answer is asked again after `UNLISTED_FOR_SECONDS`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from contextvars import ContextVar
from typing import Any

from agents import Agent
from agents.mcp import MCPServer
from agents.tracing import FunctionSpanData, SpanError, get_current_span
from mcp.types import TextContent

from conversations import items

logger = logging.getLogger(__name__)

CONNECT_SECONDS = 20.0
CLEANUP_SECONDS = 5.0


class ServerUnavailable(Exception):
    """An MCP server of the run's agent could not be started, or did not list its tools."""


class RunServer(MCPServer):
    """Stands in for an MCP server on a registered agent (see the module): inside a run's
    scope every call goes to that run's own copy of `template`, connected on first use."""

    def __init__(self, template: MCPServer, key: str) -> None:
        # MCPServer.__init__ is not called: every setting is read from the copy (or the
        # template) through __getattr__, so the two never drift apart.
        self.template = template
        self.key = key

    def __getattr__(self, name: str) -> Any:
        if name in ("template", "key"):  # not set yet: copying, unpickling
            raise AttributeError(name)
        return getattr(self._current(), name)

    def __repr__(self) -> str:
        return f"RunServer({self.template!r})"

    def _current(self) -> MCPServer:
        scope = _scope.get()
        worker = scope.workers.get(self) if scope is not None else None
        return worker.instance if worker is not None else self.template

    async def _connected(self) -> MCPServer:
        scope = _scope.get()
        if scope is None:
            return self.template
        return await scope.open(self)

    @property
    def name(self) -> str:
        return str(self.template.name)

    @property
    def cached_tools(self) -> Any:
        return self._current().cached_tools

    async def connect(self) -> None:
        if _scope.get() is None:
            await self.template.connect()
        else:
            await self._connected()

    async def cleanup(self) -> None:
        # Inside a run its scope cleans its copy up, in the task that connected it.
        if _scope.get() is None:
            await self.template.cleanup()

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> Any:
        return await (await self._connected()).list_tools(run_context, agent)

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> Any:
        result = await (await self._connected()).call_tool(tool_name, arguments, meta)
        # `is_error` in mcp 2, `isError` before.
        if getattr(result, "is_error", None) or getattr(result, "isError", None):
            return _failed(result, self.name, tool_name)
        return result

    async def list_prompts(self) -> Any:
        return await (await self._connected()).list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await (await self._connected()).get_prompt(name, arguments)

    async def list_resources(self, cursor: str | None = None) -> Any:
        return await (await self._connected()).list_resources(cursor)

    async def list_resource_templates(self, cursor: str | None = None) -> Any:
        return await (await self._connected()).list_resource_templates(cursor)

    async def read_resource(self, uri: str) -> Any:
        return await (await self._connected()).read_resource(uri)


def _failed(result: Any, server: str, tool: str) -> Any:
    """A result the server flagged `isError`: the SDK reads only its content, so the model
    would take the failure for an answer and the trace would show a call that went well.
    Its text is marked as a failure (`items.TOOL_ERROR_PREFIX`, as the chat's note reads it)
    and the call's span (current: the SDK calls the server inside it) gets an error."""
    span = get_current_span()
    if span is not None and isinstance(span.span_data, FunctionSpanData):
        span.set_error(
            SpanError(message=MCP_ERROR, data={"server": server, "tool": tool, "isError": True})
        )
    content = list(getattr(result, "content", None) or [])
    for index, item in enumerate(content):
        if getattr(item, "type", None) == "text":
            text = str(item.text)
            if not text.startswith(items.TOOL_ERROR_PREFIX):
                content[index] = item.model_copy(update={"text": items.TOOL_ERROR_PREFIX + text})
            break
    else:
        content.insert(0, TextContent(type="text", text=items.TOOL_ERROR_PREFIX.rstrip(": ")))
    return result.model_copy(update={"content": content})


MCP_ERROR = "The MCP server reported an error (isError)"


def _fresh(template: MCPServer) -> MCPServer:
    """A copy of a never-connected server with connection machinery of its own: its settings
    are shared (read-only), its exit stack and locks are new."""
    fresh = copy.copy(template)
    for name, value in vars(template).items():
        if isinstance(value, AsyncExitStack):
            setattr(fresh, name, AsyncExitStack())
        elif isinstance(value, asyncio.Lock):
            setattr(fresh, name, asyncio.Lock())
    return fresh


def server_keys(agent: Agent[Any]) -> list[str]:
    """The keys of an agent's servers: "<agent>/<server>", and "#n" for a name given twice."""
    keys: list[str] = []
    for server in agent.mcp_servers:
        key = f"{agent.name}/{server.name}"
        n = sum(1 for k in keys if k == key or k.startswith(f"{key}#"))
        keys.append(f"{key}#{n + 1}" if n else key)
    return keys


def install(agents: Iterable[Agent[Any]]) -> None:
    """Put a `RunServer` in place of each MCP server of these agents (once: a server that is
    one already stays)."""
    for agent in agents:
        if not agent.mcp_servers:
            continue
        keys = server_keys(agent)
        agent.mcp_servers = [
            server if isinstance(server, RunServer) else RunServer(server, key)
            for server, key in zip(agent.mcp_servers, keys, strict=True)
        ]


def run_servers(agents: Iterable[Agent[Any]]) -> dict[str, RunServer]:
    """The agents' servers by key (those `install` put in place)."""
    return {
        server.key: server
        for agent in agents
        for server in agent.mcp_servers
        if isinstance(server, RunServer)
    }


class _Worker:
    """One run's copy of a server, connected, listed and cleaned up in a task of its own."""

    def __init__(self, server: RunServer) -> None:
        self.server = server
        self.instance = _fresh(server.template)
        self.tools: list[Any] = []
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done = asyncio.Event()
        self.task = loop.create_task(self._run(), name=f"mcp server {server.key}")

    async def _run(self) -> None:
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                await self.instance.connect()
                self.tools = list(await self.instance.list_tools())
            # The SDK lists the tools again at each turn of the agent: this copy answers from
            # the listing just made (the SDK's own cache), so every turn of the run is given
            # the tools its fingerprint holds, without a round trip each. A run that needs a
            # fresh list asks for it with `invalidate_tools_cache()`, as the SDK documents.
            if hasattr(self.instance, "cache_tools_list"):
                self.instance.cache_tools_list = True
        except BaseException as exc:
            # Never left half open: the SDK's connect cleans up what it started.
            self.ready.set_exception(
                ServerUnavailable(
                    f"The MCP server {self.server.name!r} could not be started ({_reason(exc)})."
                )
            )
            if not isinstance(exc, Exception):
                raise
            return
        self.ready.set_result(None)
        await self.done.wait()
        try:
            async with asyncio.timeout(CLEANUP_SECONDS):
                await self.instance.cleanup()
        except Exception as exc:
            logger.warning("MCP server %r: its cleanup failed: %s", self.server.name, _reason(exc))

    async def close(self) -> None:
        self.done.set()
        if not self.ready.done():
            self.task.cancel()
        with suppress(Exception, asyncio.CancelledError):
            await self.task
        if self.ready.done() and not self.ready.cancelled():
            self.ready.exception()  # retrieved: a failure was reported where it was awaited


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"it did not answer within {CONNECT_SECONDS:g} s"
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _reason(exc.exceptions[0])
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Scope:
    def __init__(self) -> None:
        self.workers: dict[RunServer, _Worker] = {}

    def listed(self) -> Iterator[tuple[RunServer, _Worker]]:
        """The servers that connected and listed their tools, with their workers."""
        for server, worker in self.workers.items():
            ready = worker.ready
            if ready.done() and not ready.cancelled() and ready.exception() is None:
                yield server, worker

    async def open(self, server: RunServer) -> MCPServer:
        worker = self.workers.get(server)
        if worker is None:
            worker = self.workers[server] = _Worker(server)
        await asyncio.shield(worker.ready)
        return worker.instance

    async def close(self) -> None:
        workers, self.workers = list(self.workers.values()), {}
        for worker in workers:
            await worker.close()


_scope: ContextVar[_Scope | None] = ContextVar("agentsite_mcp_scope", default=None)


@asynccontextmanager
async def scope() -> AsyncIterator[None]:
    """A run's MCP servers: copies of its agents' servers, opened as the run needs them and
    all cleaned up when it leaves. Nested scopes share the outer one."""
    if _scope.get() is not None:
        yield
        return
    opened = _Scope()
    token = _scope.set(opened)
    try:
        yield
    finally:
        _scope.reset(token)
        await asyncio.shield(opened.close())


async def connect(agents: Iterable[Agent[Any]], keys: Iterable[str]) -> None:
    """Open, in the current scope, the servers with these keys among the agents' servers.

    Raises:
        ServerUnavailable: one of them cannot be started, or is no longer among the agents'
            servers.
    """
    servers = run_servers(agents)
    for key in keys:
        server = servers.get(key)
        if server is None:
            raise ServerUnavailable(f"The MCP server {key!r} is no longer one of the agent's.")
        await server._connected()


def listing(*, schemas: bool = True) -> dict[str, list[dict[str, Any]]]:
    """The tools each server opened in this scope listed when it connected, by server key: what
    a fingerprint holds of them (names, input schemas, approval settings). Not `schemas`: as
    pauses before 2026-12-07 were fingerprinted, when the input schemas were read under their
    old name (`inputSchema`) and were None under mcp 2 (`restoring` accepts either)."""
    scope = _scope.get()
    if scope is None:
        return {}
    listed: dict[str, list[dict[str, Any]]] = {}
    for server, worker in scope.listed():
        listed[server.key] = sorted(
            (
                {
                    "name": tool.name,
                    "schema": input_schema(tool) if schemas else None,
                    "needs_approval": _approval(worker.instance, tool),
                }
                for tool in worker.tools
            ),
            key=lambda tool: str(tool["name"]),
        )
    return listed


def input_schema(tool: Any) -> Any:
    """A listed tool's input schema: `input_schema` in mcp 2, `inputSchema` before it."""
    schema = getattr(tool, "input_schema", None)
    return schema if schema is not None else getattr(tool, "inputSchema", None)


def descriptions() -> dict[str, dict[str, dict[str, Any]]]:
    """What each server opened in this scope said of its tools when it listed them, by server
    name and tool name: the description and the input schema, for the reviewer who decides
    a call of one (a request keeps them, `ApprovalRequest.tool_sheet`). Not part of the
    fingerprint: wording may change between a pause and its resume."""
    scope = _scope.get()
    if scope is None:
        return {}
    described: dict[str, dict[str, dict[str, Any]]] = {}
    for _, worker in scope.listed():
        tools = described.setdefault(str(worker.instance.name), {})
        for tool in worker.tools:
            schema = input_schema(tool)
            tools[str(tool.name)] = {
                "description": str(getattr(tool, "description", None) or ""),
                "schema": schema if isinstance(schema, dict) else {},
            }
    return described


def _approval(server: MCPServer, tool: Any) -> Any:
    setting = server._get_needs_approval_for_tool(tool, None)
    if isinstance(setting, bool):
        return setting
    policy = getattr(server, "_needs_approval_policy", setting)
    return f"{getattr(policy, '__module__', '?')}.{getattr(policy, '__qualname__', repr(policy))}"


# --- listing outside a run -----------------------------------------------------------------------

# How long a page waits for the servers to list their tools; how long what they listed is kept,
# and how long a server that did not answer is left alone before it is asked again.
LIST_SECONDS = 10.0
LISTED_FOR_SECONDS = 300.0
UNLISTED_FOR_SECONDS = 30.0

# Server key -> (when it was asked, what it listed or None).
_listings: dict[str, tuple[float, list[Any] | None]] = {}
_listings_lock = threading.Lock()


def tools_of(servers: Sequence[RunServer]) -> dict[str, list[Any] | None]:
    """The tools each of `servers` lists (the mcp package's `Tool`s), by key: as listed within
    the last `LISTED_FOR_SECONDS`, else listed now (`list_now`). None for a server that did not
    list them in time."""
    now = time.monotonic()
    found: dict[str, list[Any] | None] = {}
    stale: list[RunServer] = []
    with _listings_lock:
        for server in servers:
            kept = _listings.get(server.key)
            if kept is not None:
                keep = LISTED_FOR_SECONDS if kept[1] is not None else UNLISTED_FOR_SECONDS
                if now - kept[0] < keep:
                    found[server.key] = kept[1]
                    continue
            stale.append(server)
    if stale:
        listed = list_now(stale)
        with _listings_lock:
            for key, tools in listed.items():
                _listings[key] = (now, tools)
        found.update(listed)
    return found


def forget_listings() -> None:
    """Forget what the servers listed (the registry's `reset`: its agents may change)."""
    with _listings_lock:
        _listings.clear()


def list_now(
    servers: Sequence[RunServer], timeout: float | None = None
) -> dict[str, list[Any] | None]:
    """The tools each of `servers` lists now, by key; None for one that did not list them
    within `timeout` seconds (`LIST_SECONDS`) or could not be started (logged, non-fatal).

    The servers are opened in a scope of their own, on an event loop of their own in a thread
    (the caller may be a sync view, or on a loop of its own), and cleaned up there after this
    returns: the caller waits for the listing, not for the cleanup."""
    wait = LIST_SECONDS if timeout is None else timeout
    found: dict[str, list[Any] | None] = {server.key: None for server in servers}
    listed = threading.Event()

    async def one(server: RunServer) -> None:
        try:
            async with asyncio.timeout(wait):
                await server._connected()
            opened = _scope.get()
            worker = opened.workers.get(server) if opened is not None else None
            found[server.key] = list(worker.tools) if worker is not None else None
        except Exception as exc:
            logger.warning(
                "[non-fatal] MCP server %r did not list its tools: %s", server.name, _reason(exc)
            )

    async def work() -> None:
        async with scope():
            try:
                await asyncio.gather(*(one(server) for server in servers))
            finally:
                listed.set()

    def run() -> None:
        try:
            asyncio.run(work())
        except Exception:
            logger.exception("[non-fatal] Listing the tools of MCP servers failed.")
        finally:
            listed.set()

    threading.Thread(target=run, name="mcp-listing", daemon=True).start()
    listed.wait(wait + 1.0)
    return dict(found)
