"""Overdue approvals expire on the web processes' timer, not on the job path: a job does not
sweep before its run (that would cost each turn about 1 ms of CPU), and with runs in
workers (AGENTSITE_EXECUTOR=tasks) a web process's loop still sweeps, so expiry happens when
only web processes and workers run."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from engine import executor, runs, serverloop, sweeper
from engine.models import AgentRun, RunStatus
from tests.engine.test_sweeper import queued_cancel

pytestmark = pytest.mark.django_db(transaction=True)


async def paused_and_overdue() -> AgentRun:
    run = await sync_to_async(queued_cancel)()
    await runs.execute(run.pk)
    await ApprovalRequest.objects.filter(run=run).aupdate(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    return run


async def test_with_runs_in_workers_a_web_process_s_loop_expires_overdue_requests(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    enqueued: list[tuple[str, int]] = []
    # The task queue as engine.apps wired it (tasks.enqueue), recorded instead of stored.
    monkeypatch.setattr(
        executor._wiring, "enqueue", lambda job, pk: enqueued.append((job, pk)), raising=True
    )
    settings.AGENTSITE_EXECUTOR = "tasks"
    settings.AGENTSITE_SWEEP_SECONDS = 0.05
    run = await paused_and_overdue()

    loop = asyncio.get_running_loop()
    with serverloop.bound(None):
        executor.bind_server_loop(loop)  # what asgi.py does on a web process's first connection
        sweeping = sweeper._sweepers.get(loop)
        assert sweeping is not None, "no sweep on the web process's loop"
        try:
            for _ in range(100):
                request = await ApprovalRequest.objects.aget(run=run)
                # The resume is enqueued after the expiry commits (on_commit, in the sweep's
                # thread): its status can be read here a moment before the job is queued.
                if request.status == ApprovalStatus.EXPIRED and len(enqueued) == 2:
                    break
                await asyncio.sleep(0.05)
        finally:
            sweeping.cancel()

    assert request.status == ApprovalStatus.EXPIRED
    assert (await AgentRun.objects.aget(pk=run.pk)).status == RunStatus.RESUMING
    # Both its jobs went to the workers' queue: its start, and its resume after the expiry.
    assert enqueued == [("execute", run.pk), ("resume", run.pk)]


async def test_a_job_leaves_overdue_requests_to_the_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.executor.submit", lambda job, pk: None)
    overdue = await paused_and_overdue()
    other = await sync_to_async(queued_cancel)()

    await runs.run_job("execute", other.pk)

    assert (await AgentRun.objects.aget(pk=other.pk)).status == RunStatus.WAITING
    request = await ApprovalRequest.objects.aget(run=overdue)
    assert request.status == ApprovalStatus.PENDING
    assert await sync_to_async(runs.expire_overdue)() == 1  # the sweep's own call expires it
