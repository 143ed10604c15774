"""The outbound plumbing every sender shares (`common/outbound.py`): jittered waits between
attempts, how long a claim lasts, and a POST that follows no redirect. The senders' own
behaviour is held by the webhooks', notifications' and OTLP tests."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from common import outbound

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def test_it_waits_the_step_of_the_failures_jittered_and_the_last_step_repeats() -> None:
    steps = [10.0, 60.0]
    for failures, step in ((1, 10.0), (2, 60.0), (3, 60.0), (9, 60.0), (0, 60.0)):
        for _ in range(50):
            wait = outbound.stepped_backoff(steps, failures).total_seconds()
            assert step * 0.8 <= wait <= step * 1.2, (failures, wait)
    assert 48 <= outbound.stepped_backoff([], 1).total_seconds() <= 72  # no steps: a minute


def test_it_gives_up_once_the_most_attempts_were_made() -> None:
    retry = outbound.retry_at(2, most=3, steps=[5.0], now=NOW)
    assert retry is not None and NOW + timedelta(seconds=4) <= retry <= NOW + timedelta(seconds=6)
    assert outbound.retry_at(3, most=3, steps=[5.0], now=NOW) is None
    assert outbound.retry_at(4, most=3, steps=[5.0], now=NOW) is None


def test_a_doubling_wait_doubles_with_each_retry() -> None:
    for retry, seconds in ((0, 0.5), (1, 1.0), (2, 2.0)):
        wait = outbound.doubling_backoff(0.5, retry)
        assert seconds * 0.8 <= wait <= seconds * 1.2


def test_a_lease_outlasts_the_network_waits_it_may_make() -> None:
    assert outbound.lease(5.0, waits=4, margin=30) == timedelta(seconds=50)


def _post(server: Any, path: str) -> urllib.request.Request:
    url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    return urllib.request.Request(url, data=b"{}", method="POST")


def test_it_follows_no_redirect(server: Any) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        outbound.opener.open(_post(server, "/moved"), timeout=5)
    assert refused.value.code == 307
    assert outbound.refusal(refused.value, 200) == "HTTP 307 Temporary Redirect"
    assert server.paths == ["/moved"]  # nothing was posted to /elsewhere


def test_a_refusal_says_its_status_and_the_start_of_its_answer(server: Any) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        outbound.opener.open(_post(server, "/busy"), timeout=5)
    assert outbound.refusal(refused.value, 9) == "HTTP 503 Service Unavailable: slow do"
    with outbound.opener.open(_post(server, "/ok"), timeout=5) as answer:
        assert answer.status == 200
