"""Django Tasks entry points, for the "tasks" executor: `manage.py db_worker` runs these.

The first task a process runs makes it a process that beats (`sweeper.start_thread`, a
daemon thread): the runs it claims name it as their owner, and when it dies they fail at
once. Started here rather than by a wrapper command, so `manage.py db_worker` stays Django's
own command, and a worker that never runs a task keeps no row.
"""

from __future__ import annotations

import asyncio

from django.tasks import task

from approvals.models import ProcessKind
from engine import runs, sweeper
from engine.executor import Job


@task()
def execute_run(run_id: int) -> None:
    sweeper.start_thread(ProcessKind.WORKER)
    asyncio.run(runs.run_job("execute", run_id))


@task()
def resume_run(run_id: int) -> None:
    sweeper.start_thread(ProcessKind.WORKER)
    asyncio.run(runs.run_job("resume", run_id))


def enqueue(job: Job, run_id: int) -> None:
    (execute_run if job == "execute" else resume_run).enqueue(run_id)
