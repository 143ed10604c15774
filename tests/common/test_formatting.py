"""Times and text as the site writes them (common/formatting.py), each way written once."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from common import formatting


def test_it_says_how_long_ago_in_short_or_in_detail() -> None:
    now = timezone.now()
    assert formatting.ago(None) == ""
    assert formatting.ago(now - timedelta(seconds=59)) == "just now"
    assert formatting.ago(now - timedelta(minutes=5, seconds=10)) == "5 min ago"
    assert formatting.ago(now - timedelta(hours=23, minutes=59)) == "23 h ago"
    assert formatting.ago(now - timedelta(days=1, hours=2)) == "1 day ago"
    assert formatting.ago(now - timedelta(days=3)) == "3 days ago"
    assert formatting.ago(now - timedelta(seconds=30), detailed=True) == "just now"
    assert (
        formatting.ago(now - timedelta(hours=2, minutes=5, seconds=3), detailed=True)
        == "2\xa0hours, 5\xa0minutes ago"
    )


def test_it_says_when_a_request_expires() -> None:
    now = timezone.now()
    assert formatting.expires(None) == ""
    assert formatting.expires(now - timedelta(seconds=1)) == "expired"
    assert formatting.expires(now + timedelta(seconds=30)) == "expires in 1 min"
    assert formatting.expires(now + timedelta(hours=23, minutes=30)) == "expires in 23 h"


def test_it_writes_a_wait_in_words() -> None:
    assert formatting.span_in_words(timedelta(seconds=10)) == "1 minute"
    assert formatting.span_in_words(timedelta(minutes=45)) == "45 minutes"
    assert formatting.span_in_words(timedelta(hours=1)) == "1 hour"
    assert formatting.span_in_words(timedelta(hours=2)) == "2 hours"
    assert formatting.span_in_words(timedelta(minutes=90)) == "1.5 hours"


def test_it_writes_a_measured_duration() -> None:
    assert formatting.duration(None) == "—"
    assert formatting.duration(-1) == "0.00 ms"
    assert formatting.duration(0.0004) == "0.40 ms"
    assert formatting.duration(0.0085) == "8.5 ms"
    assert formatting.duration(0.085) == "85 ms"
    assert formatting.duration(1.2401) == "1.24 s"
    assert formatting.duration(42.25) == "42.2 s"
    assert formatting.duration(125) == "2 min 05 s"
    assert formatting.duration(3 * 3600 + 12 * 60) == "3 h 12 min"
    assert formatting.duration(50 * 3600) == "2 days"
    assert formatting.exact_seconds(None) == "-"
    assert formatting.exact_seconds(1.23449) == "1.234 s"


def test_it_previews_text_on_one_line() -> None:
    assert formatting.preview("Order 7  has\nshipped.", 80) == "Order 7 has shipped."
    assert formatting.preview("abcdef ghij", 8) == "abcdef…"
