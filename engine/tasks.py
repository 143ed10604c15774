"""Django Tasks entry points, for the "tasks" executor: `manage.py db_worker` runs these."""

from __future__ import annotations

import asyncio

from django.tasks import task

from engine import runs
from engine.executor import Job


@task()
def execute_run(run_id: int) -> None:
    asyncio.run(runs.run_job("execute", run_id))


@task()
def resume_run(run_id: int) -> None:
    asyncio.run(runs.run_job("resume", run_id))


def enqueue(job: Job, run_id: int) -> None:
    (execute_run if job == "execute" else resume_run).enqueue(run_id)
