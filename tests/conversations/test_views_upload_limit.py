"""Bad input gets a clear answer on every database: a message far beyond the upload limit is
"too long" like any long message, and a NUL in a URL path is a 404 (PostgreSQL refuses NUL in
text, so a lookup by it would be a 500 there)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from conversations.models import Conversation
from engine import runs
from engine.models import AgentRun
from tests.factories import make_reviewer, make_trace, make_viewer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]

HTMX = {"HX-Request": "true"}
TEN_MB = 10 * 1024 * 1024


def _csrf_client(user: Any, conversation: Conversation) -> tuple[Client, str]:
    """A client that, like a browser, must send the CSRF token, and the token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get(f"/chats/{conversation.session_id}/")
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert match
    return client, match.group(1)


@pytest.mark.parametrize("htmx", [True, False])
def test_a_message_beyond_the_upload_limit_is_too_long_like_any_long_message(
    alice: Any, conversation: Conversation, submitted: list, htmx: bool
) -> None:
    client, token = _csrf_client(alice, conversation)
    url = f"/chats/{conversation.session_id}/messages/"
    headers = HTMX if htmx else {}
    response = client.post(
        url, {"text": "x" * TEN_MB, "csrfmiddlewaretoken": token}, headers=headers
    )
    html = response.content.decode()
    assert response.status_code == (200 if htmx else 400)
    assert "The message is too long" in html and f"at most {runs.MAX_INPUT_CHARS}" in html
    assert "composer-error" in html
    if htmx:
        # Only the composer's note is swapped, so the typed text stays in the page (it is
        # not sent back: reading it is what the limit stops).
        assert response["HX-Retarget"] == "#composer-note"
        assert response["HX-Reswap"] == "outerHTML"
        assert html.lstrip().startswith('<div id="composer-note">')
        assert "<textarea" not in html
    else:
        assert 'id="composer"' in html
    assert AgentRun.objects.count() == 0
    assert submitted == []
    # The limit is still the one answer to oversized bodies: a message within it still works.
    ok = client.post(
        url, {"text": "where is order 7", "csrfmiddlewaretoken": token}, headers=headers
    )
    assert ok.status_code == (200 if htmx else 302)
    assert AgentRun.objects.count() == 1


def test_an_oversized_body_without_the_csrf_token_starts_nothing(
    alice: Any, conversation: Conversation, submitted: list
) -> None:
    client, _token = _csrf_client(alice, conversation)
    url = f"/chats/{conversation.session_id}/messages/"
    response = client.post(url, {"text": "x" * TEN_MB}, headers=HTMX)
    assert "The message is too long" in response.content.decode()
    small = client.post(url, {"text": "where is order 7"}, headers=HTMX)
    assert small.status_code == 403
    assert AgentRun.objects.count() == 0
    assert submitted == []


@pytest.mark.parametrize(
    "path",
    [
        "/chats/%00/",
        "/chats/a%00b/",
        "/chats/%00/history/",
        "/traces/%00/",
        "/traces/trace_%00.json",
        "/traces/%00.json",
        "/traces/%00/tree/",
    ],
)
def test_a_nul_in_a_path_is_a_404(path: str) -> None:
    make_trace()
    client = Client()
    user = make_viewer()
    user.user_permissions.add(*make_reviewer().user_permissions.all())
    client.force_login(user)
    assert client.get(path).status_code == 404


def test_a_nul_in_a_span_path_or_a_post_path_is_a_404(
    alice: Any, conversation: Conversation
) -> None:
    trace = make_trace()
    viewer = Client()
    viewer.force_login(make_viewer())
    assert viewer.get(f"/traces/{trace.trace_id}/spans/%00/").status_code == 404
    assert viewer.get(f"/traces/%00/spans/span_{'0' * 24}/").status_code == 404
    owner = Client()
    owner.force_login(alice)
    for action in ("messages", "undo", "clear", "rename"):
        assert owner.post(f"/chats/%00/{action}/", {"text": "hi"}).status_code == 404, action
