"""The server's sweep: overdue approvals expire and lost jobs come back without cron."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from demo.seed import seed_orders
from engine import runs, sweeper
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_user

pytestmark = pytest.mark.django_db(transaction=True)


def queued_cancel() -> AgentRun:
    seed_orders()
    alice = make_user()
    return runs.start_run(make_conversation(owner=alice, agent_name="support"), "cancel order 42")


async def test_the_sweeper_expires_overdue_requests_and_resubmits_lost_jobs(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    submitted: list[tuple[str, int]] = []
    monkeypatch.setattr("engine.executor.submit", lambda job, pk: submitted.append((job, pk)))
    settings.AGENTSITE_SWEEP_SECONDS = 0.05
    run = await sync_to_async(queued_cancel)()
    await runs.execute(run.pk)
    await ApprovalRequest.objects.filter(run=run).aupdate(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    lost = await sync_to_async(queued_cancel)()
    await AgentRun.objects.filter(pk=lost.pk).aupdate(updated=timezone.now() - timedelta(hours=1))

    sweeping = sweeper.start(asyncio.get_running_loop())
    assert sweeping is not None
    assert sweeper.start(asyncio.get_running_loop()) is None  # one per loop
    try:
        for _ in range(100):
            request = await ApprovalRequest.objects.aget(run=run)
            if request.status == ApprovalStatus.EXPIRED and ("execute", lost.pk) in submitted:
                break
            await asyncio.sleep(0.05)
    finally:
        sweeping.cancel()

    assert request.status == ApprovalStatus.EXPIRED
    assert (await AgentRun.objects.aget(pk=run.pk)).status == RunStatus.RESUMING
    assert ("resume", run.pk) in submitted
    assert ("execute", lost.pk) in submitted
