"""The notifications' admin (`notifications/admin.py`): each reviewer's preferences, editable,
and the notifications queued, read-only."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import (
    make_request,
    make_user,
)
from tests.notifications import announce, opted_in

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_admin_lists_preferences_and_notifications() -> None:
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    opted_in()
    announce(make_request())
    client = Client()
    client.force_login(admin)
    assert client.get("/admin/notifications/notificationpreference/").status_code == 200
    page = client.get("/admin/notifications/notification/")
    assert page.status_code == 200 and "a new request" in page.content.decode()
