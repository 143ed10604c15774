"""Error pages are the site's own (its layout, what happened, what to do, the CSP), and a
failed htmx request is explained on the page instead of looking like a click that did nothing
(`static/agentsite/errors.js`, checked in a browser in tests/browser/test_errors.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import include, path

from tests.factories import make_user

pytestmark = pytest.mark.django_db


def _boom(request: Any) -> Any:
    raise RuntimeError("boom <script>alert(1)</script>")


urlpatterns = [path("boom/", _boom), path("", include("agentsite.urls"))]


def test_a_missing_page_is_the_sites_own_404(client: Client) -> None:
    response = client.get("/no/such/page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "Not found" in html and 'class="brand"' in html
    assert "content-security-policy" in {name.lower() for name in response.headers}


def test_a_refusal_says_why_in_the_sites_403(client: Client) -> None:
    client.force_login(make_user(username="alice"))
    response = client.get("/inbox/")
    html = response.content.decode()
    assert response.status_code == 403
    assert "Not allowed" in html and "Only reviewers can open the inbox." in html
    assert 'class="brand"' in html


@pytest.mark.urls("tests.agentsite.test_error_pages")
def test_a_server_error_is_the_sites_500_without_the_error_text() -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/boom/")
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong" in html and 'class="brand"' in html
    assert "boom" not in html and "<script>alert" not in html


def test_every_page_carries_the_request_problem_notice(client: Client) -> None:
    client.force_login(make_user(username="alice"))
    html = client.get("/chats/").content.decode()
    assert 'id="request-problem"' in html and "errors.js" in html
