"""Django Tasks entry points, for the "tasks" executor: `manage.py run_worker` runs these,
many at once on one event loop (`engine/management/commands/run_worker.py`).

They are coroutine functions, so a worker awaits them on its loop; Django's `Task.call` runs a
coroutine function through `async_to_sync`, so django-tasks-db's own `manage.py db_worker`
still runs them, one at a time. The first task a process runs makes it a process that beats
(`sweeper.start_thread`, a daemon thread; `run_worker` starts it before its first claim): the
runs it claims name it as their owner, and when it dies they fail at once.
"""

from __future__ import annotations

from django.tasks import task

from agentsite.db.hops import db_hop
from engine import runs, sweeper
from engine.executor import Job
from engine.models import ProcessKind


@task()
async def execute_run(run_id: int) -> None:
    await db_hop(sweeper.start_thread)(ProcessKind.WORKER)
    await runs.run_job("execute", run_id)


@task()
async def resume_run(run_id: int) -> None:
    await db_hop(sweeper.start_thread)(ProcessKind.WORKER)
    await runs.run_job("resume", run_id)


def enqueue(job: Job, run_id: int) -> None:
    (execute_run if job == "execute" else resume_run).enqueue(run_id)
