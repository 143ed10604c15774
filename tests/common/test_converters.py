"""The `<key:...>` path converter (`common/converters.py`): a NUL in a URL path is a 404 on
every database (PostgreSQL refuses NUL in text, so a lookup by it would be a 500 there)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from conversations.models import Conversation
from tests.factories import make_reviewer, make_trace, make_viewer

pytestmark = pytest.mark.django_db(transaction=True)


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
