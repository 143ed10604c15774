"""`manage.py run_worker` (engine/management/commands/run_worker.py): django-tasks-db's worker,
running up to `--concurrency` tasks at once, the runs on one event loop (where a
`db_worker` runs one run at a time, model waits included).

Overlap and the cap are read from the task rows themselves: each one's `started_at` (its
claim) and `finished_at` (its result recorded), both written by the worker's clock, so the
most intervals open at one instant is how many tasks were in flight at once. The model is
the demo's after a fixed wait per call (`bench.conversations.LatencyDemoModel`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connections
from django.tasks import task
from django_tasks_db.models import DBTaskResult, DBTaskResultQuerySet

from engine import runs
from engine.management.commands.run_worker import ConcurrentWorker
from engine.models import AgentRun, ProcessKind, RunStatus, ServerProcess
from tests import live
from tests.engine.test_executor import approval_cycle
from tests.factories import start_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

ROOT = Path(__file__).resolve().parents[2]
LATENCY_MODEL = "bench.conversations.LatencyDemoModel"
TIMEOUT = 30.0
RESTART = "interrupted by a restart"


@pytest.fixture(autouse=True)
def queued_for_workers(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs started here are tasks for a worker; many at once by one person."""
    settings.AGENTSITE_EXECUTOR = "tasks"
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 0
    settings.AGENTSITE_OFFLINE_MODEL = LATENCY_MODEL
    monkeypatch.setenv("BENCH_MODEL_LATENCY", "0")


def most_at_once() -> int:
    """The most tasks whose claim-to-result intervals were open at one instant."""
    spans = DBTaskResult.objects.exclude(started_at=None).values_list("started_at", "finished_at")
    edges = [(started, 1) for started, _ in spans]
    edges += [(finished, -1) for _, finished in spans if finished is not None]
    open_now = most = 0
    # At one instant an end counts before a start: a claim made as another task ended is
    # not an overlap.
    for _, step in sorted(edges):
        open_now += step
        most = max(most, open_now)
    return most


def wait_until(condition: Callable[[], bool], describe: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, describe()
        time.sleep(0.02)


def statuses() -> list[str]:
    return sorted(AgentRun.objects.values_list("status", flat=True))


def task_statuses() -> list[str]:
    return sorted(DBTaskResult.objects.values_list("status", flat=True))


# --- a worker in a thread of this process ---------------------------------------------------


@pytest.fixture
def in_thread() -> Iterator[Callable[[int], ConcurrentWorker]]:
    """Start a worker on a thread of this process (`stop` is what its first signal does); every
    one started is stopped and waited for at the end."""
    started: list[tuple[ConcurrentWorker, threading.Thread]] = []

    def start(concurrency: int) -> ConcurrentWorker:
        worker = ConcurrentWorker(
            concurrency=concurrency,
            queue_names=["default"],
            excluded_queue_names=[],
            interval=0.02,
            batch=False,
            backend_name="default",
            startup_delay=False,
            max_tasks=None,
            worker_id=f"thread-worker-{len(started)}",
        )

        def run() -> None:
            try:
                worker.run()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    for worker, thread in started:
        worker.stop()
        thread.join(timeout=TIMEOUT)
        assert not thread.is_alive(), "the worker did not drain"


def test_it_never_has_more_tasks_in_flight_than_its_concurrency(
    in_thread: Callable[[int], ConcurrentWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_MODEL_LATENCY", "0.1")
    for _ in range(8):
        start_run("where is order 44")

    in_thread(3)
    wait_until(lambda: statuses() == [RunStatus.COMPLETED] * 8, lambda: str(statuses()))

    # Each task row is marked a moment after its run's end (the worker records it next).
    wait_until(lambda: task_statuses() == ["SUCCESSFUL"] * 8, lambda: str(task_statuses()))
    assert most_at_once() == 3


def test_a_worker_whose_loop_is_busy_computing_claims_no_more_runs(
    in_thread: Callable[[int], ConcurrentWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BENCH_MODEL_LATENCY", "1.0")
    first = start_run("where is order 44")
    worker = in_thread(10)
    wait_until(lambda: task_statuses() == ["RUNNING"], lambda: str(task_statuses()))

    # The runs' loop computes for a while (a run that is CPU, not a wait for its model):
    # what is queued meanwhile is left for a worker with CPU to spare.
    busy = threading.Event()
    checked = threading.Event()

    async def compute() -> None:
        # Until the test has looked, however long that takes on a loaded machine (a fixed
        # 0.6 s of process time once ended before the check did: this process's other
        # threads count towards process time, and the worker then claimed two more).
        busy.set()
        end = time.monotonic() + TIMEOUT
        while not checked.is_set() and time.monotonic() < end:
            pass

    asyncio.run_coroutine_threadsafe(compute(), worker._loop)
    busy.wait(timeout=TIMEOUT)
    queued = [start_run("where is order 7") for _ in range(3)]
    time.sleep(0.3)
    try:
        assert worker.loop_busy()
        # It may claim one (the claim comes before the check that holds the next one), no
        # more; under load its poll may not even have come round yet (a full run on a fresh
        # clone saw none claimed).
        assert task_statuses() in (
            ["READY", "READY", "READY", "RUNNING"],
            ["READY", "READY", "RUNNING", "RUNNING"],
        )
    finally:
        checked.set()

    # Once it is free again, it claims them all at once (room for 10).
    wait_until(
        lambda: all(AgentRun.objects.get(pk=run.pk).is_finished for run in [first, *queued]),
        lambda: str(statuses()),
    )
    wait_until(lambda: not worker.loop_busy())
    wait_until(lambda: task_statuses() == ["SUCCESSFUL"] * 4, lambda: str(task_statuses()))
    # The three queued at once (the first may have ended meanwhile: its model's second
    # passed while the loop computed).
    assert most_at_once() >= 3


def test_a_run_job_that_raises_fails_its_task_and_the_worker_goes_on(
    in_thread: Callable[[int], ConcurrentWorker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = start_run("where is order 44")
    fine = [start_run("where is order 7"), start_run("where is order 42")]
    run_job = runs.run_job

    async def raising_for_one(job: Any, run_id: int) -> None:
        if run_id == broken.pk:
            raise RuntimeError("the job broke")
        await run_job(job, run_id)

    monkeypatch.setattr(runs, "run_job", raising_for_one)
    in_thread(1)  # one at a time: the others are claimed after the failure
    wait_until(
        lambda: all(AgentRun.objects.get(pk=run.pk).is_finished for run in fine),
        lambda: str(statuses()),
    )

    failed = DBTaskResult.objects.get(status="FAILED")
    assert failed.args_kwargs["args"] == [broken.pk]
    assert failed.exception_class_path == "builtins.RuntimeError"
    assert "the job broke" in failed.traceback
    assert [AgentRun.objects.get(pk=run.pk).status for run in fine] == [RunStatus.COMPLETED] * 2
    wait_until(
        lambda: task_statuses() == ["FAILED", "SUCCESSFUL", "SUCCESSFUL"],
        lambda: str(task_statuses()),
    )


def test_a_failed_claim_lets_the_runs_in_flight_finish_then_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BENCH_MODEL_LATENCY", "0.3")
    run = start_run("where is order 44")
    get_locked = DBTaskResultQuerySet.get_locked
    claims: list[int] = []

    def failing_after_the_first(self: DBTaskResultQuerySet) -> Any:
        claims.append(1)
        if len(claims) > 1:
            raise OperationalError("server closed the connection unexpectedly")
        return get_locked(self)

    monkeypatch.setattr(DBTaskResultQuerySet, "get_locked", failing_after_the_first)
    worker = ConcurrentWorker(
        concurrency=4,
        queue_names=["default"],
        excluded_queue_names=[],
        interval=0.02,
        batch=False,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id="failing-claims",
    )
    with pytest.raises(OperationalError):
        worker.run()  # here: its second claim fails while the run is in flight
    connections.close_all()

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert task_statuses() == ["SUCCESSFUL"]


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def divide(a: int, b: int) -> float:
    return a / b


def test_it_runs_tasks_that_are_not_coroutines_in_threads_as_db_worker_does(
    in_thread: Callable[[int], ConcurrentWorker],
) -> None:
    summed = add.enqueue(2, 3)
    divided = divide.enqueue(1, 0)

    in_thread(4)
    wait_until(lambda: "READY" not in task_statuses() and "RUNNING" not in task_statuses())

    summed.refresh()
    divided.refresh()
    assert (summed.status, summed.return_value) == ("SUCCESSFUL", 5)
    assert divided.status == "FAILED"
    assert divided.errors[0].exception_class_path == "builtins.ZeroDivisionError"


# --- the command, in a process of its own ---------------------------------------------------


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return f"exit code {self.process.poll()}, output:\n" + self.log_path.read_text(
            errors="replace"
        )

    def says(self, text: str) -> bool:
        return text in self.log_path.read_text(errors="replace")


@pytest.fixture
def run_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `manage.py run_worker` on the test database, beating every half second; waits
    until it claims. Every one started is killed at the end if still running."""
    started: list[WorkerProcess] = []

    def start(*args: str, latency: float = 0.0) -> WorkerProcess:
        log_path = tmp_path / f"run_worker-{len(started)}.log"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "AGENTSITE_EXECUTOR": "tasks",
            "AGENTSITE_HEARTBEAT_SECONDS": "0.5",
            "AGENTSITE_OFFLINE_MODEL": LATENCY_MODEL,
            "BENCH_MODEL_LATENCY": str(latency),
            "DATABASE_URL": live.test_database_url(),
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("AGENTSITE_LIVE_TEST_SERVER", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
            env.pop(name, None)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "manage.py", "run_worker", "--interval", "0.05"]
                + ["--no-startup-delay", "--no-reload", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        worker = WorkerProcess(process, log_path)
        started.append(worker)
        wait_until(lambda: worker.says("Starting worker"), worker.log)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
        worker.process.wait()


def test_it_runs_many_runs_at_once_on_a_model_with_latency(
    run_worker: Callable[..., WorkerProcess],
) -> None:
    for _ in range(10):
        start_run("where is order 44")

    # Half a second per model call, two calls a turn: one at a time would take 10 s or more.
    # The busy check off: on a machine the suite shares, the loop's ticks run late with no
    # run of its own computing (that check has its test below).
    worker = run_worker("--concurrency", "10", "--busy-lag", "0", latency=0.5)
    wait_until(lambda: statuses() == [RunStatus.COMPLETED] * 10, worker.log)
    # Each task row is marked a moment after its run's end (the worker records it next).
    wait_until(lambda: task_statuses() == ["SUCCESSFUL"] * 10, worker.log)

    assert most_at_once() == 10, worker.log()


def test_it_beats_from_its_start_and_runs_an_approval_cycle(
    run_worker: Callable[..., WorkerProcess],
) -> None:
    worker = run_worker("--worker-id", "cycle-worker")
    # Its row exists before it has claimed anything: its first run names a live process.
    row = ServerProcess.objects.get(pid=worker.process.pid)
    assert (row.kind, row.stopped) == (ProcessKind.WORKER, None)

    approval_cycle(worker.log)

    done = DBTaskResult.objects.order_by("enqueued_at")
    assert [(t.task_path, t.status, t.worker_ids) for t in done] == [
        ("engine.tasks.execute_run", "SUCCESSFUL", ["cycle-worker"]),
        ("engine.tasks.resume_run", "SUCCESSFUL", ["cycle-worker"]),
    ], worker.log()
    assert {run.process for run in AgentRun.objects.all()} == {row.identity}


def test_sigterm_stops_its_claims_at_once_and_lets_the_runs_in_flight_finish(
    run_worker: Callable[..., WorkerProcess],
) -> None:
    for _ in range(3):
        start_run("where is order 44")
    # A second a turn at least: still in flight when the signal comes.
    worker = run_worker("--concurrency", "2", latency=0.5)
    wait_until(lambda: task_statuses() == ["READY", "RUNNING", "RUNNING"], worker.log)

    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=TIMEOUT) == 0, worker.log()

    assert worker.says("claiming no more tasks"), worker.log()
    assert statuses() == [RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.QUEUED]
    # The third was never claimed: it is the next worker's, whole.
    assert task_statuses() == ["READY", "SUCCESSFUL", "SUCCESSFUL"]
    assert ServerProcess.objects.get(pid=worker.process.pid).stopped is not None


def test_a_second_signal_exits_at_once_and_its_run_is_failed_by_recovery_never_run_again(
    run_worker: Callable[..., WorkerProcess], in_thread: Callable[[int], ConcurrentWorker]
) -> None:
    run = start_run("where is order 44")
    # A minute per model call: only an exit at once ends the worker soon.
    worker = run_worker(latency=60.0)
    wait_until(
        lambda: (
            AgentRun.objects.get(pk=run.pk).status == RunStatus.RUNNING
            and worker.says("state=RUNNING")
        ),
        worker.log,
    )

    worker.process.send_signal(signal.SIGTERM)
    wait_until(lambda: worker.says("claiming no more tasks"), worker.log)
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=10) == 1, worker.log()

    [claimed] = DBTaskResult.objects.all()
    assert (claimed.status, claimed.exception_class_path) == ("FAILED", "builtins.SystemExit")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # left as it was: nothing more of it ran here
    owner = ServerProcess.objects.get(identity=run.process)
    assert owner.pid == worker.process.pid and owner.stopped is not None

    # Any other process's next beat or sweep: the owner said it stopped, so at once.
    assert runs.recover_stuck_runs().failed == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and RESTART in run.error.lower()

    # Another worker runs the next run, and never this one again.
    after = start_run("where is order 7")
    in_thread(2)
    wait_until(lambda: AgentRun.objects.get(pk=after.pk).status == RunStatus.COMPLETED)
    # The task row is marked a moment after its run's end (the worker records it next).
    wait_until(lambda: task_statuses() == ["FAILED", "SUCCESSFUL"])
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
