"""The API's docs page (Swagger UI from vendored files, `/api/v1/docs`) in a real Chromium
against a real daphne server, under the site's Content Security Policy."""

from __future__ import annotations

from typing import Any

import pytest

from tests.live import LiveSite

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_docs_page_works_in_a_browser_under_the_sites_csp(
    live_site: LiveSite, page: Any
) -> None:
    # The `page` fixture fails the test on anything the Content Security Policy refuses.
    page.goto(f"{live_site.url}/api/v1/docs")
    page.get_by_text("/api/v1/requests/{request_id}/decide").first.wait_for()
    assert page.locator(".opblock").count() == 8
