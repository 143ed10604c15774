"""Every page carries one strict Content Security Policy, and nothing in a page needs more:
no inline script or style, no event handler attribute, no eval (see SECURE_CSP in settings).
The browser tests check the same in Chromium: any violation fails them (tests/live.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from conversations.models import Branch, Conversation, SessionItem
from tests.factories import (
    make_conversation,
    make_request,
    make_reviewer,
    make_span,
    make_trace,
    make_user,
    user_message,
)
from tracing.models import Span

# Transactional: the chat pages read their sessions in worker threads, on connections of their
# own, which see only what was committed.
pytestmark = pytest.mark.django_db(transaction=True)

# What the policy must say, directive by directive.
REQUIRED = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'none'",
    "frame-ancestors": "'none'",
    "form-action": "'self'",
}


def policy_of(response: Any) -> dict[str, str]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"no Content-Security-Policy on {response.request['PATH_INFO']}"
    assert "unsafe-inline" not in header and "unsafe-eval" not in header, header
    directives = (part.strip().partition(" ") for part in header.split(";"))
    return {name: value for name, _, value in directives if name}


def inline_code(html: str) -> list[str]:
    """What a strict policy would refuse in this HTML: inline scripts and styles, style and
    event handler attributes (htmx's hx-on:* among them), javascript: URLs."""
    found = re.findall(r"<script(?![^>]*\ssrc=)[^>]*>", html)
    found += re.findall(r"<style\b[^>]*>", html)
    found += re.findall(r"<[a-z][^>]*\s(?:style|on[a-z]+|hx-on[:\w-]*)=[^>]*>", html, flags=re.I)
    found += re.findall(r"""(?:href|src|action)=["']?\s*javascript:""", html, flags=re.I)
    return found


@pytest.fixture
def admin(admin: Any) -> Any:
    """admin, here also a reviewer: one user who sees every page (her own chats, the inbox,
    the traces and the admin)."""
    return make_reviewer(username="admin")


def forked_conversation(owner: Any) -> Conversation:
    """Two exchanges, and a version whose second message was edited (its Edit controls and
    the versions switcher on the page)."""
    conversation = make_conversation(owner=owner, current_branch="edit-1")
    reply = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "ok"}],
    }
    for branch, items in (
        ("main", [user_message("one"), reply, user_message("two"), reply]),
        ("edit-1", [user_message("one"), reply, user_message("two, edited")]),
    ):
        for payload in items:
            SessionItem.objects.create(conversation=conversation, branch=branch, payload=payload)
    Branch.objects.create(conversation=conversation, branch_id="edit-1", source="main", from_turn=2)
    return conversation


@pytest.fixture
def pages(admin: Any) -> dict[str, str]:
    """One URL of each kind of page, with something on it."""
    conversation = make_conversation(owner=admin)
    request = make_request()
    trace = make_trace()
    root = make_span(trace, "task", "task", start=0, end=2)
    Span.objects.bulk_create([root, make_span(trace, "function", "tool", parent=root, start=1)])
    return {
        "home": "/",
        "login": "/accounts/login/",
        "chats": "/chats/",
        "chat": f"/chats/{conversation.session_id}/",
        "chat with versions": f"/chats/{forked_conversation(admin).session_id}/",
        "clear": f"/chats/{conversation.session_id}/clear/",
        "inbox": "/inbox/",
        "history": "/inbox/history/",
        "request": f"/inbox/{request.pk}/",
        "traces": "/traces/",
        "trace": f"/traces/{trace.trace_id}/",
        "span": f"/traces/{trace.trace_id}/spans/{root.span_id}/",
        "admin": "/admin/",
        "admin list": "/admin/approvals/approvalrequest/",
        "admin change": f"/admin/engine/agentrun/{request.run_id}/change/",
        "admin login": "/admin/login/",
    }


def test_every_page_is_served_with_the_strict_policy_and_no_inline_code(
    client: Client, settings: Any, admin: Any, pages: dict[str, str]
) -> None:
    assert settings.DEBUG is False
    for name, url in pages.items():
        client.logout()
        if name not in ("home", "login", "admin login"):
            client.force_login(admin)
        response = client.get(url)
        assert response.status_code == 200, (name, url, response.status_code)
        policy = policy_of(response)
        for directive, value in REQUIRED.items():
            assert policy.get(directive) == value, (name, directive, policy)
        assert inline_code(response.content.decode()) == [], name


def test_fragments_carry_no_inline_code_either(
    client: Client, admin: Any, pages: dict[str, str]
) -> None:
    """What htmx swaps in obeys the page's policy too."""
    client.force_login(admin)
    trace_url = pages["trace"]
    for url in (f"{trace_url}tree/", pages["span"], "/inbox/rows/", f"{pages['chat']}history/"):
        response = client.get(url, HTTP_HX_REQUEST="true")
        assert response.status_code == 200, url
        html = response.content.decode()
        assert html.strip() and inline_code(html) == [], url
    page = client.get(pages["chat with versions"]).content.decode()
    assert 'data-testid="versions"' in page and page.count('data-testid="edit-message"') == 2
    # An edit refused (empty), its control swapped back in.
    edit_url = f"{pages['chat with versions']}turns/2/edit/"
    response = client.post(edit_url, {"text": "", "branch": "edit-1"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200 and "The message is empty." in html
    assert inline_code(html) == []


def test_the_check_finds_inline_code() -> None:
    assert len(inline_code('<script>alert(1)</script><script src="/s.js"></script>')) == 1
    assert len(inline_code('<div style="left: 1%">')) == 1
    assert len(inline_code('<textarea hx-on:keydown="x()">')) == 1
    assert len(inline_code('<button type="button" onclick="x()">')) == 1
    assert len(inline_code("<style>p { color: red }</style>")) == 1
    assert inline_code('<div data-left="1" class="style">') == []


def test_error_pages_carry_the_policy_too(client: Client, admin: Any) -> None:
    """Refusals and errors are pages of the site as well: 404, 403 (a page and a CSRF
    failure), 405, 400, and a static file."""
    end_user = make_user(username="eve")
    client.force_login(end_user)
    answers = {
        "404": client.get("/no-such-page/"),
        "403": client.get("/inbox/"),
        "405": client.get("/inbox/decide/"),
    }
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin)
    answers["400"] = strict.get("/inbox/history/", {"decision": "maybe"})
    answers["csrf 403"] = strict.post("/inbox/decide/", {"action": "approve"})
    for name, response in answers.items():
        assert str(response.status_code) == name.split()[-1], (name, response.status_code)
        policy = policy_of(response)
        for directive, value in REQUIRED.items():
            assert policy.get(directive) == value, (name, directive, policy)


def test_each_kind_of_call_is_shown_without_inline_code(client: Client, admin: Any) -> None:
    """The markup of each kind of call (an MCP tool's server, a shell call's commands, a
    patch's diff with its classes per line) obeys the policy on every page that shows it,
    rows pushed or swapped in included."""
    from approvals.models import ToolKind
    from engine import runs

    made = [
        make_request(tool_name="restock", kind=ToolKind.MCP, server="warehouse"),
        make_request(tool_name="ask", kind=ToolKind.HOSTED_MCP, server="deepwiki"),
        make_request(
            tool_name="shell",
            kind=ToolKind.SHELL,
            arguments={"commands": ["ls -la"], "timeout_ms": 1000},
        ),
        make_request(
            tool_name="local_shell",
            kind=ToolKind.SHELL,
            arguments={"type": "exec", "command": ["ls"], "env": {"A": "1"}},
        ),
        make_request(
            tool_name="apply_patch",
            kind=ToolKind.APPLY_PATCH,
            arguments={"type": "update_file", "path": "a.py", "diff": "@@ -1 +1 @@\n-a\n+b\n"},
        ),
        make_request(
            tool_name="apply_patch",
            kind=ToolKind.APPLY_PATCH,
            arguments={"type": "delete_file", "path": "b.py"},
        ),
    ]
    client.force_login(admin)
    urls = ["/inbox/", "/inbox/rows/", *(f"/inbox/{request.pk}/" for request in made)]
    seen = ""
    for url in urls:
        response = client.get(url)
        html = response.content.decode()
        assert response.status_code == 200, url
        assert inline_code(html) == [], url
        seen += html
    for markup in ('class="tool-server"', 'class="shell-command"', "diff-line diff-del"):
        assert markup in seen, markup
    confirm = client.post("/inbox/decide/", {"action": "approve", "ids": [r.pk for r in made]})
    assert 'class="diff-line diff-add"' in confirm.content.decode()
    assert inline_code(confirm.content.decode()) == []
    for request in made:
        runs.decide(request, admin, runs.Decision.approve())
    history = client.get("/inbox/history/").content.decode()
    assert 'class="tool-server"' in history and 'class="shell-command"' in history
    assert inline_code(history) == []
