"""The home page (`conversations/views.py::home`): where it sends each person, and the notice
that the offline demo model answers, there and on the admin's login page. (The demo's seeding:
tests/demo/test_seed.py; the conversations' admin: tests/conversations/test_admin.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.factories import REVIEWER, make_user

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
