"""What one email says (`notifications/mail.py`): each request as the inbox shows it, the
asker's own conversation named, every kind of call readable, and what the model and the user
wrote escaped in the HTML part."""

from __future__ import annotations

import pytest
from django.core import mail

from notifications import sending
from tests.agentsite.test_csp import inline_code
from tests.factories import (
    make_request,
    make_run,
    make_user,
)
from tests.notifications import announce, html_of, opted_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_the_asker_who_is_a_reviewer_is_told_it_is_her_own_conversation() -> None:
    rita = opted_in()
    request = make_request(run=make_run(owner=rita))
    announce(request)
    sending.send_all_due()
    (message,) = mail.outbox
    assert "Your own conversation: another reviewer must approve it" in message.body
    assert "Your own conversation" in html_of(message)


def test_the_html_part_escapes_what_the_model_and_the_user_wrote() -> None:
    opted_in()
    asker = make_user(username="<b>mallory</b>")
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    request = make_request(
        run=make_run(owner=asker),
        agent_name="<i>Agent</i>",
        tool_name="cancel_order",
        arguments={"order_id": 42, "reason": evil},
    )
    announce(request)
    sending.send_all_due()
    (message,) = mail.outbox
    html = html_of(message)
    assert "<script>" not in html and "<img" not in html and "<b>mallory" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&lt;b&gt;mallory&lt;/b&gt;" in html and "&lt;i&gt;Agent&lt;/i&gt;" in html
    assert inline_code(html) == []
    assert evil in message.body  # the plain text part is text: as written
    assert "\n" not in message.subject


def test_emails_name_an_mcp_tools_server_and_show_commands_and_patches() -> None:
    from approvals.models import ToolKind

    opted_in()
    mcp = make_request(tool_name="restock", kind=ToolKind.MCP, server="warehouse")
    announce(mcp)
    sending.send_all_due()
    (message,) = mail.outbox
    assert message.subject == (
        "[agentsite] restock · MCP server warehouse (Support desk) waits for your review"
    )
    assert "<h2>restock · MCP server warehouse <small>" in html_of(message)

    mail.outbox.clear()
    shell = make_request(
        tool_name="shell",
        kind=ToolKind.SHELL,
        arguments={"commands": ["ls -la", "echo <b>hi</b>"], "timeout_ms": 60000},
    )
    announce(shell)
    sending.send_all_due()
    (message,) = mail.outbox
    assert "Commands:\n  $ ls -la\n  $ echo <b>hi</b>\nTimeout: 60 s" in message.body
    html = html_of(message)
    assert "<pre>$ ls -la\n$ echo &lt;b&gt;hi&lt;/b&gt;\n</pre>" in html
    assert "Shell command" in html and inline_code(html) == []

    mail.outbox.clear()
    patch = make_request(
        tool_name="apply_patch",
        kind=ToolKind.APPLY_PATCH,
        arguments={"type": "update_file", "path": "src/<app>.py", "diff": "@@\n-a\n+b\n+c\n"},
    )
    announce(patch)
    sending.send_all_due()
    (message,) = mail.outbox
    assert "Update the file src/<app>.py (+2 −1 lines): open the request" in message.body
    assert "Update the file <code>src/&lt;app&gt;.py</code> (+2 −1 lines)" in html_of(message)
