"""The demo, in Chromium, through nginx on the cluster `make cluster` starts: alice asks to
cancel order 44, rita approves it in her live inbox, alice sees the reply; the run executes
in a worker and every push crosses Redis between the web processes.

Marked `cluster` as tests/cluster/test_across_processes.py is (its own PostgreSQL: `make test`
runs it once).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from agentsite.cluster import Cluster
from tests.browser import log_in
from tests.cluster import PASSWORDS, cluster_rows, pid_of, running_cluster

pytestmark = [pytest.mark.browser, pytest.mark.cluster]

WAITING = "A person will confirm: cancel an order that has not been delivered yet (order 44)"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster() as running:
        yield running


def test_alice_asks_rita_approves_and_alice_sees_the_reply_through_nginx(
    cluster: Cluster, page: Any, browser: Any
) -> None:
    log_in(page, cluster, "rita", PASSWORDS["rita"], then="/inbox/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(0)
    page.evaluate("window.__sameDocument = true")

    context = browser.new_context(viewport={"width": 1280, "height": 860})
    chat = context.new_page()
    chat.set_default_timeout(10_000)
    log_in(chat, cluster, "alice", PASSWORDS["alice"], then="/chats/")
    chat.get_by_role("button", name="New conversation").click()
    chat.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    expect(chat.locator("[data-live-status]")).to_have_text("Live")
    expect(chat.locator("#messages.htmx-request")).to_have_count(0)
    chat.evaluate("window.__sameDocument = true")
    box = chat.get_by_label("Message")
    box.fill("cancel order 44")
    box.press("Enter")
    expect(chat.get_by_text(WAITING)).to_be_visible()

    row = page.locator("#pending-rows > li.row-pending")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("cancel_order")
    expect(row).to_contain_text("asked by alice")
    row.get_by_role("button", name="Approve", exact=True).click()
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(0)

    expect(chat.locator(".note-tool").last).to_contain_text("not been delivered yet (order 44)")
    expect(chat.locator(".msg-assistant .markdown").last).to_contain_text(
        "cancelled", timeout=15_000
    )
    expect(chat.get_by_text(WAITING)).to_have_count(0)
    assert page.evaluate("window.__sameDocument === true")
    assert chat.evaluate("window.__sameDocument === true")
    context.close()

    # The run executed in a worker, and nginx (not a web process) served the static files.
    [(status, process)] = cluster_rows(cluster, "SELECT status, process FROM approvals_agentrun")
    assert status == "completed"
    assert pid_of(process) in {worker.pid for worker in cluster.worker}
    assert cluster_rows(cluster, "SELECT status FROM demo_order WHERE number = 44") == [
        ("cancelled",)
    ]
    assert not any("/static/" in web.log() for web in cluster.web)
