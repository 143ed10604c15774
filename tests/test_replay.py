"""A saved state runs at most once: not after its run ended unfinished (issue 11, item 12),
and not from a copy written back after it was consumed (item 11)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from approvals.models import AgentRun, RunStatus
from conversations.session import DjangoSession
from demo.models import Order, OrderEvent
from engine import runs
from tests.factories import make_reviewer, pause_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def cancelled_42() -> int:
    return OrderEvent.objects.filter(order__number=42, kind=OrderEvent.Kind.CANCELLED).count()


def outputs_for(run: AgentRun, call_id: str) -> list[dict[str, Any]]:
    items = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    return [
        item
        for item in items
        if item.get("type") == "function_call_output" and item.get("call_id") == call_id
    ]


def approved_pause() -> AgentRun:
    """A demo run paused on cancel_order(42) and approved: resuming, its job not yet run."""
    run = pause_run("cancel order 42")
    runs.decide(run.approval_requests.get().pk, make_reviewer(), True)
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.RESUMING
    return run


def test_a_failed_run_keeps_no_state_to_resume(submitted: list) -> None:
    run = approved_pause()
    # Every path that ends a run unfinished goes through `_fail_sync` (a crash, recovery, a
    # reused call id, a state that cannot be restored).
    assert runs._fail_sync(run.pk, "Interrupted by a restart.")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.state is None
    assert run.state_signature == ""

    # Set back to resuming in the database, the flag unconsumed: nothing may run.
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RESUMING, state_consumed=False)
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "no saved state" in run.error
    assert "nothing was executed" in run.error
    assert cancelled_42() == 0
    assert Order.objects.get(number=42).status == Order.Status.PLACED
    assert outputs_for(run, run.approval_requests.get().call_id) == []
