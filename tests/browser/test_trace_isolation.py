"""The shared live server stores each run's trace about a second after the run (its
processor's batch), and a transactional test's database is emptied as the test ends: a
test that ended at its run's reply had its trace stored into the next test's database.
`tests/live.py::live_site_traces_flushed` has the server store them before that."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import expect

from demo.seed import seed_orders
from tests.browser import PASSWORD, log_in, say, wait_until_live
from tests.factories import make_user
from tracing.models import Trace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The live server's processor exports every AGENTSITE_TRACE_BATCH_DELAY (1 s) seconds.
EXPORT_SECONDS = 1.0


def test_a_run_whose_test_ends_at_its_reply(live_site: Any, page: Any) -> None:
    seed_orders()
    make_user(username="alice", password=PASSWORD)
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    wait_until_live(page)
    say(page, "where is order 44")
    expect(page.locator(".turn[data-status=completed]")).to_have_count(1, timeout=25_000)


def test_the_next_test_finds_no_trace_of_it(live_site: Any) -> None:
    time.sleep(EXPORT_SECONDS * 2)  # what the server would still store, stored by now
    assert list(Trace.objects.values_list("workflow_name", flat=True)) == []
