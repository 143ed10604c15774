"""The operators' dashboard in a real Chromium against a real daphne server: every chart is
drawn and visible under the site's Content Security Policy, with no console error, and its
table follows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from playwright.sync_api import expect

from tests.browser import log_in
from tests.factories import make_viewer
from tests.tracing.test_dashboard import (
    RANGE,
    REQUESTS,
    TRACES,
    seed_price,
    seed_requests,
    seed_traces,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "pass-for-tests"
# The login's `next`, quoted: the range's own "&" would end it.
DASHBOARD = quote(f"/traces/dashboard/?{urlencode(RANGE)}", safe="")
CHARTS = (
    "runs",
    "latency",
    "tokens",
    "cost",
    "agents",
    "requests",
    "wait-tools",
    "wait-deciders",
    "backlog",
)


def test_the_charts_render_visible_with_no_console_error(
    live_site: Any, page: Any, screenshots: Path
) -> None:
    seed_price()
    seed_traces(TRACES)
    seed_requests(REQUESTS)
    make_viewer("olga")
    errors: list[str] = []

    def on_console(message: Any) -> None:
        # The site has no favicon: Chromium's own request for one is no error of the page.
        if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
            errors.append(f"{message.text} at {message.location.get('url')}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on(
        "response",
        lambda response: (
            errors.append(f"{response.status} {response.url}") if response.status >= 400 else None
        ),
    )
    log_in(page, live_site, "olga", PASSWORD, then=DASHBOARD)
    expect(page.get_by_role("heading", name="Dashboard", exact=True)).to_be_visible()
    expect(page.locator("#dash-until")).to_have_value(RANGE["until"])
    # The charts' colours come from dashboard.css: read them once it has loaded (the DOM is
    # there before; under load the first chart once read black, its default).
    page.wait_for_load_state("load")
    for name in CHARTS:
        chart = page.locator(f'svg[data-chart="{name}"]')
        expect(chart).to_be_visible()
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 100, (name, box)
        # Its marks are drawn with their colour from the stylesheet (no inline style).
        mark = chart.locator(".marks rect, .marks polyline").first
        expect(mark).to_be_visible()
        paint = mark.evaluate(
            "(el) => getComputedStyle(el)[el.tagName === 'rect' ? 'fill' : 'stroke']"
        )
        assert paint not in ("", "none", "rgb(0, 0, 0)"), (name, paint)
        expect(page.locator(f"#chart-{name} table caption")).to_be_visible()
    assert page.get_by_role("img", name="Runs per day by outcome").count() == 1
    page.screenshot(path=str(screenshots / "dashboard.png"), full_page=True)
    page.screenshot(path="/tmp/dash-dashboard.png", full_page=False)
    page.locator("#chart-latency").screenshot(path="/tmp/dash-latency.png")
    page.locator("#chart-wait-deciders").screenshot(path="/tmp/dash-waits.png")
    page.locator("#chart-backlog").screenshot(path="/tmp/dash-backlog.png")
    page.locator("#chart-cost").screenshot(path="/tmp/dash-cost.png")
    page.locator("#chart-requests").screenshot(path="/tmp/dash-requests.png")
    assert not errors, errors


def test_on_a_phone_the_charts_fit_the_screen(
    live_site: Any, browser: Any, screenshots: Path
) -> None:
    seed_traces(TRACES)
    make_viewer("olga")
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    log_in(page, live_site, "olga", PASSWORD, then=DASHBOARD)
    chart = page.locator('svg[data-chart="runs"]')
    expect(chart).to_be_visible()
    box = chart.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    page.screenshot(path="/tmp/dash-phone.png", full_page=False)
    context.close()
