"""The shared live site (`tests/live.py`) serves the whole session on the test database, beside
every other test of its process: it must act on no row those tests write. A webhook a test
queued is that test's to send (a full run saw the live site send one of
`tests/webhooks/test_delivery.py`'s deliveries, and that test count one request too many)."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from tests.live import LiveSite
from tests.webhooks import make_endpoint, queued
from webhooks.models import DeliveryStatus, WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_live_site_sends_no_webhook_another_test_queued(live_site: LiveSite) -> None:
    endpoint = make_endpoint("http://127.0.0.1:9/nobody-listens")
    queued([endpoint], 1)

    # Longer than a poll of the site's delivery timer, were it polling (this process's
    # settings are the site's, but for what `tests/live.py` sets).
    time.sleep(settings.AGENTSITE_WEBHOOK_POLL_SECONDS + 0.5)

    assert list(WebhookDelivery.objects.values_list("status", "attempts")) == [
        (DeliveryStatus.PENDING, 0)
    ]
