"""Every kind of call through the engine (`engine/calls.py`): hosted MCP approvals, shell
commands and file patches pause into approval requests like function tools, are decided by our
rows, and resume through the SDK exactly once (each job on an event loop of its own)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from agents import Agent, ApplyPatchTool, HostedMCPTool, ShellTool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from django.test import Client
from openai.types.responses import (
    Response,
    ResponseApplyPatchToolCall,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionShellToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseUsage,
)
from openai.types.responses.response_output_item import McpApprovalRequest
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from approvals.models import ApprovalRequest, ApprovalStatus, ToolKind
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_reviewer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry"),
]


def start(settings: Any, agent: Agent[Any], text: str = "go") -> AgentRun:
    return scripted.start(settings, agent, text)


executed = scripted.executed


def streamed(*items: Any) -> ModelStep:
    """A model answer of these output items, as the Responses API streams it: the scripted
    model streams function calls and messages by itself, not shell calls or MCP approval
    requests."""

    def response(status: Any, output: list[Any]) -> Response:
        usage = ResponseUsage(
            input_tokens=10,
            output_tokens=5,
            total_tokens=15,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        )
        return Response(
            id="resp_scripted",
            created_at=0,
            model="scripted-model",
            object="response",
            output=output,
            tool_choice="none",
            tools=[],
            top_p=None,
            parallel_tool_calls=False,
            status=status,
            usage=usage,
        )

    events: list[Any] = [
        ResponseCreatedEvent(
            type="response.created", sequence_number=0, response=response("in_progress", [])
        )
    ]
    for index, item in enumerate(items):
        events.append(
            ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                sequence_number=len(events),
                output_index=index,
                item=item,
            )
        )
        events.append(
            ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                sequence_number=len(events),
                output_index=index,
                item=item,
            )
        )
    events.append(
        ResponseCompletedEvent(
            type="response.completed",
            sequence_number=len(events),
            response=response("completed", list(items)),
        )
    )
    return ModelStep.stream(events, output=list(items))


def pending(run: AgentRun) -> list[ApprovalRequest]:
    return list(ApprovalRequest.objects.of_pause(run, run.pause_count).order_by("pk"))


# --- hosted MCP --------------------------------------------------------------------------------


def hosted(label: str = "deepwiki") -> HostedMCPTool:
    return HostedMCPTool(
        tool_config={
            "type": "mcp",
            "server_label": label,
            "server_url": f"https://{label}.example/mcp",
            "require_approval": "always",
        }
    )


def approval_request(n: int, name: str = "ask_question", label: str = "deepwiki") -> Any:
    return McpApprovalRequest(
        id=f"mcpr_{n}",
        type="mcp_approval_request",
        name=name,
        server_label=label,
        arguments='{"repo": "openai/openai-agents-python"}',
    )


def approval_responses(model: ScriptedModel) -> list[dict[str, Any]]:
    call = model.last_call
    assert call is not None
    return [
        dict(item)
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "mcp_approval_response"
    ]


def test_a_hosted_mcp_approval_is_decided_here_and_the_resumed_run_carries_it(
    settings: Any, submitted: list
) -> None:
    model = ScriptedModel([streamed(approval_request(1)), [assistant_message("The wiki says so.")]])
    agent = Agent(name="Researcher", model=model, tools=[hosted()])
    run = executed(start(settings, agent))

    assert run.status == RunStatus.WAITING, run.error
    (request,) = pending(run)
    assert (request.kind, request.server, request.tool_name) == (
        ToolKind.HOSTED_MCP,
        "deepwiki",
        "ask_question",
    )
    assert request.arguments == {"repo": "openai/openai-agents-python"}

    runs.decide(request, make_reviewer(), runs.Decision.reject("Not that repository"))
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    (response,) = approval_responses(model)
    assert response["approval_request_id"] == "mcpr_1"
    assert response["approve"] is False
    assert "Not that repository" in str(response.get("reason"))


def test_always_approves_the_same_hosted_server_and_tool_only(
    settings: Any, submitted: list
) -> None:
    model = ScriptedModel(
        [
            streamed(approval_request(1)),
            streamed(
                approval_request(2),  # the same server and tool: approved by "always"
                approval_request(3, name="read_wiki"),  # another tool
                approval_request(4, label="gitmcp"),  # another server
            ),
            [assistant_message("Done.")],
        ]
    )
    agent = Agent(name="Researcher", model=model, tools=[hosted(), hosted("gitmcp")])
    run = executed(start(settings, agent))
    (first,) = pending(run)
    rita = make_reviewer()
    runs.decide(first, rita, runs.Decision.approve(always=True))
    run = executed(run, "resume")

    assert run.status == RunStatus.WAITING, run.error
    second = pending(run)
    assert [(r.server, r.tool_name) for r in second] == [
        ("deepwiki", "read_wiki"),
        ("gitmcp", "ask_question"),
    ]
    responses = {r["approval_request_id"]: r["approve"] for r in approval_responses(model)}
    assert responses == {"mcpr_1": True}

    for request in second:
        runs.decide(request, rita, runs.Decision.approve())
    run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    responses = {r["approval_request_id"]: r["approve"] for r in approval_responses(model)}
    assert responses == {"mcpr_1": True, "mcpr_2": True, "mcpr_3": True, "mcpr_4": True}


def test_a_hosted_mcp_call_cannot_be_answered_as_the_tool(settings: Any, submitted: list) -> None:
    model = ScriptedModel([streamed(approval_request(1))])
    run = executed(start(settings, Agent(name="R", model=model, tools=[hosted()])))
    (request,) = pending(run)

    with pytest.raises(runs.InvalidDecision, match="cannot be answered as the tool"):
        runs.decide(request, make_reviewer(), runs.Decision.respond("42 stars"))
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING


# --- shell and apply_patch ---------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.patches: list[tuple[str, str]] = []

    def shell(self, request: Any) -> str:
        self.commands.append(list(request.data.action.commands))
        return "ran"

    def create_file(self, operation: Any) -> str:
        self.patches.append(("create", operation.path))
        return "created"

    def update_file(self, operation: Any) -> str:
        self.patches.append(("update", operation.path))
        return "updated"

    def delete_file(self, operation: Any) -> str:
        self.patches.append(("delete", operation.path))
        return "deleted"


def shell_call(commands: list[str], n: int = 1) -> ResponseFunctionShellToolCall:
    return ResponseFunctionShellToolCall.model_validate(
        {
            "id": f"sh_{n}",
            "call_id": f"call_shell_{n}",
            "type": "shell_call",
            "status": "completed",
            "action": {"commands": commands, "timeout_ms": 5000, "max_output_length": 2000},
        }
    )


def patch_call(path: str, diff: str, n: int = 1) -> ResponseApplyPatchToolCall:
    return ResponseApplyPatchToolCall.model_validate(
        {
            "id": f"ap_{n}",
            "call_id": f"call_patch_{n}",
            "type": "apply_patch_call",
            "status": "completed",
            "operation": {"type": "update_file", "path": path, "diff": diff},
        }
    )


def test_a_shell_call_shows_its_commands_and_a_rejection_runs_nothing(
    settings: Any, submitted: list
) -> None:
    recorder = Recorder()
    model = ScriptedModel(
        [streamed(shell_call(["ls -la", "rm -rf build"])), [assistant_message("I did not run it.")]]
    )
    tool = ShellTool(executor=recorder.shell, needs_approval=True)
    run = executed(start(settings, Agent(name="Ops", model=model, tools=[tool])))

    assert run.status == RunStatus.WAITING, run.error
    (request,) = pending(run)
    assert (request.kind, request.tool_name, request.server) == (ToolKind.SHELL, "shell", "")
    assert request.arguments == {
        "commands": ["ls -la", "rm -rf build"],
        "max_output_length": 2000,
        "timeout_ms": 5000,
    }

    runs.decide(request, make_reviewer(), runs.Decision.reject("Not on production"))
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert recorder.commands == []
    outputs = [
        item for item in (model.last_call.input if model.last_call else []) if "output" in item
    ]
    assert any("Not on production" in str(item["output"]) for item in outputs)


def test_an_approved_shell_call_runs_once(settings: Any, submitted: list) -> None:
    recorder = Recorder()
    model = ScriptedModel([streamed(shell_call(["date"])), [assistant_message("It ran.")]])
    tool = ShellTool(executor=recorder.shell, needs_approval=True)
    run = executed(start(settings, Agent(name="Ops", model=model, tools=[tool])))
    runs.decide(pending(run)[0], make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert recorder.commands == [["date"]]
    # The saved state is single-use: a second resume runs nothing.
    run = executed(run, "resume")
    assert recorder.commands == [["date"]]


def test_a_patch_pauses_with_its_diff_and_runs_once_when_approved(
    settings: Any, submitted: list
) -> None:
    recorder = Recorder()
    diff = "@@ -1 +1 @@\n-print('hi')\n+print('hello')\n"
    model = ScriptedModel([[patch_call("app.py", diff)], [assistant_message("Patched.")]])
    tool = ApplyPatchTool(editor=recorder, needs_approval=True)
    run = executed(start(settings, Agent(name="Coder", model=model, tools=[tool])))

    assert run.status == RunStatus.WAITING, run.error
    (request,) = pending(run)
    assert (request.kind, request.tool_name) == (ToolKind.APPLY_PATCH, "apply_patch")
    assert request.arguments == {"type": "update_file", "path": "app.py", "diff": diff}
    assert recorder.patches == []

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert recorder.patches == [("update", "app.py")]


def test_the_chat_shows_each_kind_of_call_with_what_answered_it(
    settings: Any, submitted: list
) -> None:
    """The shell command, the patch and the hosted MCP call of a conversation read as notes
    like a function call's, escaped (the chat showed none of them)."""
    recorder = Recorder()
    model = ScriptedModel(
        [
            streamed(shell_call(["echo '<b>hi</b>'"])),
            [patch_call("app.py", "@@ -1 +1 @@\n-a\n+b\n", n=2)],
            streamed(approval_request(3, name="ask_question")),
            [assistant_message("Done.")],
        ]
    )
    agent = Agent(
        name="Ops",
        model=model,
        tools=[
            ShellTool(executor=recorder.shell, needs_approval=True),
            ApplyPatchTool(editor=recorder, needs_approval=True),
            hosted(),
        ],
    )
    run = executed(start(settings, agent))
    for approve in (True, False, True):
        assert run.status == RunStatus.WAITING, run.error
        decision = runs.Decision.approve() if approve else runs.Decision.reject("Not today")
        runs.decide(pending(run)[0], make_reviewer(), decision)
        run = executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error

    client = Client()
    client.force_login(run.conversation.owner)
    page = client.get(f"/chats/{run.conversation.session_id}/").content.decode()
    notes = [
        " ".join(re.sub(r"<[^>]+>", " ", note).split())
        for note in re.findall(r'<div class="note note-tool"[^>]*>(.*?)</div>', page, re.S)
    ]

    # In plain words for her, with what a person did with each (the calls themselves are for
    # operators and reviewers).
    assert notes == [
        "Run a command: echo &#x27;&lt;b&gt;hi&lt;/b&gt;&#x27; → ran Approved by rita.",
        "Change the file app.py Not approved by rita; nothing was done. “Not today”",
        "Use ask_question on deepwiki (repo openai/openai-agents-python) → approved"
        " Approved by rita.",
    ]
    assert "<b>hi</b>" not in page


# --- an agent used as a tool, itself needing approval ----------------------------------------


def test_an_agent_used_as_a_tool_with_needs_approval_pauses_and_runs_once(
    settings: Any, submitted: list
) -> None:
    inner_model = ScriptedModel([[assistant_message("Refunds take 5 days.")]])
    researcher = Agent(name="Researcher", model=inner_model)
    outer_model = ScriptedModel(
        [
            [function_call("research", {"input": "refund delay"}, call_id="call_research_1")],
            [assistant_message("They take 5 days.")],
        ]
    )
    agent = Agent(
        name="Front",
        model=outer_model,
        tools=[
            researcher.as_tool(tool_name="research", tool_description="Ask", needs_approval=True)
        ],
    )
    run = executed(start(settings, agent))

    assert run.status == RunStatus.WAITING, run.error
    (request,) = pending(run)
    assert (request.kind, request.tool_name, request.arguments) == (
        ToolKind.FUNCTION,
        "research",
        {"input": "refund delay"},
    )
    assert inner_model.calls == ()  # the sub-agent has not run

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    run = executed(run, "resume")

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "They take 5 days."
    assert len(inner_model.calls) == 1
