"""django-tasks entry points, for the "tasks" executor: workers run these."""

from __future__ import annotations

import asyncio

from django_tasks import task

from agentsite.executor import run_job


@task()
def execute_run(run_id: int) -> None:
    asyncio.run(run_job("execute", run_id))


@task()
def resume_run(run_id: int) -> None:
    asyncio.run(run_job("resume", run_id))
