"""An agent's MCP servers (`engine/mcp.py`), started per run, their approvals in the inbox.

The servers are real: the demo's warehouse (`demo/warehouse.py`, the `mcp` package's server)
over stdio, started by the run as a process of its own, and over streamable HTTP on
127.0.0.1. The server's data file logs every call it served: what "ran once" is counted by
the server, not by us. Each run and each resume executes on a fresh event loop
(`asyncio.run`), as a worker's job may.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent
from agents.mcp import MCPServer, MCPServerStdio, MCPServerStreamableHttp
from agents.testing import ScriptedModel, assistant_message, function_call
from django.conf import settings as django_settings
from django.test import Client
from django.utils.html import escape
from opentelemetry.trace import StatusCode

from approvals import explain
from approvals.models import ApprovalRequest, ToolKind
from engine import mcp, registry, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.conftest import Traces
from tests.factories import make_conversation, make_reviewer, make_user
from tests.services import free_port
from tracing import otlp
from tracing.models import Span, Trace, TraceStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry"),
]

APPROVE_RESTOCK = {"always": {"tool_names": ["restock"]}}


def warehouse_env(data: Path, **extra: str) -> dict[str, str]:
    return {"AGENTSITE_WAREHOUSE_DATA": str(data), "PATH": os.environ.get("PATH", ""), **extra}


def stdio_warehouse(data: Path, **options: Any) -> MCPServerStdio:
    return MCPServerStdio(
        params={
            "command": sys.executable,
            "args": ["-m", "demo.warehouse"],
            "env": warehouse_env(data),
            "cwd": str(django_settings.BASE_DIR),
        },
        name="warehouse",
        require_approval=APPROVE_RESTOCK,
        client_session_timeout_seconds=20,
        **options,
    )


def warehouse_calls(data: Path) -> list[dict[str, Any]]:
    if not data.exists():
        return []
    return list(json.loads(data.read_text())["calls"])


def restocks(data: Path) -> list[dict[str, Any]]:
    return [call for call in warehouse_calls(data) if call["tool"] == "restock"]


def warehouse_agent(server: MCPServer, *turns: list[Any]) -> Agent[Any]:
    return Agent(name="Warehouse", model=ScriptedModel(list(turns)), mcp_servers=[server])


RESTOCK = [function_call("restock", {"sku": "grinder", "quantity": 5}, call_id="call_restock_1")]
DONE = [assistant_message("Ordered 5 grinders.")]


def start(settings: Any, agent: Agent[Any], text: str = "restock 5 grinders") -> AgentRun:
    return scripted.start(settings, agent, text)


executed = scripted.executed


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "warehouse.json"


def test_a_local_servers_write_tool_pauses_and_runs_once_after_approval(
    settings: Any, submitted: list, data: Path
) -> None:
    agent = warehouse_agent(stdio_warehouse(data), RESTOCK, DONE)
    run = executed(start(settings, agent))

    assert run.status == RunStatus.WAITING, run.error
    request = ApprovalRequest.objects.get(run=run)
    assert (request.kind, request.server, request.tool_name) == (
        ToolKind.MCP,
        "warehouse",
        "restock",
    )
    assert request.arguments == {"sku": "grinder", "quantity": 5}
    assert restocks(data) == []  # the server was asked nothing yet
    assert run.state["$stateBinding"]["mcp"] == ["Warehouse/warehouse"]

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    assert submitted[-1] == ("resume", run.pk)
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Ordered 5 grinders."
    assert restocks(data) == [{"tool": "restock", "arguments": {"sku": "grinder", "quantity": 5}}]
    assert json.loads(data.read_text())["stock"]["grinder"] == 17


def test_a_run_lists_a_servers_tools_once_and_its_model_is_given_what_was_fingerprinted(
    settings: Any, submitted: list, data: Path, monkeypatch: Any
) -> None:
    """The tools listed on connecting are the pause's fingerprint; the SDK asks again at each
    turn of the agent. Each run's copy of the server answers those from that one listing: a
    round trip saved per turn, and no turn sees tools other than the ones fingerprinted."""
    listings: list[str] = []
    listing_page = MCPServerStdio._list_tools_page

    async def counted(self: Any, session: Any, cursor: Any) -> Any:
        listings.append(self.name)
        return await listing_page(self, session, cursor)

    monkeypatch.setattr(MCPServerStdio, "_list_tools_page", counted)
    looked = [function_call("stock_level", {"sku": "grinder"}, call_id="call_look_1")]
    agent = warehouse_agent(stdio_warehouse(data), looked, RESTOCK, DONE)
    run = executed(start(settings, agent))
    assert run.status == RunStatus.WAITING, run.error  # two turns of the agent
    assert listings == ["warehouse"]

    runs.decide(ApprovalRequest.objects.get(run=run), make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    assert listings == ["warehouse", "warehouse"]  # the resume's copy: once more, once


@pytest.mark.parametrize(
    "newer",
    [
        # One tool more (the same command, a newer version of it).
        "AGENTSITE_WAREHOUSE_AUDIT",
        # The same names, restock's input schema one argument more: under mcp 2 the schemas
        # were read under their old name and were None, so this resume went ahead (seen).
        "AGENTSITE_WAREHOUSE_REASONS",
    ],
)
def test_a_server_whose_tools_changed_since_the_pause_fails_the_resume_closed(
    settings: Any, submitted: list, data: Path, newer: str
) -> None:
    server = stdio_warehouse(data)
    run = executed(start(settings, warehouse_agent(server, RESTOCK, DONE)))
    assert run.status == RunStatus.WAITING, run.error
    runs.decide(ApprovalRequest.objects.get(run=run), make_reviewer(), runs.Decision.approve())

    assert server.params.env is not None
    server.params.env[newer] = "1"
    run = executed(run, "resume")

    assert run.status == RunStatus.FAILED
    assert "MCP servers" in run.error and "nothing was executed" in run.error
    assert restocks(data) == []


def test_a_pause_fingerprinted_without_the_schemas_still_resumes(
    settings: Any, submitted: list, data: Path
) -> None:
    """A run paused before the input schemas were read (its fingerprint has them as None)
    resumes after the upgrade; its tools are still held to their names."""
    server = stdio_warehouse(data)
    agent = warehouse_agent(server, RESTOCK, DONE)
    run = executed(start(settings, agent))
    assert run.status == RunStatus.WAITING, run.error
    listed = {
        "Warehouse/warehouse": [
            {"name": name, "schema": None, "needs_approval": name == "restock"}
            for name in ("restock", "stock_level")
        ]
    }
    AgentRun.objects.filter(pk=run.pk).update(
        agent_fingerprint=registry.fingerprint(registry.get_agent(run.agent_name), listed)
    )
    runs.decide(ApprovalRequest.objects.get(run=run), make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    assert restocks(data) == [{"tool": "restock", "arguments": {"sku": "grinder", "quantity": 5}}]


def test_a_server_that_cannot_start_fails_the_run_with_its_reason(
    settings: Any, submitted: list, data: Path
) -> None:
    broken = MCPServerStdio(
        params={"command": sys.executable, "args": ["-c", "import sys; sys.exit(3)"]},
        name="warehouse",
        client_session_timeout_seconds=5,
    )
    run = executed(start(settings, warehouse_agent(broken, RESTOCK, DONE)))

    assert run.status == RunStatus.FAILED
    assert run.error.startswith("The MCP server 'warehouse' could not be started"), run.error
    assert run.error_detail["kind"] == "tool_server"
    assert not ApprovalRequest.objects.filter(run=run).exists()


def test_a_run_that_never_needs_the_server_starts_none(
    settings: Any, submitted: list, data: Path
) -> None:
    """The server of a handoff target starts only when that agent answers."""
    never = stdio_warehouse(data)
    target = Agent(name="Warehouse", model=ScriptedModel([DONE]), mcp_servers=[never])
    front = Agent(name="Front", model=ScriptedModel([[assistant_message("Hello")]]))
    front.handoffs.append(target)
    run = executed(start(settings, front, "hello"))

    assert run.status == RunStatus.COMPLETED, run.error
    assert not data.exists()  # the warehouse never started (its first call writes the file)
    assert isinstance(target.mcp_servers[0], mcp.RunServer)


@pytest.fixture
def http_warehouse(data: Path, tmp_path: Path) -> Iterator[str]:
    """The warehouse over streamable HTTP, a process on 127.0.0.1, stopped by its id."""
    port = free_port()
    log = (tmp_path / "warehouse-http.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "demo.warehouse", "--http", str(port)],
        cwd=django_settings.BASE_DIR,
        env=warehouse_env(data),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with __import__("socket").create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert process.poll() is None, (tmp_path / "warehouse-http.log").read_text()
                assert time.monotonic() < deadline, "the warehouse did not listen"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def test_over_streamable_http_the_call_pauses_and_runs_once(
    settings: Any, submitted: list, data: Path, http_warehouse: str
) -> None:
    server = MCPServerStreamableHttp(
        params={"url": http_warehouse},
        name="warehouse",
        require_approval=APPROVE_RESTOCK,
        client_session_timeout_seconds=20,
    )
    run = executed(start(settings, warehouse_agent(server, RESTOCK, DONE)))
    assert run.status == RunStatus.WAITING, run.error
    request = ApprovalRequest.objects.get(run=run)
    assert (request.kind, request.server) == (ToolKind.MCP, "warehouse")

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert len(restocks(data)) == 1
    (installed,) = registry.get_agent("scripted").mcp_servers
    assert isinstance(installed, mcp.RunServer) and installed.template is server


def test_the_demos_warehouse_agent_restocks_through_its_mcp_server_after_approval(
    submitted: list, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo as shipped: the support desk hands a warehouse question to Warehouse, whose
    restock (an MCP tool of the stdio warehouse server) waits for a reviewer."""
    from demo.agents import warehouse_server

    assert warehouse_server.params.env is not None
    monkeypatch.setitem(warehouse_server.params.env, "AGENTSITE_WAREHOUSE_DATA", str(data))
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice, agent_name="support")

    first = executed(runs.start_run(conversation, "I have a warehouse question", alice))
    assert first.status == RunStatus.COMPLETED, first.error
    assert "restock 5 grinders" in first.final_output
    conversation.refresh_from_db()
    assert conversation.current_agent == "support/Warehouse"

    run = executed(runs.start_run(conversation, "please restock 5 grinders", alice))
    assert run.status == RunStatus.WAITING, run.error
    request = ApprovalRequest.objects.get(run=run)
    assert (request.kind, request.server, request.tool_name, request.arguments) == (
        ToolKind.MCP,
        "warehouse",
        "restock",
        {"sku": "grinder", "quantity": 5},
    )

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    assert "Ordered 5 × grinder" in run.final_output
    assert len(restocks(data)) == 1


def warehouse_processes(data: Path) -> list[int]:
    """The processes serving this test's warehouse (its data file is in their environment)."""
    found = []
    marker = f"AGENTSITE_WAREHOUSE_DATA={data}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def test_runs_at_once_each_get_a_server_of_their_own_and_leave_none_running(
    settings: Any, submitted: list, data: Path
) -> None:
    server = stdio_warehouse(data)
    model = ScriptedModel(
        [
            [function_call("restock", {"sku": "mug", "quantity": 1}, call_id="call_a")],
            [function_call("restock", {"sku": "kettle", "quantity": 2}, call_id="call_b")],
        ]
    )
    scripted.install(settings, Agent(name="Warehouse", model=model, mcp_servers=[server]))
    alice = make_user(username="alice")
    first, second = (
        runs.start_run(make_conversation(owner=alice, agent_name="scripted"), text, alice)
        for text in ("restock a mug", "restock 2 kettles")
    )
    seen: list[list[int]] = []

    async def both() -> None:
        async def watch() -> None:
            while True:
                seen.append(warehouse_processes(data))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(runs.execute(first.pk), runs.execute(second.pk))
        watcher.cancel()

    asyncio.run(both())

    for run in (first, second):
        run.refresh_from_db()
        assert run.status == RunStatus.WAITING, run.error
    assert max(len(pids) for pids in seen) == 2  # one server process for each run
    assert warehouse_processes(data) == []  # both cleaned up with their runs
    requests = ApprovalRequest.objects.filter(run__in=[first, second]).order_by("pk")
    assert sorted(r.arguments["sku"] for r in requests) == ["kettle", "mug"]


def test_always_approves_the_same_mcp_tool_for_the_rest_of_the_run(
    settings: Any, submitted: list, data: Path
) -> None:
    again = [function_call("restock", {"sku": "mug", "quantity": 3}, call_id="call_restock_2")]
    agent = warehouse_agent(stdio_warehouse(data), RESTOCK, again, DONE)
    run = executed(start(settings, agent))
    runs.decide(
        ApprovalRequest.objects.get(run=run), make_reviewer(), runs.Decision.approve(always=True)
    )
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert ApprovalRequest.objects.filter(run=run).count() == 1  # the second asked nobody
    assert [call["arguments"]["sku"] for call in restocks(data)] == ["grinder", "mug"]


# --- a server from PyPI: its tools explained to reviewers ---------------------------------


def pypi_time_server() -> MCPServerStdio:
    """`mcp-server-time` as published on PyPI (a dev dependency), over stdio, every call of
    it asking a person."""
    return MCPServerStdio(
        params={
            "command": sys.executable,
            "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        },
        name="time",
        require_approval="always",
        client_session_timeout_seconds=20,
    )


CONVERT = [
    function_call(
        "convert_time",
        {"source_timezone": "Europe/Paris", "time": "09:30", "target_timezone": "Asia/Tokyo"},
        call_id="call_convert_1",
    )
]


def test_a_pypi_servers_call_shows_the_servers_description_and_labelled_arguments(
    settings: Any, submitted: list
) -> None:
    agent = Agent(
        name="Clock",
        model=ScriptedModel([CONVERT, [assistant_message("16:30 in Tokyo.")]]),
        mcp_servers=[pypi_time_server()],
    )
    run = executed(start(settings, agent, "9:30 in Paris is what in Tokyo?"))
    assert run.status == RunStatus.WAITING, run.error
    request = ApprovalRequest.objects.get(run=run)
    assert (request.kind, request.server, request.tool_name) == (
        ToolKind.MCP,
        "time",
        "convert_time",
    )
    # What the server listed, kept with the request.
    assert request.tool_sheet["description"] == "Convert time between timezones"
    properties = request.tool_sheet["schema"]["properties"]
    # In the server's order, which PostgreSQL's jsonb does not keep in the schema itself.
    assert request.tool_sheet["order"] == ["source_timezone", "time", "target_timezone"]

    reviewer = make_reviewer()
    client = Client()
    client.force_login(reviewer)
    page = client.get(f"/inbox/{request.pk}/").content.decode()
    assert "Convert time between timezones" in page
    # Each argument labelled by its schema's title, its description as the hint (escaped).
    for name, label in (
        ("source_timezone", "Source Timezone"),
        ("time", "Time"),
        ("target_timezone", "Target Timezone"),
    ):
        hint = escape(properties[name]["description"])
        assert f'>{label} <span class="hint">{hint}</span>' in page, label
    shown = [
        page.index(f">{label} <span") for label in ("Source Timezone", "Time", "Target Timezone")
    ]
    assert shown == sorted(shown)  # the server's order
    assert "IANA timezone name" in properties["source_timezone"]["description"]
    assert "Asia/Tokyo" in page and "09:30" in page

    runs.decide(request, reviewer, runs.Decision.approve())
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "16:30 in Tokyo."


def test_a_pypi_servers_error_is_a_failed_call_in_the_chat_and_the_trace(
    settings: Any, submitted: list, traces: Traces
) -> None:
    """`isError`: mcp-server-time refuses a timezone that does not exist. The SDK passes the
    content on as an ordinary answer; here the call reads as failed everywhere."""
    wrong = [
        function_call(
            "convert_time",
            {"source_timezone": "Mars/Olympus", "time": "09:30", "target_timezone": "UTC"},
            call_id="call_convert_2",
        )
    ]
    model = ScriptedModel([wrong, [assistant_message("Mars has no timezone I know.")]])
    agent = Agent(name="Clock", model=model, mcp_servers=[pypi_time_server()])
    run = executed(start(settings, agent, "9:30 on Mars?"))
    assert run.status == RunStatus.WAITING, run.error
    request = ApprovalRequest.objects.get(run=run)
    runs.decide(request, make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error

    # The model was told it failed (the server's words after the mark).
    assert model.last_call is not None
    [output] = [
        item for item in model.last_call.input if item.get("type") == "function_call_output"
    ]
    said = json.dumps(output["output"])
    assert "Tool error: " in said and "Mars/Olympus" in said
    # The chat's note says so.
    owner = run.conversation.owner
    client = Client()
    client.force_login(owner)
    page = client.get(f"/chats/{run.conversation.session_id}/").content.decode()
    assert '<strong class="failed">failed:</strong>' in page
    # The call's span is an error, and so the trace.
    traces.flush()
    [span] = Span.objects.filter(trace_id=run.trace_id, span_type="function", error__isnull=False)
    # Its output as the server's text, not a Python repr of the SDK's structure.
    assert span.span_data["output"].startswith("Tool error: Error executing tool convert_time")
    assert span.error["message"] == mcp.MCP_ERROR
    assert span.error["data"] == {"server": "time", "tool": "convert_time", "isError": True}
    assert Trace.objects.get(trace_id=run.trace_id).status == TraceStatus.ERROR
    # As OpenTelemetry has it: an error span.
    [exported] = otlp.readable_spans([span])
    assert exported.status.status_code is StatusCode.ERROR
    assert exported.name == "execute_tool convert_time"


def test_a_deployment_declares_risk_facts_and_edits_for_a_servers_tool(
    settings: Any, submitted: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_server_reviews", {})
    server = pypi_time_server()
    model = ScriptedModel([CONVERT, [assistant_message("Done.")]])
    agent = Agent(name="Clock", model=model, mcp_servers=[server])
    asked: list[dict[str, Any]] = []

    def facts(calls: Any) -> list[list[Any]]:
        asked.extend(arguments for arguments, _user in calls)
        return [[("Meeting", "the Tokyo stand-up", True)] for _ in calls]

    registry.review(server, tool_name="convert_time", risk="low", facts=facts)
    run = executed(start(settings, agent, "9:30 in Paris is what in Tokyo?"))
    request = ApprovalRequest.objects.get(run=run)
    explain.attach([request], with_facts=True)
    explained = explain.for_request(request)
    assert (explained.risk, explained.risk_declared) == ("low", True)
    assert [(f.label, f.value, f.warning) for f in explained.facts or []] == [
        ("Meeting", "the Tokyo stand-up", True)
    ]
    assert asked == [request.arguments]
    assert explained.editable
    # An edit is checked against the schema the server listed...
    reviewer = make_reviewer()
    with pytest.raises(runs.InvalidDecision, match="do not fit the tool"):
        runs.decide(request, reviewer, runs.Decision.edit({"time": 930}))
    # ...and the server runs the edited call, once.
    edited = {"source_timezone": "Europe/Paris", "time": "10:30", "target_timezone": "Asia/Tokyo"}
    runs.decide(request, reviewer, runs.Decision.edit(edited))
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    assert model.last_call is not None
    [output] = [i for i in model.last_call.input if i.get("type") == "function_call_output"]
    said = json.dumps(output["output"])
    assert "T10:30:00+01:00" in said and "T18:30:00+09:00" in said  # 10:30 in Paris, in Tokyo


def test_a_servers_tool_declared_nothing_is_not_edited(settings: Any, submitted: list) -> None:
    agent = Agent(
        name="Clock",
        model=ScriptedModel([CONVERT, [assistant_message("Done.")]]),
        mcp_servers=[pypi_time_server()],
    )
    run = executed(start(settings, agent, "9:30 in Paris is what in Tokyo?"))
    request = ApprovalRequest.objects.get(run=run)
    explained = explain.for_request(request)
    assert (explained.risk, explained.risk_declared, explained.editable) == ("high", False, False)
    with pytest.raises(runs.InvalidDecision, match="can be edited only once the deployment"):
        runs.decide(request, make_reviewer(), runs.Decision.edit({"time": "10:30"}))
