"""The site's icon: every page names it, and `/favicon.ico`, which browsers ask for
without being told, leads to it instead of a 404."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client

from tests.factories import make_staff, make_user

ROOT = Path(__file__).resolve().parents[2]
ICON = '<link rel="icon" href="/static/agentsite/favicon.svg" type="image/svg+xml">'


@pytest.mark.django_db
def test_favicon_ico_leads_to_the_sites_icon() -> None:
    answer = Client().get("/favicon.ico")
    assert answer.status_code == 302
    assert answer["Location"] == "/static/agentsite/favicon.svg"
    assert (ROOT / "static" / "agentsite" / "favicon.svg").read_text().startswith("<svg")


@pytest.mark.django_db
def test_pages_and_the_admin_name_the_icon() -> None:
    assert ICON in Client().get("/accounts/login/").content.decode()
    person = Client()
    person.force_login(make_user())
    assert ICON in person.get("/chats/").content.decode()
    assert ICON in person.get("/no/such/page/").content.decode()  # the 404 page too
    staff = Client()
    staff.force_login(make_staff())
    assert ICON in staff.get("/admin/").content.decode()
