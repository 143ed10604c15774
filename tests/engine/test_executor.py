"""One approval cycle end to end on each executor: in-process, and django-tasks with a real
`manage.py db_worker` process. Both must cancel the order exactly once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conversations.session import DjangoSession
from demo.models import Order, OrderEvent
from engine import executor, runs
from engine.models import AgentRun, RunStatus
from tests import live
from tests.factories import make_conversation, make_reviewer, make_user

# The runs execute in other threads or another process: they must see committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20.0


def wait_for(run: AgentRun, status: str, describe: Callable[[], str] = lambda: "") -> AgentRun:
    """Poll the database until the run has `status`; fail with what we know after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status == status:
            return run
        if run.is_finished:
            break
        time.sleep(0.05)
    raise AssertionError(
        f"run {run.pk} is {run.status!r}, not {status!r} (error: {run.error!r})\n{describe()}"
    )


def approval_cycle(describe: Callable[[], str] = lambda: "") -> None:
    """Start "cancel order 42", approve it once it waits, and check the one cancellation."""
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice, agent_name="support")

    run = runs.start_run(conversation, "cancel order 42", alice)
    wait_for(run, RunStatus.WAITING, describe)
    request = run.approval_requests.get()
    assert request.tool_name == "cancel_order"
    assert OrderEvent.objects.count() == 0, "the tool ran before it was approved"

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    wait_for(run, RunStatus.COMPLETED, describe)

    assert "cancelled" in run.final_output, run.final_output
    assert "42" in run.final_output
    events = list(OrderEvent.objects.all())
    assert [(e.order.number, e.kind, e.tool_call_id) for e in events] == [
        (42, OrderEvent.Kind.CANCELLED, request.call_id)
    ]
    assert Order.objects.get(number=42).status == Order.Status.CANCELLED
    items = asyncio.run(DjangoSession(conversation.session_id).get_items())
    outputs = [
        item
        for item in items
        if item.get("type") == "function_call_output" and item.get("call_id") == request.call_id
    ]
    assert len(outputs) == 1, items
    assert "is now cancelled" in str(outputs[0]["output"])


def test_it_runs_an_approval_cycle_in_process(settings: Any) -> None:
    settings.AGENTSITE_EXECUTOR = "inprocess"
    jobs = executor.inprocess()

    approval_cycle(lambda: f"in-process jobs pending: {jobs.pending()}")

    assert jobs.wait_idle(timeout=TIMEOUT)


@pytest.fixture
def db_worker(tmp_path: Path) -> Iterator[Callable[[], str]]:
    """A `manage.py db_worker` process on the test database; yields a reader of its output."""
    log_path = tmp_path / "db_worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "AGENTSITE_EXECUTOR": "tasks",
        # Not imported by name: pytest would collect a `test_*` function as a test.
        "DATABASE_URL": live.test_database_url(),
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("AGENTSITE_LIVE_TEST_SERVER", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "db_worker",
                "--interval",
                "0.05",
                "--no-startup-delay",
                "--no-reload",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield (
            lambda: (
                f"db_worker exit code {process.poll()}, output:\n"
                + log_path.read_text(errors="replace")
            )
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_it_runs_an_approval_cycle_on_a_db_worker(
    settings: Any, db_worker: Callable[[], str]
) -> None:
    settings.AGENTSITE_EXECUTOR = "tasks"

    approval_cycle(db_worker)

    # The worker ran both jobs, not this process.
    from django_tasks_db.models import DBTaskResult

    # Each task row is marked a moment after its run's end (the worker records it next).
    deadline = time.monotonic() + TIMEOUT
    while DBTaskResult.objects.filter(finished_at=None).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    done = DBTaskResult.objects.order_by("enqueued_at").values_list("task_path", "status")
    assert list(done) == [
        ("engine.tasks.execute_run", "SUCCESSFUL"),
        ("engine.tasks.resume_run", "SUCCESSFUL"),
    ], db_worker()
