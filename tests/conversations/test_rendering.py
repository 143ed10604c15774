"""Assistant Markdown is rendered, then sanitized: structure stays, anything active goes."""

from __future__ import annotations

import re

from conversations.items import call_display
from conversations.rendering import entries_for, render_markdown, review_lines


def test_it_keeps_bold_lists_code_blocks_and_tables() -> None:
    html = render_markdown(
        "**Order 7** has shipped:\n\n- headphones\n- a cable\n\n1. one\n2. two\n\n"
        "```python\nprint('<b>')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |"
    )
    assert "<strong>Order 7</strong>" in html
    assert "<ul>\n<li>headphones</li>" in html
    assert "<ol>" in html
    assert "<pre><code>print('&lt;b&gt;')\n</code></pre>" in html
    assert "<table>" in html and "<td>1</td>" in html


def test_it_aligns_table_columns_with_classes_not_inline_styles() -> None:
    html = render_markdown("| a | b | c |\n|:--|:-:|--:|\n| 1 | 2 | 3 |")
    assert '<th class="align-left">a</th>' in html
    assert '<td class="align-center">2</td>' in html
    assert '<td class="align-right">3</td>' in html
    assert "style=" not in html


def test_it_keeps_links_and_makes_them_safe_to_open() -> None:
    html = render_markdown("See [tracking](https://example.com/track?id=7) or <https://e.com>.")
    assert (
        '<a href="https://example.com/track?id=7" target="_blank" '
        'rel="noopener noreferrer nofollow">tracking</a>'
    ) in html
    assert 'href="https://e.com"' in html
    assert html.count('rel="noopener noreferrer nofollow"') == 2


def test_it_never_lets_a_script_through() -> None:
    html = render_markdown("Hi <script>alert(1)</script> and\n\n<script>\nalert(2)\n</script>")
    assert "<script" not in html
    assert "&lt;script&gt;" in html  # shown as the text the model wrote


def test_it_drops_event_handlers_and_raw_html() -> None:
    html = render_markdown(
        '<img src=x onerror="alert(1)"> <b onclick="x()">b</b> <iframe src="https://e.com">'
        '</iframe>\n\n<div style="position:fixed">overlay</div>'
    )
    assert "<img" not in html
    assert "<b " not in html and "<iframe" not in html and "<div" not in html
    # The tags are shown escaped, as text: nothing of them is live.
    assert "&lt;img" in html and "&lt;iframe" in html


def test_it_drops_javascript_and_data_links() -> None:
    for source in [
        "[click](javascript:alert(1))",
        "[click](JaVaScRiPt:alert(1))",
        "[click](  javascript:alert(1))",
        "[click](data:text/html;base64,PHNjcmlwdD4=)",
        "[click](vbscript:msgbox(1))",
        "<javascript:alert(1)>",
    ]:
        html = render_markdown(source)
        assert "href" not in html, source


def test_it_shows_no_images_so_no_url_is_fetched_without_a_click() -> None:
    html = render_markdown("![pixel](https://tracker.example/p.png?q=secret)")
    assert "<img" not in html
    assert 'rel="noopener noreferrer nofollow"' in html  # a plain link the user may follow


def test_it_cannot_pass_for_the_site_s_own_status_lines() -> None:
    html = render_markdown(
        '<p class="run-status run-waiting" id="composer">Waiting</p>\n\n'
        "`code` [link](https://e.com){.run-waiting}"
    )
    assert not re.search(r"<[a-z][^>]*\s(class|id|style)=", html)


def test_it_turns_session_items_into_messages_and_tool_notes() -> None:
    items = [
        {"role": "user", "content": "where is order 7"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "lookup_order",
            "arguments": '{"order_id": 7}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "Order 7 has   shipped."},
        {"type": "function_call", "call_id": "c2", "name": "transfer_to_billing", "arguments": ""},
        {"type": "function_call_output", "call_id": "c2", "output": '{"assistant": "Billing"}'},
        {"type": "reasoning", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It **shipped**."}],
        },
    ]
    entries = entries_for(items)
    assert [entry.kind for entry in entries] == ["user", "tool", "handoff", "assistant"]
    assert entries[1].text == "lookup_order(order_id=7)"
    assert entries[1].output == "Order 7 has shipped."
    assert entries[2].text == "Billing"
    assert entries[3].html == "<p>It <strong>shipped</strong>.</p>\n"


def test_a_call_reads_as_a_reviewer_reads_it() -> None:
    assert call_display("cancel_order", '{"order_id": 42}') == "cancel_order(order_id=42)"
    assert call_display("send_email", {"to": "a@b.c"}) == 'send_email(to="a@b.c")'


def test_a_call_reads_the_same_whatever_the_model_sent() -> None:
    assert call_display("list_orders", "") == "list_orders()"  # blank: no arguments, as the SDK
    assert call_display("list_orders", "{}") == "list_orders()"
    assert call_display("lookup_order", "not json") == 'lookup_order("not json")'
    assert call_display("add", "[1, 2]") == "add([1, 2])"


def test_a_reviewer_reads_each_call_and_output_on_its_own_line() -> None:
    items = [
        {"role": "user", "content": "cancel order 42"},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "lookup_order", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x" * 700},
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "First part."},
                {"type": "output_text", "text": "Second part."},
            ],
        },
        {"type": "function_call_output", "call_id": "c0", "output": {"ok": True}},
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "cancel_order",
            "arguments": '{"order_id": 42}',
        },
    ]
    lines = review_lines(items, "c2")
    assert [line["kind"] for line in lines] == [
        "user", "call", "output", "assistant", "output", "call",
    ]  # fmt: skip
    assert lines[0]["text"] == "cancel order 42"
    assert lines[1] == {"kind": "call", "text": "lookup_order()", "current": False}
    assert lines[2]["name"] == "lookup_order"
    assert lines[2]["text"] == "x" * 600 and lines[2]["truncated"]
    assert lines[3]["text"] == "First part.\nSecond part."
    assert lines[4] == {
        "kind": "output",
        "name": "tool",
        "text": '{"ok": true}',
        "truncated": False,
    }
    assert lines[5] == {"kind": "call", "text": "cancel_order(order_id=42)", "current": True}


# Calls of the SDK's other tools, as its session stores them (shell, apply_patch, hosted
# MCP).
OTHER_KINDS = [
    {"role": "user", "content": "tidy the build"},
    {
        "type": "shell_call",
        "id": "sh_1",
        "call_id": "call_sh",
        "status": "completed",
        "action": {"commands": ["ls -la", "rm -rf build"], "timeout_ms": 5000},
    },
    {
        "type": "shell_call_output",
        "call_id": "call_sh",
        "output": [
            {"stdout": "total 0\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
            {"stdout": "", "stderr": "rm: busy", "outcome": {"type": "exit", "exit_code": 1}},
        ],
    },
    {
        "type": "local_shell_call",
        "id": "ls_1",
        "call_id": "call_local",
        "status": "completed",
        "action": {"type": "exec", "command": ["sleep", "99"], "env": {}},
    },
    {"type": "local_shell_call_output", "call_id": "call_local", "output": "slept"},
    {
        "type": "apply_patch_call",
        "id": "ap_1",
        "call_id": "call_patch",
        "status": "completed",
        "operation": {"type": "update_file", "path": "app.py", "diff": "-a\n+b\n"},
    },
    {
        "type": "apply_patch_call_output",
        "call_id": "call_patch",
        "status": "failed",
        "output": "A reviewer rejected this tool call: not today",
    },
    {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "name": "ask_question",
        "server_label": "deepwiki",
        "arguments": '{"repo": "<b>openai</b>"}',
    },
    {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True},
    {
        "type": "mcp_call",
        "id": "mcp_1",
        "approval_request_id": "mcpr_1",
        "name": "ask_question",
        "server_label": "deepwiki",
        "arguments": "{}",
        "output": "It is a Python SDK.",
    },
    {
        "type": "mcp_approval_request",
        "id": "mcpr_2",
        "name": "delete_wiki",
        "server_label": "deepwiki",
        "arguments": "{}",
    },
    {
        "type": "mcp_approval_response",
        "approval_request_id": "mcpr_2",
        "approve": False,
        "reason": "No deleting",
    },
    {
        "type": "mcp_call",
        "id": "mcp_2",
        "name": "read_wiki",
        "server_label": "deepwiki",
        "arguments": '{"page": 1}',
        "error": "page not found",
    },
    {"type": "shell_call", "id": "sh_2", "call_id": "call_sh2", "action": {"commands": ["du"]}},
]


def test_every_kind_of_call_reads_as_a_note_with_what_answered_it() -> None:
    entries = entries_for(OTHER_KINDS)
    assert [(entry.kind, entry.text, entry.output, entry.pending) for entry in entries] == [
        ("user", "tidy the build", "", False),
        ("tool", "shell: ls -la; rm -rf build", "total 0 rm: busy (exit 1)", False),
        ("tool", "local_shell: sleep 99", "slept", False),
        (
            "tool",
            "apply_patch: update app.py",
            "A reviewer rejected this tool call: not today",
            False,
        ),
        (
            "tool",
            'ask_question(repo="<b>openai</b>") · hosted MCP server deepwiki',
            "It is a Python SDK.",
            False,
        ),
        (
            "tool",
            "delete_wiki() · hosted MCP server deepwiki",
            "not approved: No deleting",
            False,
        ),
        ("tool", "read_wiki(page=1) · hosted MCP server deepwiki", "error: page not found", False),
        ("tool", "shell: du", "", True),
    ]


def test_a_reviewer_reads_every_kind_of_call_and_its_output() -> None:
    lines = review_lines(OTHER_KINDS, "call_sh2")
    calls = [(line["text"], line["current"]) for line in lines if line["kind"] == "call"]
    assert calls[0] == ("shell: ls -la; rm -rf build", False)
    assert calls[-1] == ("shell: du", True)
    outputs = [(line["name"], line["text"]) for line in lines if line["kind"] == "output"]
    assert outputs == [
        ("shell", "total 0\nrm: busy\n(exit 1)"),
        ("local_shell", "slept"),
        ("apply_patch", "A reviewer rejected this tool call: not today"),
        ("ask_question", "approved"),
        ("ask_question", "It is a Python SDK."),
        ("delete_wiki", "not approved: No deleting"),
        ("read_wiki", "error: page not found"),
    ]


def test_a_stopped_call_of_each_kind_gets_the_output_its_kind_takes() -> None:
    from engine.runs.stopping import STOPPED_CALL_OUTPUT, unanswered_calls

    added = unanswered_calls(
        [
            {"role": "user", "content": "go"},
            OTHER_KINDS[1],  # answered below
            OTHER_KINDS[2],
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "shell_call", "call_id": "s1", "action": {"commands": ["du"]}},
            {"type": "local_shell_call", "id": "l1", "call_id": "l1", "action": {}},
            {"type": "apply_patch_call", "call_id": "p1", "operation": {}},
            {"type": "mcp_approval_request", "id": "mcpr_9", "name": "x", "arguments": "{}"},
        ]
    )
    assert added == [
        {"type": "function_call_output", "call_id": "c1", "output": STOPPED_CALL_OUTPUT},
        {
            "type": "shell_call_output",
            "call_id": "s1",
            "output": [
                {
                    "stdout": "",
                    "stderr": STOPPED_CALL_OUTPUT,
                    "outcome": {"type": "exit", "exit_code": 1},
                }
            ],
        },
        {"type": "local_shell_call_output", "call_id": "l1", "output": STOPPED_CALL_OUTPUT},
        {
            "type": "apply_patch_call_output",
            "call_id": "p1",
            "output": STOPPED_CALL_OUTPUT,
            "status": "failed",
        },
    ]
