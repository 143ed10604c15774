"""The home page, login and Django admin, through the Django test client."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client, RequestFactory

from conversations.models import SessionItem
from tests.factories import REVIEWER, make_conversation, make_user

pytestmark = pytest.mark.django_db


def test_it_serves_the_home_page_with_the_offline_demo_notice(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert b"offline-demo-notice" in response.content
    assert b"Offline demo model" in response.content


def test_it_hides_the_notice_when_a_real_model_serves(client: Client, settings: Any) -> None:
    settings.OPENAI_API_KEY = "sk-test-not-used"
    response = client.get("/")
    assert b"offline-demo-notice" not in response.content


def test_it_serves_the_admin_login(client: Client) -> None:
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert b"offline-demo-notice" in response.content


def test_the_home_page_sends_people_where_they_work(client: Client) -> None:
    alice = make_user(username="alice")
    rita = make_user(perms=[REVIEWER], username="rita")
    client.force_login(alice)
    assert client.get("/")["Location"] == "/chats/"
    client.force_login(rita)
    assert client.get("/")["Location"] == "/inbox/"


def test_seed_demo_is_idempotent_and_prints_passwords_only_in_debug(settings: Any) -> None:
    settings.DEBUG = True
    out = StringIO()
    call_command("seed_demo", stdout=out)
    call_command("seed_demo", stdout=out)
    User = get_user_model()
    assert User.objects.filter(username__in=["alice", "rita", "admin"]).count() == 3
    rita = User.objects.get(username="rita")
    assert rita.groups.filter(name="Reviewers").exists()
    assert User.objects.get(username="admin").is_superuser
    assert not User.objects.get(username="alice").is_staff
    assert "alice-demo-pass" in out.getvalue()
    # django-axes needs the request in authenticate(); Client.login() passes it on.
    assert Client().login(
        request=RequestFactory().post("/accounts/login/"),
        username="alice",
        password="alice-demo-pass",
    )
    assert Group.objects.filter(name="Reviewers").count() == 1

    settings.DEBUG = False
    quiet = StringIO()
    call_command("seed_demo", stdout=quiet)
    assert "demo-pass" not in quiet.getvalue()


def test_seed_demo_without_debug_sets_unguessable_passwords(settings: Any) -> None:
    settings.DEBUG = False
    call_command("seed_demo", stdout=StringIO())
    assert not Client().login(
        request=RequestFactory().post("/accounts/login/"),
        username="admin",
        password="admin-demo-pass",
    )


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
