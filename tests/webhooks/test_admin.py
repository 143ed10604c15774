"""The webhooks' admin (`webhooks/admin.py`): a delivery replayed sends the same event id again,
and only for those who may replay."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import (
    make_user,
    pause_run,
)
from tests.webhooks import Receiver, make_endpoint
from webhooks import delivery
from webhooks.models import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEvent,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


@pytest.mark.usefixtures("submitted")
def test_replay_from_admin_sends_the_same_event_id_again(receiver: Receiver) -> None:
    make_endpoint(receiver.url, [WebhookEvent.APPROVAL_CREATED])
    pause_run("cancel order 42")
    delivery.deliver_all_due()
    row = WebhookDelivery.objects.get()
    assert row.status == DeliveryStatus.DELIVERED

    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    answer = client.post(
        "/admin/webhooks/webhookdelivery/",
        {"action": "replay", "_selected_action": [row.pk]},
        follow=True,
    )
    assert answer.status_code == 200
    assert "Replaying 1 delivery" in answer.content.decode()
    row.refresh_from_db()
    assert (row.status, row.replays) == (DeliveryStatus.PENDING, 1)

    assert delivery.deliver_all_due() == 1
    assert receiver.delivery_ids() == [row.event_id, row.event_id]
    assert receiver.bodies()[0] == receiver.bodies()[1]
    row.refresh_from_db()
    assert (row.status, row.attempts) == (DeliveryStatus.DELIVERED, 2)
    assert list(row.attempt_log.values_list("number", "replay")) == [(1, False), (2, True)]
    page = client.get(f"/admin/webhooks/webhookdelivery/{row.pk}/change/").content.decode()
    assert row.event_id in page and "cancel_order" in page  # the payload, shown
    assert 'name="status"' not in page  # read-only


def test_a_reviewer_without_the_permission_cannot_replay(receiver: Receiver) -> None:
    staff = make_user(perms=["webhooks.view_webhookdelivery"], username="sam", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = client.get("/admin/webhooks/webhookdelivery/")
    assert page.status_code == 200
    assert 'value="replay"' not in page.content.decode()
