"""Every process sweeps (expiry and recovery), so several sweep at once, and
nothing is done twice: each overdue request expires once (one decision row, one event, one
resume), each run a dead process left is failed once or submitted again once, and what a
live process owns is left alone. Sweeps race from several threads of this process and from
two real processes, on whichever database the test run uses (SQLite, then PostgreSQL in
`make test`'s second pass).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from engine import events, runs
from engine.models import AgentRun, ProcessKind, RunStatus, ServerProcess
from tests.factories import make_request, make_run
from tests.live import ROOT
from tests.live import test_database_url as live_database_url

pytestmark = pytest.mark.django_db(transaction=True)

# Of each kind of work a sweep finds, this many.
EACH = 6
# Sweeps per thread: a sweep that comes after another finds nothing left to do.
ROUNDS = 3
QUIET = timedelta(hours=1)  # beyond AGENTSITE_STUCK_RUN_TIMEOUT (900 s)

# What a sweep hands on, as the test records it: ("submit", job, run id), or ("event", type,
# run id, request id, status).
Record = tuple[Any, ...]


def sweep(order: int) -> None:
    """One process's sweep and beat, in an order of its own, as `engine.sweeper` runs them."""
    steps: list[Callable[[], object]] = [
        runs.expire_overdue,
        runs.recover_stuck_runs,
        runs.recover_orphans,
    ]
    for step in steps[order % 3 :] + steps[: order % 3]:
        step()


def sweep_in_threads(threads: int, first: int = 0) -> None:
    """`threads` threads sweep `ROUNDS` times each, all starting at once; any error is
    raised here."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def sweeper(order: int) -> None:
        try:
            barrier.wait(timeout=30)
            for round in range(ROUNDS):
                sweep(order + round)
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    started = [
        threading.Thread(target=sweeper, args=(first + n,), name=f"sweeper-{n}")
        for n in range(threads)
    ]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in started), "a sweeper hung"
    if errors:
        raise errors[0]


def recorded(event: events.Event) -> Record:
    return (
        "event",
        event.type,
        getattr(event, "run_id", None),
        getattr(event, "request_id", None),
        getattr(event, "status", None),
    )


def recording(records: list[Record]) -> tuple[Callable[..., None], Callable[..., None]]:
    """Stand-ins for `executor.submit` and the publishers, which append to `records`."""

    def submit(job: str, run_id: int) -> None:
        records.append(("submit", job, run_id))

    def publish(published: Iterable[events.Event]) -> None:
        records.extend(recorded(event) for event in published)

    return submit, publish


# --- what the sweeps find ---------------------------------------------------------------


@dataclass
class Scene:
    """Everything a sweep acts on, EACH of a kind, all quiet for an hour."""

    overdue: list[int] = field(default_factory=list)  # requests past their expiry
    expiring_runs: list[int] = field(default_factory=list)  # their runs
    orphaned: list[int] = field(default_factory=list)  # running, its process stopped
    orphaned_queued: list[int] = field(default_factory=list)  # queued in a stopped process
    stuck: list[int] = field(default_factory=list)  # running, no process named
    lost_queued: list[int] = field(default_factory=list)  # queued, its job lost
    lost_resuming: list[int] = field(default_factory=list)  # decided, its resume lost
    alive: list[int] = field(default_factory=list)  # running in a live process


def process_row(identity: str, *, stopped: bool) -> str:
    now = timezone.now()
    kind, host, pid, _ = identity.split(":")
    ServerProcess.objects.create(
        identity=identity,
        kind=kind,
        host=host,
        pid=int(pid),
        started=now - QUIET,
        beat=now - QUIET if stopped else now,
        stopped=now - QUIET if stopped else None,
    )
    return identity


def quiet_run(status: str, process: str = "") -> int:
    run = make_run(status=status, pause_count=0)
    AgentRun.objects.filter(pk=run.pk).update(process=process, updated=timezone.now() - QUIET)
    return run.pk


def make_scene() -> Scene:
    gone = process_row(f"{ProcessKind.WEB}:gone:4242:{'ab' * 8}", stopped=True)
    live = process_row(f"{ProcessKind.WORKER}:live:77:{'cd' * 8}", stopped=False)
    scene = Scene()
    for _ in range(EACH):
        request = make_request(expires_at=timezone.now() - timedelta(minutes=1))
        scene.overdue.append(request.pk)
        scene.expiring_runs.append(request.run_id)
        scene.orphaned.append(quiet_run(RunStatus.RUNNING, gone))
        scene.orphaned_queued.append(quiet_run(RunStatus.QUEUED, gone))
        scene.stuck.append(quiet_run(RunStatus.RUNNING))
        scene.lost_queued.append(quiet_run(RunStatus.QUEUED))
        scene.lost_resuming.append(quiet_run(RunStatus.RESUMING))
        scene.alive.append(quiet_run(RunStatus.RUNNING, live))
    return scene


def assert_each_done_once(scene: Scene, records: list[Record]) -> None:
    submits = collections.Counter((r[1], r[2]) for r in records if r[0] == "submit")
    decided = collections.Counter(r[3] for r in records if r[1] == "approval.decided")
    failed = collections.Counter(
        r[2] for r in records if r[1] == "run.updated" and r[4] == RunStatus.FAILED
    )
    resumed = [run_id for (job, run_id) in submits if job == "resume"]

    # Each request expired once: one row in the audit, one event, one resume of its run.
    for request_id in scene.overdue:
        request = ApprovalRequest.objects.get(pk=request_id)
        assert request.status == ApprovalStatus.EXPIRED
        assert ApprovalDecision.objects.filter(request_id=request_id).count() == 1
    # (Seen once mismatched, in a full suite on a machine loaded by a cluster's tests: the
    # message says which request and how, for the next time.)
    assert decided == collections.Counter(scene.overdue), (decided, scene.overdue, records)
    assert (
        AgentRun.objects.filter(pk__in=scene.expiring_runs)
        .exclude(status=RunStatus.RESUMING)
        .count()
        == 0
    )

    # Each run of a dead process failed once (one event), nothing of it submitted again.
    dead = scene.orphaned + scene.stuck
    assert failed == collections.Counter(dead)
    assert set(AgentRun.objects.filter(pk__in=dead).values_list("status", flat=True)) == {
        RunStatus.FAILED
    }

    # Each lost job submitted again once, by one process; nothing resumed twice.
    assert submits == collections.Counter(
        [("resume", run_id) for run_id in scene.expiring_runs + scene.lost_resuming]
        + [("execute", run_id) for run_id in scene.orphaned_queued + scene.lost_queued]
    )
    assert sorted(resumed) == sorted(set(resumed))

    # What a live process owns is its own, however quiet.
    assert set(AgentRun.objects.filter(pk__in=scene.alive).values_list("status", flat=True)) == {
        RunStatus.RUNNING
    }


# --- several threads ----------------------------------------------------------------------


def test_sweeps_racing_in_threads_expire_and_recover_each_thing_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scene = make_scene()
    records: list[Record] = []
    submit, publish = recording(records)
    monkeypatch.setattr("engine.executor.submit", submit)
    monkeypatch.setattr("engine.events.publish_threadsafe", publish)
    monkeypatch.setattr("engine.events.publish_sync", publish)

    sweep_in_threads(4)

    assert_each_done_once(scene, records)


# --- two real processes -------------------------------------------------------------------

# A sweeping process: Django set up from the environment, its jobs and events recorded, its
# heartbeat begun (as a worker's is); "ready" once set up, then it sweeps in THREADS threads
# when a line arrives on stdin, and prints what it recorded as JSON.
CHILD = """
import json, sys
import django
django.setup()
from engine.models import ProcessKind
from engine import events, executor, heartbeat
from tests.engine import test_sweeper_concurrency as here
records = []
executor.submit, publish = here.recording(records)
events.publish_threadsafe = events.publish_sync = publish
heartbeat.begin(ProcessKind.WORKER)
heartbeat.beat()
print("ready", flush=True)
sys.stdin.readline()
here.sweep_in_threads(int(sys.argv[1]), first=int(sys.argv[2]))
print(json.dumps(records), flush=True)
"""


def start_sweeper(threads: int, first: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": live_database_url(),
        "AGENTSITE_EXECUTOR": "inprocess",
        "AGENTSITE_HEARTBEAT_SECONDS": "5",
        "AGENTSITE_PROCESS_TIMEOUT": "15",
        "AGENTSITE_SWEEP_SECONDS": "0",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(threads), str(first)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sweeps_racing_in_two_processes_expire_and_recover_each_thing_once() -> None:
    scene = make_scene()
    sweepers = [start_sweeper(threads=2, first=n) for n in range(2)]
    try:
        for process in sweepers:
            assert process.stdout is not None and process.stderr is not None
            line = process.stdout.readline()
            assert line.strip() == "ready", line + process.stderr.read()
        # The scene's live worker beats, as a live one does: its beat is not as old as the
        # sweepers' start-up, which on a loaded machine outlasts AGENTSITE_PROCESS_TIMEOUT.
        ServerProcess.objects.filter(kind=ProcessKind.WORKER, stopped__isnull=True).update(
            beat=timezone.now()
        )
        for process in sweepers:  # both go at once
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [process.communicate(timeout=90) for process in sweepers]
    finally:
        for process in sweepers:
            if process.poll() is None:
                process.kill()
                process.wait()
    records: list[Record] = []
    for process, (out, err) in zip(sweepers, outputs, strict=True):
        assert process.returncode == 0, err
        records.extend(tuple(record) for record in json.loads(out))

    assert_each_done_once(scene, records)
    # Two processes of their own swept (each beat once), beside the live worker of the scene.
    assert ServerProcess.objects.filter(kind=ProcessKind.WORKER).count() == 3
