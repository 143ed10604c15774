"""The rules on approval requests (`approvals/models.py`): when a request is open, overdue or
decided, each written once; each test here fails if its rule changes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from engine.models import AgentRun
from tests.factories import make_request, make_run

pytestmark = pytest.mark.django_db


def _request(run: AgentRun, **kwargs: Any) -> ApprovalRequest:
    return make_request(run=run, agent_name="support", tool_name="t", arguments={}, **kwargs)


def test_a_request_is_open_while_pending_and_before_its_expiry_then_overdue() -> None:
    now = timezone.now()
    run = make_run()
    fresh = _request(run, expires_at=now + timedelta(seconds=1))
    at_expiry = _request(run, expires_at=now)
    past = _request(run, expires_at=now - timedelta(seconds=1))
    decided = _request(run, expires_at=now + timedelta(hours=1), status=ApprovalStatus.APPROVED)
    _request(run, expires_at=now - timedelta(hours=1), status=ApprovalStatus.EXPIRED)
    assert list(ApprovalRequest.objects.open(now)) == [fresh]
    assert set(ApprovalRequest.objects.overdue(now)) == {at_expiry, past}
    assert {r for r in ApprovalRequest.objects.all() if r.is_overdue(now)} == {at_expiry, past}
    assert decided not in ApprovalRequest.objects.pending()
    # Without a time given, both read the clock.
    assert set(ApprovalRequest.objects.open()) | set(ApprovalRequest.objects.overdue()) == {
        fresh,
        at_expiry,
        past,
    }


def test_a_request_is_decided_once_approved_rejected_answered_expired_or_withdrawn() -> None:
    run = make_run()
    decided = {
        status
        for status in ApprovalStatus.values
        if _request(run, status=status, expires_at=timezone.now()).is_decided
    }
    assert decided == {
        ApprovalStatus.APPROVED,
        ApprovalStatus.REJECTED,
        ApprovalStatus.RESPONDED,
        ApprovalStatus.EXPIRED,
        ApprovalStatus.WITHDRAWN,
    }
