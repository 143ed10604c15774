"""A reviewer's email settings page (`notifications/views.py`): only reviewers have one."""

from __future__ import annotations

import pytest
from django.test import Client

from notifications.models import (
    EmailMode,
    NotificationPreference,
)
from tests.agentsite.test_csp import inline_code
from tests.factories import (
    make_reviewer,
    make_user,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_a_reviewer_chooses_her_email_settings_on_her_page(client: Client) -> None:
    rita = make_reviewer("rita")
    client.force_login(rita)
    inbox = client.get("/inbox/").content.decode()
    assert 'href="/account/notifications/"' in inbox  # linked from the inbox's header

    page = client.get("/account/notifications/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "no email address" in html  # she has none yet
    assert inline_code(html) == []
    assert NotificationPreference.objects.get(user=rita).mode == EmailMode.OFF  # made, off

    saved = client.post(
        "/account/notifications/",
        {
            "mode": "digest",
            "digest_minutes": "60",
            "agents": "Support desk, Billing,",
            "tools": "",
        },
    )
    assert saved.status_code == 302
    preference = NotificationPreference.objects.get(user=rita)
    assert (preference.mode, preference.digest_minutes) == (EmailMode.DIGEST, 60)
    assert (preference.agents, preference.tools) == (["Support desk", "Billing"], [])
    again = client.get("/account/notifications/").content.decode()
    assert 'value="Support desk, Billing"' in again

    refused = client.post("/account/notifications/", {"mode": "digest", "digest_minutes": "7"})
    assert refused.status_code == 400
    assert NotificationPreference.objects.get(user=rita).digest_minutes == 60


def test_only_reviewers_have_email_settings(client: Client) -> None:
    assert client.get("/account/notifications/")["Location"].startswith("/accounts/login/")
    client.force_login(make_user(username="alice"))
    assert client.get("/account/notifications/").status_code == 403
    assert not NotificationPreference.objects.exists()
