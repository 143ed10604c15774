"""Login throttling (django-axes) and htmx requests that meet an ended session."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.factories import PASSWORD, make_conversation, make_user

pytestmark = pytest.mark.django_db

LOCKED = "Too many failed login attempts"


@pytest.fixture(autouse=True)
def limit(settings: Any) -> int:
    settings.AXES_FAILURE_LIMIT = 5
    return 5


def login(
    client: Client,
    username: str,
    password: str,
    *,
    ip: str = "10.0.0.1",
    path: str = "/accounts/login/",
) -> Any:
    return client.post(path, {"username": username, "password": password}, REMOTE_ADDR=ip)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


# --- Login throttling ---------------------------------------------------------------------


def test_it_locks_a_user_out_after_too_many_wrong_passwords(limit: int) -> None:
    make_user(username="alice")
    client = Client()
    answers = [login(client, "alice", "wrong").status_code for _ in range(limit)]
    # The failure that reaches the limit already gets the lockout page.
    assert answers == [200] * (limit - 1) + [429]
    refused = login(client, "alice", PASSWORD)
    assert refused.status_code == 429
    assert LOCKED in refused.content.decode()
    assert not logged_in(client)


def test_it_locks_a_user_out_whatever_address_the_guesses_come_from(limit: int) -> None:
    make_user(username="alice")
    for n in range(limit):
        login(Client(), "alice", "wrong", ip=f"10.0.1.{n}")
    client = Client()
    refused = login(client, "alice", PASSWORD, ip="10.0.2.1")
    assert refused.status_code == 429
    assert not logged_in(client)


def test_it_locks_out_an_address_that_sprays_many_usernames(limit: int) -> None:
    make_user(username="bob")
    client = Client()
    for n in range(limit):
        login(client, f"victim{n}", "wrong", ip="10.0.3.3")
    refused = login(client, "bob", PASSWORD, ip="10.0.3.3")
    assert refused.status_code == 429
    assert LOCKED in refused.content.decode()
    assert not logged_in(client)
    # bob himself, from his own address, is not locked out.
    other = Client()
    assert login(other, "bob", PASSWORD, ip="10.0.3.4").status_code == 302
    assert logged_in(other)


def test_it_locks_the_admin_login_too(limit: int) -> None:
    make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    for _ in range(limit):
        login(client, "admin", "wrong", path="/admin/login/")
    refused = login(client, "admin", PASSWORD, path="/admin/login/")
    assert refused.status_code == 429
    assert LOCKED in refused.content.decode()
    assert not logged_in(client)


def test_the_lockout_page_says_when_to_try_again_in_the_sites_layout(limit: int) -> None:
    for _ in range(limit):
        login(Client(), "alice", "wrong")
    body = login(Client(), "alice", "wrong").content.decode()
    assert "Log in" in body and 'class="card narrow"' in body
    assert "15 minutes" in body
    assert "style=" not in body and "<script>" not in body


def test_a_success_does_not_wipe_an_address_count_of_failures(limit: int) -> None:
    # An attacker with an account of her own cannot reset her address's count by logging in.
    make_user(username="mallory")
    client = Client()
    for n in range(limit - 1):
        login(client, f"victim{n}", "wrong", ip="10.0.4.4")
    assert login(client, "mallory", PASSWORD, ip="10.0.4.4").status_code == 302
    login(Client(), "victim9", "wrong", ip="10.0.4.4")
    assert login(Client(), "mallory", PASSWORD, ip="10.0.4.4").status_code == 429


def test_a_user_with_fewer_failures_than_the_limit_still_logs_in(limit: int) -> None:
    make_user(username="alice")
    client = Client()
    for _ in range(limit - 1):
        login(client, "alice", "wrong")
    assert login(client, "alice", PASSWORD).status_code == 302
    assert logged_in(client)
    for _ in range(3):
        again = Client()
        assert login(again, "alice", PASSWORD).status_code == 302


# --- htmx requests after the session ended ------------------------------------------------


def htmx(current_url: str) -> dict[str, str]:
    return {"HTTP_HX_REQUEST": "true", "HTTP_HX_CURRENT_URL": current_url}


def test_an_htmx_send_after_logout_redirects_the_page_to_the_login_page() -> None:
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice)
    chat = f"/chats/{conversation.session_id}/"
    client = Client()
    client.force_login(alice)
    client.post("/accounts/logout/")

    response = client.post(
        f"{chat}messages/", {"text": "my long message"}, **htmx(f"http://testserver{chat}")
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/accounts/login/?next={chat}"
    assert b"Log in" not in response.content


def test_an_htmx_decision_after_logout_redirects_to_the_login_page() -> None:
    client = Client()
    response = client.post(
        "/inbox/1/decide/", {"decision": "approve"}, **htmx("http://testserver/inbox/")
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/accounts/login/?next=/inbox/"


def test_it_takes_next_from_the_request_when_the_current_url_is_another_site() -> None:
    response = Client().get("/inbox/rows/", **htmx("https://evil.example/inbox/"))
    assert response["HX-Redirect"] == "/accounts/login/?next=/inbox/rows/"


def test_a_plain_request_after_logout_still_gets_the_usual_redirect() -> None:
    response = Client().get("/inbox/")
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/inbox/"
    assert "HX-Redirect" not in response
