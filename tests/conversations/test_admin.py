"""The conversations' admin (`conversations/admin.py`): a conversation with its items, oldest
first and escaped; filtered by agent, searched by owner."""

from __future__ import annotations

import pytest
from django.test import Client

from conversations.models import SessionItem
from tests.factories import make_conversation, make_user

pytestmark = pytest.mark.django_db


def test_admin_shows_a_conversation_with_its_items_oldest_first(admin_client: Client) -> None:
    conversation = make_conversation(title="Order trouble")
    for text in ["first <b>message</b>", "second message"]:
        SessionItem.objects.create(
            conversation=conversation, payload={"role": "user", "content": text}
        )

    listing = admin_client.get("/admin/conversations/conversation/?q=" + conversation.session_id)
    assert listing.status_code == 200
    assert conversation.session_id in listing.content.decode()

    page = admin_client.get(f"/admin/conversations/conversation/{conversation.pk}/change/")
    body = page.content.decode()
    assert page.status_code == 200
    assert body.index("first &lt;b&gt;message&lt;/b&gt;") < body.index("second message")


def test_admin_filters_by_agent_and_searches_by_owner(admin_client: Client) -> None:
    alice = make_user(username="alice")
    make_conversation(owner=alice, agent_name="support", title="mine")
    make_conversation(agent_name="research", title="other")
    by_owner = admin_client.get("/admin/conversations/conversation/?q=alice").content.decode()
    assert "mine" in by_owner and "other" not in by_owner
    by_agent = admin_client.get(
        "/admin/conversations/conversation/?agent_name=research"
    ).content.decode()
    assert "other" in by_agent and "mine" not in by_agent
