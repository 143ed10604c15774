"""Every AGENTSITE_SWEEP_SECONDS, the server expires overdue approvals and deals with runs
that a dead process left behind, so neither needs a cron job."""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings

from agentsite.db.hops import db_hop
from engine import runs

logger = logging.getLogger(__name__)

# One sweeper per loop, referenced until its loop closes (a task nobody references may be
# garbage-collected mid-sleep).
_sweepers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}


def start(loop: asyncio.AbstractEventLoop) -> asyncio.Task[None] | None:
    """Start the sweep on `loop`; None when it already sweeps there or sweeping is off."""
    if loop in _sweepers or settings.AGENTSITE_SWEEP_SECONDS <= 0:
        return None
    task = loop.create_task(_sweep_forever(settings.AGENTSITE_SWEEP_SECONDS))
    _sweepers[loop] = task
    task.add_done_callback(lambda _: _sweepers.pop(loop, None))
    return task


async def _sweep_forever(every: float) -> None:
    while True:
        await asyncio.sleep(every)
        try:
            await runs.expire_overdue_async()
            await db_hop(runs.recover_stuck_runs)()
        except Exception:
            logger.exception("The sweep of overdue approvals and stuck runs failed")
