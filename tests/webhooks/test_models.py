"""Webhook endpoints (`webhooks/models.py`): only http or https, each with a secret of its own."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import (
    make_user,
)
from webhooks.models import (
    WebhookEndpoint,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_an_endpoint_takes_only_http_or_https_and_gets_a_secret_of_its_own() -> None:
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    form = {"name": "ops", "events": ["approval.created", "run.failed"], "enabled": "on"}
    refused = client.post(
        "/admin/webhooks/webhookendpoint/add/", {**form, "url": "ftp://example.com/x"}
    )
    assert refused.status_code == 200 and WebhookEndpoint.objects.count() == 0
    client.post("/admin/webhooks/webhookendpoint/add/", {**form, "url": "https://example.com/x"})
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.events == ["approval.created", "run.failed"]
    assert endpoint.secret.startswith("whsec_") and len(endpoint.secret) > 40
    page = client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert endpoint.secret in page  # shown to staff, read-only
    assert 'name="secret"' not in page
