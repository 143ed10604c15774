"""Signed as Standard Webhooks specifies (`common/signatures.py`), checked with the
`standardwebhooks` library as published: it refuses another body, another secret or an old
timestamp. An endpoint with a secret made before (not base64) keeps the header its receiver
checks until its secret is rotated; a rotation signs with both secrets for its overlap."""

from __future__ import annotations

import base64
import re
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from common import signatures as signing
from tests.factories import make_user
from tests.webhooks import Receiver, legacy_verified, make_endpoint, queued, verified
from webhooks import delivery
from webhooks.models import WebhookEndpoint

BODY = b'{"id":"evt_1","type":"run.completed","data":{"note":"caf\xc3\xa9"}}'


def test_a_new_secret_is_one_the_library_reads() -> None:
    secret = signing.new_secret()
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", secret)
    assert signing.standard_key(secret) == base64.b64decode(secret.removeprefix("whsec_"))
    assert len(signing.key(secret)) == 32
    assert signing.new_secret() != secret
    # What the library signs with that secret is what the site signs.
    now = int(time.time())
    library = Webhook(secret).sign("evt_1", datetime.fromtimestamp(now, tz=UTC), BODY.decode())
    assert library == signing.signature(secret, "evt_1", now, BODY)


def test_the_library_verifies_the_headers_and_refuses_another_body_secret_or_an_old_time() -> None:
    secret = signing.new_secret()
    headers = signing.headers([secret], "evt_1", BODY)
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-id"] == "evt_1"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 5
    assert re.fullmatch(r"v1,[A-Za-z0-9+/]{43}=", headers["webhook-signature"])

    assert verified(secret, BODY, headers)
    assert Webhook(secret).verify(BODY, headers) == {
        "id": "evt_1",
        "type": "run.completed",
        "data": {"note": "café"},
    }
    assert not verified(secret, BODY + b" ", headers)
    assert not verified(signing.new_secret(), BODY, headers)
    assert not verified(secret, BODY, {**headers, "webhook-id": "evt_2"})
    stale = signing.headers([secret], "evt_1", BODY, timestamp=int(time.time()) - 301)
    assert not verified(secret, BODY, stale)
    with pytest.raises(ValueError):
        signing.headers([], "evt_1", BODY)


def test_an_older_secret_signs_both_ways_and_is_told_apart_by_its_form() -> None:
    older = f"whsec_{secrets.token_urlsafe(32)}"  # as the site made them before
    assert not signing.is_standard(older)
    assert not signing.is_standard("whsec_" + base64.b64encode(b"short").decode())
    assert not signing.is_standard(base64.b64encode(bytes(32)).decode())  # no prefix
    headers = signing.headers([older], "evt_1", BODY)
    # Its receiver's check, unchanged.
    assert legacy_verified(older, BODY, headers["Agentsite-Signature"])
    assert not legacy_verified(older, BODY + b" ", headers["Agentsite-Signature"])
    # The library checks it too, given the key: the secret's text.
    assert verified(older.encode(), BODY, headers)
    assert not verified(older[:-1].encode(), BODY, headers)


@pytest.mark.django_db(transaction=True)
def test_a_rotation_signs_with_both_secrets_until_its_overlap_ends(
    receiver: Receiver, settings: Any
) -> None:
    settings.AGENTSITE_WEBHOOK_ROTATION_OVERLAP = 3600
    older = f"whsec_{secrets.token_urlsafe(32)}"
    endpoint = make_endpoint(receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret=older)  # made before
    endpoint.refresh_from_db()
    assert endpoint.signs_the_older_way

    queued([endpoint], 1)
    assert delivery.deliver_all_due() == 1
    headers, body, _ = receiver.requests[-1]
    assert legacy_verified(older, body, headers["Agentsite-Signature"])
    assert verified(older.encode(), body, headers)

    rotated_at = timezone.now()
    endpoint.rotate_secret(now=rotated_at)
    endpoint.refresh_from_db()
    assert not endpoint.signs_the_older_way
    assert endpoint.previous_secret == older
    assert endpoint.previous_secret_until == rotated_at + timedelta(hours=1)
    queued([endpoint], 1)
    assert delivery.deliver_all_due() == 1
    headers, body, _ = receiver.requests[-1]
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert verified(endpoint.secret, body, headers)  # a receiver moved already
    assert verified(older.encode(), body, headers)  # and one not yet
    assert legacy_verified(older, body, headers["Agentsite-Signature"])

    # The overlap is over: the new secret alone, and the older header is gone.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        previous_secret_until=timezone.now() - timedelta(seconds=1)
    )
    queued([endpoint], 1)
    assert delivery.deliver_all_due() == 1
    headers, body, _ = receiver.requests[-1]
    assert verified(endpoint.secret, body, headers)
    assert not verified(older.encode(), body, headers)
    assert "Agentsite-Signature" not in headers
    assert len(receiver.requests) == 3


@pytest.mark.django_db(transaction=True)
def test_without_an_overlap_a_rotation_drops_the_previous_secret_at_once(settings: Any) -> None:
    settings.AGENTSITE_WEBHOOK_ROTATION_OVERLAP = 0
    endpoint = make_endpoint("https://example.com/hooks")
    before = endpoint.secret
    endpoint.rotate_secret()
    endpoint.refresh_from_db()
    assert endpoint.secret != before
    assert endpoint.signing_secrets() == (endpoint.secret,)
    assert endpoint.previous_secret == "" and endpoint.previous_secret_until is None


@pytest.mark.django_db(transaction=True)
def test_admin_says_how_an_endpoint_signs_and_a_rotation_says_for_how_long(settings: Any) -> None:
    settings.AGENTSITE_WEBHOOK_ROTATION_OVERLAP = 24 * 3600
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    endpoint = make_endpoint("https://example.com/hooks")
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        secret=f"whsec_{secrets.token_urlsafe(32)}"
    )
    page = client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert "An older secret: deliveries carry Agentsite-Signature as well" in page

    answer = client.post(
        "/admin/webhooks/webhookendpoint/",
        {"action": "rotate_secret", "_selected_action": [endpoint.pk]},
        follow=True,
    ).content.decode()
    assert "and with the previous one for 24 hours" in answer
    page = client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)." in page
    assert "The previous secret signs too until" in page
