"""A message far beyond the upload limit (`DATA_UPLOAD_MAX_MEMORY_SIZE`) gets a clear answer
from the chat's views: "too long" like any long message, with nothing started. (A NUL in a
URL path: tests/common/test_converters.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from conversations.models import Conversation
from engine import runs
from engine.models import AgentRun

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
