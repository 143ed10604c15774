"""The site's context (`agentsite.context_processors`): the menu's permission checks are asked
only by a template that tests them, once a render. The chat composer a message's POST answers
with shows no menu, so it asks no permission query (the permission queries would be about 1 ms
of each turn's POST)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agentsite.context_processors import Lazy
from tests.factories import make_conversation, make_reviewer, make_user

pytestmark = pytest.mark.django_db


def permission_queries(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries if "auth_permission" in query["sql"]]


def test_a_message_s_post_asks_no_permission_query(settings: Any) -> None:
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 0
    rita = make_reviewer("rita")  # a reviewer: her pages test both checks
    conversation = make_conversation(owner=rita)
    client = Client()
    client.force_login(rita)
    url = reverse("chat_send", args=[conversation.session_id])
    with CaptureQueriesContext(connection) as queries:
        response = client.post(url, {"text": "hello"}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "<textarea" in response.content.decode()  # the composer, nothing else
    assert permission_queries(queries) == []


def test_a_page_with_the_menu_still_shows_each_person_her_links() -> None:
    rita, alice = make_reviewer("rita"), make_user(username="alice")
    for user, shows in ((rita, True), (alice, False)):
        client = Client()
        client.force_login(user)
        chain = client.get(reverse("home"), follow=True).redirect_chain
        landing = chain[-1][0] if chain else reverse("home")
        with CaptureQueriesContext(connection) as queries:
            page = client.get(landing).content.decode()
        assert (f'href="{reverse("inbox")}"' in page) is shows, user.username
        # Both links' checks together: Django's own two permission queries, asked once.
        assert len(permission_queries(queries)) <= 2, permission_queries(queries)


def test_a_lazy_check_is_asked_once_and_only_when_tested() -> None:
    asked: list[Any] = []

    def check(user: Any) -> bool:
        asked.append(user)
        return user == "rita"

    lazy = Lazy(check, "rita")
    assert asked == []
    assert lazy and bool(lazy) and lazy == True  # noqa: E712 (a template's comparison)
    assert asked == ["rita"]
    assert not Lazy(check, "alice")
