"""The reviewers' half of each kind of call (`approvals/kinds.py`): each kind of tool a paused
call can be for (a function, a local or hosted MCP server's tool, a shell command, a file patch)
is shown readably wherever a request is, offers only the controls the engine takes for it, and
is decided through the views and the API like any other."""

from __future__ import annotations

import asyncio
import json
import shlex
import typing
from typing import Any

import pytest
from agents import Agent, ApplyPatchTool
from agents.testing import ScriptedModel, assistant_message
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from api.models import ApiToken, Scope
from api.schemas import ToolKindName
from approvals import explain, kinds
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, ToolKind
from conversations.rendering import call_for, plain_call
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.approvals.test_views import XSS
from tests.engine import test_mcp
from tests.factories import make_conversation, make_request, make_reviewer, make_run, make_user

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
ESCAPED_XSS = "&lt;script&gt;alert(1)&lt;/script&gt;"

SHELL = {
    "commands": ["ls -la", f"echo {XSS}", "rm -rf build"],
    "timeout_ms": 60000,
    "max_output_length": 4096,
}
LOCAL_ARGV = ["grep", "-r", "it's here", "src dir"]
LOCAL_SHELL = {
    "type": "exec",
    "command": LOCAL_ARGV,
    "env": {"LANG": "C", "TOKEN": "<b>x</b>"},
    "working_directory": "/srv/app",
    "timeout_ms": 1500,
}
UPDATE = {
    "type": "update_file",
    "path": "src/app.py",
    "diff": f"@@ -1,3 +1,4 @@\n import os\n-old = 1\n+new = 2\n+# {XSS}\n context = 3\n",
}
CREATE = {"type": "create_file", "path": "src/new.py", "diff": "+print('hi')\n+x = 1\n"}
DELETE = {"type": "delete_file", "path": "src/old.py"}


def text(response: Any) -> str:
    return str(response.content.decode())


def row_of(html: str, request: ApprovalRequest) -> str:
    """The inbox row of `request`: from its <li> to the next row (rows hold lists of their
    own, so not to the first </li>)."""
    start = html.index(f'<li id="request-{request.pk}"')
    end = html.find('<li id="request-', start + 1)
    return html[start : end if end != -1 else len(html)]


@pytest.fixture
def each_kind() -> dict[str, ApprovalRequest]:
    """One pending request of each kind, each of its own waiting run, asked by bob."""
    bob = make_user(username="bob")

    def request(**kwargs: Any) -> ApprovalRequest:
        return make_request(run=make_run(owner=bob), **kwargs)

    return {
        "function": request(),
        # An MCP server's tool that shares its name with one of the agent's function tools:
        # nothing of the function tool (description, risk, edits) may be lent to it.
        "mcp": request(
            tool_name="cancel_order",
            kind=ToolKind.MCP,
            server="warehouse",
            arguments={"sku": "grinder", "quantity": 5},
        ),
        "hosted": request(
            tool_name="ask_question",
            kind=ToolKind.HOSTED_MCP,
            server="deepwiki",
            arguments={"repoName": "openai/openai-agents-python", "question": XSS},
        ),
        "shell": request(tool_name="shell", kind=ToolKind.SHELL, arguments=SHELL),
        "local_shell": request(tool_name="local_shell", kind=ToolKind.SHELL, arguments=LOCAL_SHELL),
        "patch": request(tool_name="apply_patch", kind=ToolKind.APPLY_PATCH, arguments=UPDATE),
        "create": request(tool_name="apply_patch", kind=ToolKind.APPLY_PATCH, arguments=CREATE),
        "delete": request(tool_name="apply_patch", kind=ToolKind.APPLY_PATCH, arguments=DELETE),
    }


# --- the inbox ------------------------------------------------------------------------------


def test_the_inbox_shows_each_kind_readably_and_escaped(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    html = text(client.get(reverse("inbox")))
    assert XSS not in html

    mcp = row_of(html, each_kind["mcp"])
    assert ">cancel_order</a>" in mcp
    assert '<span class="tool-server" data-server="warehouse"> · MCP server warehouse</span>' in mcp
    assert 'data-summary="cancel_order · MCP server warehouse, asked by bob"' in mcp
    assert "&quot;sku&quot;: &quot;grinder&quot;" in mcp  # its own arguments, raw JSON too
    # Not the function tool's description, nor its facts' words.
    assert "cancel an order" not in mcp.lower()

    hosted = row_of(html, each_kind["hosted"])
    assert " · hosted MCP server deepwiki</span>" in hosted
    assert ESCAPED_XSS in hosted

    shell = row_of(html, each_kind["shell"])
    assert 'data-kind="shell">Shell command</span>' in shell
    assert (
        '<span class="shell-command">ls -la</span>\n'
        f'<span class="shell-command">echo {ESCAPED_XSS}</span>\n'
        '<span class="shell-command">rm -rf build</span>'
    ) in shell
    assert "<dt>Timeout</dt><dd>60 s</dd>" in shell
    assert "<dt>Output limit</dt><dd>4,096 characters</dd>" in shell

    local = row_of(html, each_kind["local_shell"])
    line = shlex.join(LOCAL_ARGV)
    assert line == "grep -r 'it'\"'\"'s here' 'src dir'"
    assert f'<span class="shell-command">{escape(line)}</span>' in local
    assert "<dt>Working directory</dt><dd><code>/srv/app</code></dd>" in local
    assert "<dt>Timeout</dt><dd>1,500 ms</dd>" in local
    assert "<li><code>LANG=C</code></li>" in local
    assert "<li><code>TOKEN=&lt;b&gt;x&lt;/b&gt;</code></li>" in local

    patch = row_of(html, each_kind["patch"])
    assert 'data-kind="apply_patch">File patch</span>' in patch
    assert (
        '<span class="patch-op patch-op-update">Update</span> the file '
        '<code class="patch-path">src/app.py</code>'
    ) in patch
    assert '<tr class="diff-line diff-hunk">' in patch
    assert (
        '<tr class="diff-line diff-del"><td class="diff-num">2</td><td class="diff-num"></td>'
        '<td class="diff-sign">-</td><td class="diff-text">old = 1</td></tr>'
    ) in patch
    assert (
        '<tr class="diff-line diff-add"><td class="diff-num"></td><td class="diff-num">2</td>'
        '<td class="diff-sign">+</td><td class="diff-text">new = 2</td></tr>'
    ) in patch
    assert f'<td class="diff-text"># {ESCAPED_XSS}</td>' in patch
    assert '<tr class="diff-line diff-context"><td class="diff-num">3</td>' in patch
    assert "Raw arguments (JSON)" in patch

    create = row_of(html, each_kind["create"])
    assert '<span class="patch-op patch-op-create">Create</span>' in create
    assert '<td class="diff-num"></td><td class="diff-num">2</td><td class="diff-sign">+</td>' in (
        create
    )

    delete = row_of(html, each_kind["delete"])
    assert "Delete the file <code>src/old.py</code>" in delete
    assert "<table" not in delete


def test_edit_and_answer_as_the_tool_are_offered_only_where_the_engine_takes_them(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    html = text(client.get(reverse("inbox")))
    function = row_of(html, each_kind["function"])
    # The function tool's row has both: what the others lack is missing for a reason.
    assert "Edit, then approve" in function and "Respond as the tool" in function
    for name, request in each_kind.items():
        if name == "function":
            continue
        row = row_of(html, request)
        assert "Edit, then approve" not in row, name
        assert ("Respond as the tool" in row) is (name != "hosted"), name
        assert (f'name="response" id="row-response-{request.pk}"' in row) is (name != "hosted")

    for name, request in each_kind.items():
        page = text(client.get(reverse("inbox_request", args=[request.pk])))
        assert ("Edit the arguments, then approve" in page) is (name == "function"), name
        assert (f'id="response-{request.pk}"' in page) is (name != "hosted"), name
        assert ("cannot be answered as the tool" in page) is (name == "hosted"), name


# --- one request ----------------------------------------------------------------------------


def test_the_request_page_shows_the_server_the_commands_and_the_whole_diff(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    mcp = text(client.get(reverse("inbox_request", args=[each_kind["mcp"].pk])))
    assert "<title>cancel_order · MCP server warehouse · Inbox · agentsite</title>" in mcp
    assert (
        '<h2 class="tool">cancel_order<span class="tool-server" data-server="warehouse"> · '
        "MCP server warehouse</span></h2>"
    ) in mcp
    assert "risk: high · not declared" in mcp  # not the function tool's "irreversible"

    hosted = text(client.get(reverse("inbox_request", args=[each_kind["hosted"].pk])))
    assert "ask_question · hosted MCP server deepwiki · Inbox" in hosted
    assert XSS not in hosted and ESCAPED_XSS in hosted

    shell = text(client.get(reverse("inbox_request", args=[each_kind["shell"].pk])))
    assert "<h3>Commands</h3>" in shell
    assert '<pre class="shell shell-full" aria-label="Commands, one per line">' in shell
    assert XSS not in shell and f"echo {ESCAPED_XSS}" in shell
    assert '<details class="raw-arguments">' in shell

    local = text(client.get(reverse("inbox_request", args=[each_kind["local_shell"].pk])))
    assert "<h3>Command</h3>" in local

    # A long diff: the request page shows all of it, the row its first lines.
    long_diff = "@@ -1,30 +1,30 @@\n" + "".join(f"-a{n}\n+b{n}\n" for n in range(30))
    long = make_request(
        tool_name="apply_patch",
        kind=ToolKind.APPLY_PATCH,
        arguments={"type": "update_file", "path": "big.txt", "diff": long_diff},
    )
    page = text(client.get(reverse("inbox_request", args=[long.pk])))
    assert "<h3>Patch</h3>" in page
    assert (
        '<h4 class="patch-head"><span class="patch-op patch-op-update">Update</span> the file '
        '<code class="patch-path">big.txt</code>'
    ) in page
    assert page.count('<tr class="diff-line diff-add">') == 30
    assert page.count('<tr class="diff-line diff-del">') == 30
    assert '<span class="count-add" title="Lines added">+30</span>' in page
    assert '<td class="diff-num"></td><td class="diff-num">30</td>' in page
    row = row_of(text(client.get(reverse("inbox"))), long)
    assert row.count('<tr class="diff-line') == kinds.PREVIEW_LINES
    assert "49 more lines: <a href=" in row

    delete = text(client.get(reverse("inbox_request", args=[each_kind["delete"].pk])))
    assert "Delete the file <code>src/old.py</code>" in delete


def test_bulk_confirmation_and_history_show_the_server_and_the_call(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    ids = [each_kind[name].pk for name in ("mcp", "shell", "patch")]
    confirm = text(client.post(reverse("inbox_bulk_decide"), {"action": "reject", "ids": ids}))
    assert "Reject 3 requests?" in confirm
    assert " · MCP server warehouse</span>" in confirm
    assert '<span class="shell-command">rm -rf build</span>' in confirm
    assert '<tr class="diff-line diff-add">' in confirm
    assert XSS not in confirm

    for name in ("mcp", "hosted", "shell", "patch", "delete"):
        decision = runs.Decision.approve() if name != "shell" else runs.Decision.reject("no")
        runs.decide(each_kind[name], rita, decision)
    history = text(client.get(reverse("inbox_history")))
    assert (
        "cancel_order(sku=&quot;grinder&quot;, quantity=5)</a>"
        '<span class="tool-server" data-server="warehouse"> · MCP server warehouse</span>'
    ) in history
    # A long call is cut to fit; its server never is. (Its arguments in the order stored:
    # PostgreSQL's jsonb keeps its own.)
    assert "ask_question(repoName=&quot;openai/" in history or (
        "ask_question(question=&quot;&lt;script&gt;" in history
    )
    assert (
        '…</a><span class="tool-server" data-server="deepwiki"> · hosted MCP server deepwiki'
        in history
    )
    assert f'<span class="shell-command">echo {ESCAPED_XSS}</span>' in history
    assert "apply_patch: update src/app.py" in history
    assert "apply_patch: delete src/old.py" in history
    assert XSS not in history
    # Filtering by tool still finds an MCP tool's calls by its name.
    filtered = text(client.get(reverse("inbox_history"), {"tool": "ask_question"}))
    assert "hosted MCP server deepwiki" in filtered and "apply_patch:" not in filtered
    inbox = text(client.get(reverse("inbox"), {"tool": "local_shell"}))
    assert f'id="request-{each_kind["local_shell"].pk}"' in inbox
    assert f'id="request-{each_kind["function"].pk}"' not in inbox


def test_the_inbox_history_and_api_filter_by_kind_and_by_server(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    def listed(html: str) -> set[str]:
        shown = {f'id="request-{request.pk}"': name for name, request in each_kind.items()}
        return {name for marker, name in shown.items() if marker in html}

    html = text(client.get(reverse("inbox")))
    assert '<option value="">All kinds</option>' in html
    assert '<option value="hosted_mcp">Hosted MCP tool</option>' in html
    assert '<option value="other">' not in html  # only the kinds there are
    assert '<option value="warehouse">warehouse</option>' in html
    assert '<option value="deepwiki">deepwiki</option>' in html

    shells = text(client.get(reverse("inbox"), {"kind": "shell"}))
    assert listed(shells) == {"shell", "local_shell"}
    assert '<option value="shell" selected>Shell command</option>' in shells
    assert 'hx-get="/inbox/rows/?kind=shell"' in shells
    assert listed(text(client.get(reverse("inbox"), {"server": "warehouse"}))) == {"mcp"}
    rows = text(client.get(reverse("inbox_rows"), {"kind": "hosted_mcp", "server": "deepwiki"}))
    assert listed(rows) == {"hosted"}
    assert (
        listed(text(client.get(reverse("inbox"), {"kind": "mcp", "server": "deepwiki"}))) == set()
    )
    refused = client.get(reverse("inbox"), {"kind": "<b>x</b>"})
    assert refused.status_code == 400 and "kind:" in text(refused)
    assert "<b>x</b>" not in text(refused)

    secret = ApiToken.issue(rita, "filters", Scope.READ)[1]
    by_kind = api(client, secret, "/requests?kind=apply_patch").json()["items"]
    assert {item["id"] for item in by_kind} == {
        each_kind[name].pk for name in ("patch", "create", "delete")
    }
    by_server = api(client, secret, "/requests?server=warehouse").json()["items"]
    assert [item["id"] for item in by_server] == [each_kind["mcp"].pk]
    assert api(client, secret, "/requests?kind=teleport").status_code == 422

    for name in ("mcp", "hosted", "shell"):
        runs.decide(each_kind[name], rita, runs.Decision.approve())
    history = text(client.get(reverse("inbox_history"), {"server": "deepwiki"}))
    assert "hosted MCP server deepwiki" in history and "MCP server warehouse" not in history
    history = text(client.get(reverse("inbox_history"), {"kind": "shell"}))
    assert '<span class="shell-command">ls -la</span>' in history
    assert "· hosted MCP server deepwiki" not in history


# --- deciding -------------------------------------------------------------------------------


def test_each_kind_is_approved_or_rejected_through_the_views(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    for name, request in each_kind.items():
        approve = name not in ("shell", "delete")
        data = {"action": "approve" if approve else "reject", "seen_hash": request.arguments_hash}
        response = client.post(reverse("inbox_decide", args=[request.pk]), data, follow=True)
        assert response.status_code == 200, name
        request.refresh_from_db()
        assert request.status == (ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED)
        decision = ApprovalDecision.objects.get(request=request)
        assert (decision.approved, decision.reviewer) == (approve, rita), name
    shown = text(response)  # the last one: the delete, rejected
    assert "Rejected apply_patch: delete src/old.py." in shown


def test_answering_a_hosted_mcp_call_as_the_tool_is_refused_with_its_reason(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    hosted = each_kind["hosted"]
    data = {"action": "respond", "seen_hash": hosted.arguments_hash, "response": "42"}
    url = reverse("inbox_decide", args=[hosted.pk])

    plain = client.post(url, data, follow=True)
    assert plain.status_code == 200
    assert plain.redirect_chain == [(reverse("inbox_request", args=[hosted.pk]), 302)]
    assert "A hosted MCP server runs its tools itself" in text(plain)

    in_row = client.post(url, data, HTTP_HX_TARGET=f"request-{hosted.pk}", **HTMX)
    assert in_row.status_code == 200
    assert "A hosted MCP server runs its tools itself" in text(in_row)
    hosted.refresh_from_db()
    assert hosted.status == ApprovalStatus.PENDING
    assert not ApprovalDecision.objects.filter(request=hosted).exists()

    # A local MCP server's tool may be answered: the SDK never calls the server then.
    mcp = each_kind["mcp"]
    data = {"action": "respond", "seen_hash": mcp.arguments_hash, "response": "Restocked."}
    client.post(reverse("inbox_decide", args=[mcp.pk]), data)
    mcp.refresh_from_db()
    assert mcp.status == ApprovalStatus.RESPONDED


def test_edited_arguments_are_refused_for_an_mcp_tool_named_like_a_function_tool(
    client: Client, rita: Any, each_kind: dict[str, ApprovalRequest]
) -> None:
    mcp = each_kind["mcp"]
    data = {
        "action": "approve_edited",
        "seen_hash": mcp.arguments_hash,
        "edit-order_id": "43",
    }
    response = client.post(reverse("inbox_decide", args=[mcp.pk]), data)
    assert response.status_code == 400
    assert "The arguments of this call cannot be edited." in text(response)
    mcp.refresh_from_db()
    assert mcp.status == ApprovalStatus.PENDING


# --- the JSON API ---------------------------------------------------------------------------


def api(client: Client, secret: str, path: str, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {secret}"}
    if body is None:
        return client.get(f"/api/v1{path}", headers=headers)
    return client.post(
        f"/api/v1{path}", json.dumps(body), content_type="application/json", headers=headers
    )


def test_the_api_gives_kind_and_server_and_decides_each_kind(
    client: Client, each_kind: dict[str, ApprovalRequest]
) -> None:
    rita = make_reviewer()
    secret = ApiToken.issue(rita, "kinds", Scope.DECIDE)[1]
    listed = {item["id"]: item for item in api(client, secret, "/requests").json()["items"]}
    assert (listed[each_kind["mcp"].pk]["kind"], listed[each_kind["mcp"].pk]["server"]) == (
        "mcp",
        "warehouse",
    )
    assert listed[each_kind["hosted"].pk]["server"] == "deepwiki"
    assert listed[each_kind["shell"].pk]["call"] == f"shell: ls -la; echo {XSS}; rm -rf build"
    assert {item["kind"] for item in listed.values()} == {
        "function",
        "mcp",
        "hosted_mcp",
        "shell",
        "apply_patch",
    }

    hosted = api(client, secret, f"/requests/{each_kind['hosted'].pk}").json()
    assert (hosted["kind"], hosted["server"]) == ("hosted_mcp", "deepwiki")
    assert hosted["allowed"]["answerable"] is False and hosted["allowed"]["editable"] is False
    mcp = api(client, secret, f"/requests/{each_kind['mcp'].pk}").json()
    # Not the schema of the agent's function tool of the same name.
    assert mcp["arguments_schema"] == {} and mcp["allowed"]["editable"] is False
    assert mcp["allowed"]["answerable"] is True
    function = api(client, secret, f"/requests/{each_kind['function'].pk}").json()
    assert function["arguments_schema"]["properties"] and function["allowed"]["editable"]
    run = api(client, secret, f"/runs/{each_kind['hosted'].run_id}").json()
    assert run["requests"][0]["kind"] == "hosted_mcp"
    assert run["requests"][0]["server"] == "deepwiki"

    refused = api(
        client,
        secret,
        f"/requests/{each_kind['hosted'].pk}/decide",
        {"action": "respond", "seen_hash": each_kind["hosted"].arguments_hash, "response": "x"},
    )
    assert refused.status_code == 422
    assert refused.json()["code"] == "invalid_decision"
    assert "hosted MCP server runs its tools itself" in refused.json()["detail"]

    # An MCP tool named like the agent's function tool: no edit, whatever the engine's lookup
    # by name would find.
    edited = api(
        client,
        secret,
        f"/requests/{each_kind['mcp'].pk}/decide",
        {
            "action": "approve_edited",
            "seen_hash": each_kind["mcp"].arguments_hash,
            "arguments": {"order_id": 43},
        },
    )
    assert edited.status_code == 422
    assert edited.json() == {
        "detail": "The arguments of cancel_order, a tool of the MCP server “warehouse”, can be "
        "edited only once the deployment declares the tool (review(server, tool_name=...)): "
        "approve or reject the call as it is.",
        "code": "invalid_decision",
    }
    assert each_kind["mcp"].decisions.count() == 0

    for name, action in (
        ("hosted", "approve"),
        ("shell", "reject"),
        ("patch", "approve"),
        ("mcp", "approve"),
    ):
        request = each_kind[name]
        done = api(
            client,
            secret,
            f"/requests/{request.pk}/decide",
            {"action": action, "seen_hash": request.arguments_hash},
        )
        assert done.status_code == 200, (name, done.json())
        assert done.json()["kind"] == ("approved" if action == "approve" else "rejected")


def test_the_api_names_every_kind_the_model_has() -> None:
    assert set(typing.get_args(ToolKindName)) == set(ToolKind.values)


# --- the chat's words -----------------------------------------------------------------------


def test_the_chat_says_what_each_kind_would_do_in_plain_words() -> None:
    assert plain_call("", "shell", SHELL, kind="shell") == (
        f"run 3 commands: ls -la; echo {XSS}; rm -rf build"
    )
    assert plain_call("", "shell", {"commands": ["ls -la"]}, kind="shell") == (
        "run a command: ls -la"
    )
    assert plain_call("", "local_shell", LOCAL_SHELL, kind="shell") == (
        f"run a command: {shlex.join(LOCAL_ARGV)}"
    )
    assert plain_call("", "apply_patch", UPDATE, kind="apply_patch") == (
        "change the file src/app.py"
    )
    assert plain_call("", "apply_patch", CREATE, kind="apply_patch") == "create the file src/new.py"
    assert plain_call("", "apply_patch", DELETE, kind="apply_patch") == "delete the file src/old.py"
    # An MCP tool: never the description of a function tool of the same name.
    assert plain_call(
        "Cancel an order.", "restock", {"sku": "grinder"}, kind="mcp", server="warehouse"
    ) == ("use restock on warehouse (sku grinder)")
    assert plain_call("", "ask_question", {}, kind="hosted_mcp", server="deepwiki") == (
        "use ask_question on deepwiki"
    )
    # Arguments of a shape the kind does not have read as a function's.
    assert plain_call("", "shell", {"cmd": "x"}, kind="shell") == "shell (cmd x)"


def test_the_chat_shows_the_waiting_words_escaped(each_kind: dict[str, ApprovalRequest]) -> None:
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice, agent_name="support")
    make_request(
        run=make_run(conversation=conversation),
        tool_name="shell",
        kind=ToolKind.SHELL,
        arguments={"commands": [f"echo {XSS}"]},
    )
    assert (
        call_for(each_kind["mcp"]).plain
        == "use cancel_order on warehouse (sku grinder, quantity 5)"
    )
    client = Client()
    client.force_login(alice)
    page = client.get(f"/chats/{conversation.session_id}/").text
    assert f"A person will confirm: run a command: echo {ESCAPED_XSS}</p>" in page
    assert XSS not in page


# --- real pauses: what the engine records is what the pages read ----------------------------


class Editor:
    """An apply_patch editor that records what it was asked to do."""

    def __init__(self) -> None:
        self.done: list[tuple[str, str, str | None]] = []

    def create_file(self, operation: Any) -> str:
        self.done.append(("create", operation.path, operation.diff))
        return "created"

    def update_file(self, operation: Any) -> str:
        self.done.append(("update", operation.path, operation.diff))
        return "updated"

    def delete_file(self, operation: Any) -> str:
        self.done.append(("delete", operation.path, operation.diff))
        return "deleted"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_paused_patch_is_shown_as_a_diff_and_applied_once_approved(settings: Any) -> None:
    editor = Editor()
    call = {
        "type": "apply_patch_call",
        "call_id": "call_patch_1",
        "operation": {"type": "update_file", "path": "src/app.py", "diff": UPDATE["diff"]},
    }
    model = ScriptedModel([[call], [assistant_message("Patched.")]])
    tool = ApplyPatchTool(editor=editor, needs_approval=True)
    name = scripted.install(settings, Agent(name="Coder", model=model, tools=[tool]))
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice, agent_name=name)
    run = runs.start_run(conversation, "fix it", alice)
    asyncio.run(runs.execute(run.pk))
    request = ApprovalRequest.objects.get(run=run)
    assert (request.kind, request.tool_name, request.server) == ("apply_patch", "apply_patch", "")

    rita = make_reviewer()
    client = Client()
    client.force_login(rita)
    row = row_of(text(client.get(reverse("inbox"))), request)
    assert '<td class="diff-sign">-</td><td class="diff-text">old = 1</td>' in row
    assert f'<td class="diff-text"># {ESCAPED_XSS}</td>' in row
    assert "Edit, then approve" not in row
    waiting = Client()
    waiting.force_login(alice)
    chat = waiting.get(f"/chats/{conversation.session_id}/").text
    assert "A person will confirm: change the file src/app.py</p>" in chat

    data = {"action": "approve", "seen_hash": request.arguments_hash}
    client.post(reverse("inbox_decide", args=[request.pk]), data)
    asyncio.run(runs.resume(run.pk))

    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert editor.done == [("update", "src/app.py", UPDATE["diff"])]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_paused_mcp_call_names_its_server_and_a_rejection_never_reaches_it(
    settings: Any, tmp_path: Any
) -> None:
    data = tmp_path / "warehouse.json"
    agent = test_mcp.warehouse_agent(
        test_mcp.stdio_warehouse(data), test_mcp.RESTOCK, test_mcp.DONE
    )
    run = test_mcp.executed(test_mcp.start(settings, agent))
    request = ApprovalRequest.objects.get(run=run)
    rita = make_reviewer()
    client = Client()
    client.force_login(rita)

    row = row_of(text(client.get(reverse("inbox"))), request)
    assert ">restock</a>" in row and " · MCP server warehouse</span>" in row
    assert "Edit, then approve" not in row and "Respond as the tool" in row
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert "<title>restock · MCP server warehouse · Inbox · agentsite</title>" in page
    assert call_for(request).plain == "use restock on warehouse (sku grinder, quantity 5)"

    data_ = {"action": "reject", "seen_hash": request.arguments_hash, "message": "Not today."}
    response = client.post(reverse("inbox_decide", args=[request.pk]), data_, follow=True)
    assert "Rejected restock(sku=&quot;grinder&quot;, quantity=5) · MCP server warehouse." in (
        text(response)
    )
    run = test_mcp.executed(run, "resume")
    assert run.status == RunStatus.COMPLETED, run.error
    assert test_mcp.restocks(data) == []


# --- reading shell calls and diffs ----------------------------------------------------------


def kinds_of(diff: str, operation: str = "update_file") -> list[tuple[str, str, Any, Any]]:
    return [(d.kind, d.text, d.old, d.new) for d in kinds.diff_lines(diff, operation)]


def test_a_diff_is_read_line_by_line_whatever_its_dialect() -> None:
    # A unified diff: its file headers, numbered hunks, a removed "-- comment" line (SQL),
    # the no-newline marker, CRLF line ends.
    unified = (
        "--- a/q.sql\r\n+++ b/q.sql\r\n@@ -3,2 +3,2 @@\r\n--- old comment\r\n"
        "+-- new comment\r\n select 1;\r\n\\ No newline at end of file\r\n"
    )
    assert kinds_of(unified) == [
        ("meta", "--- a/q.sql", None, None),
        ("meta", "+++ b/q.sql", None, None),
        ("hunk", "@@ -3,2 +3,2 @@", None, None),
        ("del", "-- old comment", 3, None),
        ("add", "-- new comment", None, 3),
        ("context", "select 1;", 4, 4),
        ("meta", "\\ No newline at end of file", None, None),
    ]
    # The SDK's V4A: anchors say no line number, so none is shown; "*** End of File".
    v4a = "@@ def total():\n-    return a\n+    return a + b\n\n*** End of File\n"
    assert kinds_of(v4a) == [
        ("hunk", "@@ def total():", None, None),
        ("del", "    return a", None, None),
        ("add", "    return a + b", None, None),
        ("context", "", None, None),
        ("meta", "*** End of File", None, None),
    ]
    # Without a hunk, "--- x" then "+++ y" in a new file are lines of it, not headers.
    assert kinds_of("+--- x\n++++ y\n", "create_file") == [
        ("add", "--- x", None, 1),
        ("add", "+++ y", None, 2),
    ]
    view = kinds.patch_view({"type": "update_file", "path": "a", "diff": v4a})
    assert view is not None and not view.numbered and (view.added, view.removed) == (1, 1)
    assert kinds.patch_view({"type": "rename_file", "path": "a"}) is None
    assert kinds.patch_view({"type": "update_file", "path": ""}) is None
    moved = kinds.patch_view({"type": "update_file", "path": "a.py", "move_to": "b.py"})
    assert moved is not None and moved.move_to == "b.py" and moved.lines == []


def test_a_huge_diff_is_cut_on_the_page_and_counted_whole() -> None:
    diff = "".join(f"+line {n}\n" for n in range(kinds.MAX_DIFF_LINES + 5))
    view = kinds.patch_view({"type": "create_file", "path": "big", "diff": diff})
    assert view is not None
    assert len(view.lines) == kinds.MAX_DIFF_LINES and view.cut == 5
    assert view.added == kinds.MAX_DIFF_LINES + 5
    assert view.beyond_preview == kinds.MAX_DIFF_LINES + 5 - kinds.PREVIEW_LINES


def test_a_shell_call_is_read_from_either_action() -> None:
    view = kinds.shell_view(SHELL)
    assert view is not None and view.commands == SHELL["commands"] and not view.local
    assert (view.timeout, view.output_limit) == ("60 s", "4,096 characters")
    local = kinds.shell_view(LOCAL_SHELL)
    assert local is not None and local.local
    assert local.commands == ["grep -r 'it'\"'\"'s here' 'src dir'"]
    assert local.env == [("LANG", "C"), ("TOKEN", "<b>x</b>")]
    assert (local.working_directory, local.timeout) == ("/srv/app", "1,500 ms")
    malformed_actions: list[Any] = [
        {"commands": "ls"},
        {"command": []},
        {"commands": [1]},
        ["ls"],
        None,
    ]
    for malformed in malformed_actions:
        assert kinds.shell_view(malformed) is None, malformed
    # Shown as the generic arguments then, never lost.
    odd = make_request(tool_name="shell", kind=ToolKind.SHELL, arguments={"commands": "ls"})
    explained = explain.for_request(odd)
    assert explained.shell is None and explained.arguments[0].value == "ls"
    assert odd.call_display() == 'shell(commands="ls")'
    multi = make_request(
        tool_name="shell", kind=ToolKind.SHELL, arguments={"commands": ["cat <<EOF\nhi\nEOF"]}
    )
    assert multi.call_display() == "shell: cat <<EOF ↵ hi ↵ EOF"


def test_the_engine_refuses_an_edit_of_a_call_that_is_not_a_function_tools(
    submitted: list,
) -> None:
    """An MCP tool named like one of the agent's function tools must not take that tool's
    schema and edit form (`runs.edits.edit_fields` looked the tool up by name alone)."""
    request = make_request(kind=ToolKind.MCP, server="orders", tool_name="cancel_order")
    before = request.arguments

    with pytest.raises(runs.InvalidDecision, match="edited only once the deployment declares"):
        runs.decide(request, make_reviewer(), runs.Decision.edit({"order_id": 7}))
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING and request.arguments == before


def test_the_facts_of_a_function_tool_are_not_given_for_an_mcp_tool_of_its_name() -> None:
    from engine import facts

    request = make_request(kind=ToolKind.MCP, server="orders", tool_name="cancel_order")
    assert facts.hook_for(request) is None
    request.kind = ToolKind.FUNCTION
    assert facts.hook_for(request) is not None  # the demo's cancel_order declares one
