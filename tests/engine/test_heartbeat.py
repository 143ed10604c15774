"""Each process that runs agents beats (`engine/heartbeat.py`); a run names the process that owns
it, and recovery fails it at once when that process is gone, not after the stuck-run
timeout. A real server killed with -9 mid-run is the end-to-end case."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from engine import heartbeat, runs, sweeper
from engine.models import AgentRun, ProcessKind, RunStatus, ServerProcess
from tests.agentsite.test_serve import send, signed_in
from tests.factories import make_conversation, make_run, make_user, start_run
from tests.live import ROOT, start_site, stop_site
from tests.live import test_database_url as live_database_url

pytestmark = pytest.mark.django_db(transaction=True)

RESTART = "interrupted by a restart"


@pytest.fixture
def beating(settings: Any) -> Iterator[str]:
    """This test process beats, as a web server does: its identity, its row written."""
    settings.AGENTSITE_HEARTBEAT_SECONDS = 5
    settings.AGENTSITE_PROCESS_TIMEOUT = 15
    identity = heartbeat.begin(ProcessKind.WEB)
    assert heartbeat.beat()
    yield identity
    heartbeat.reset()
    sweeper.forget_thread()


def other_process(*, beat_ago: float = 0.0, stopped: bool = False, pid: int = 4242) -> str:
    """The row of another process, which last beat `beat_ago` seconds ago."""
    now = timezone.now()
    identity = f"web:elsewhere:{pid}:{'ab' * 8}"
    ServerProcess.objects.create(
        identity=identity,
        kind=ProcessKind.WEB,
        host="elsewhere",
        pid=pid,
        started=now - timedelta(hours=1),
        beat=now - timedelta(seconds=beat_ago),
        stopped=now if stopped else None,
    )
    return identity


def running_run(process: str, quiet_for: float = 1.0, status: str = RunStatus.RUNNING) -> AgentRun:
    run = make_run(status=status, pause_count=0)
    AgentRun.objects.filter(pk=run.pk).update(
        process=process, updated=timezone.now() - timedelta(seconds=quiet_for)
    )
    run.refresh_from_db()
    return run


# --- recovery by owner ----------------------------------------------------------------------


@pytest.mark.parametrize("gone", ["stopped", "silent"])
def test_a_run_whose_process_is_gone_fails_at_once_and_frees_its_conversation(gone: str) -> None:
    owner = (
        other_process(stopped=True) if gone == "stopped" else other_process(beat_ago=16, pid=4343)
    )
    run = running_run(owner, quiet_for=1)  # quiet for a second, far below the 900 s timeout
    assert AgentRun.objects.filter(conversation=run.conversation).busy().exists()

    recovery = runs.recover_stuck_runs()

    run.refresh_from_db()
    assert (recovery.failed, run.status) == (1, RunStatus.FAILED)
    assert RESTART in run.error.lower() and run.finished is not None
    # The chat takes a message again (the view refuses one while a run is busy).
    assert not AgentRun.objects.filter(conversation=run.conversation).busy().exists()


def test_a_run_whose_process_beats_is_left_alone_however_quiet(settings: Any) -> None:
    run = running_run(other_process(beat_ago=2), quiet_for=3600)
    settings.AGENTSITE_STUCK_RUN_TIMEOUT = 900

    assert runs.recover_stuck_runs().failed == 0
    assert runs.recover_stuck_runs(timedelta(seconds=0)).failed == 0

    run.refresh_from_db()
    assert (run.status, run.error) == (RunStatus.RUNNING, "")


def test_a_run_without_a_process_still_has_the_timeout_as_backstop() -> None:
    quiet = running_run("", quiet_for=3600)
    fresh = running_run("", quiet_for=1)
    # A process named but never written (it died before its first beat): the timeout too.
    unknown = running_run("web:nowhere:1:0000000000000000", quiet_for=3600)

    assert runs.recover_stuck_runs().failed == 2

    for run, status in ((quiet, RunStatus.FAILED), (fresh, RunStatus.RUNNING)):
        run.refresh_from_db()
        assert run.status == status
    unknown.refresh_from_db()
    assert unknown.status == RunStatus.FAILED


def test_a_queued_job_lost_with_its_process_is_taken_over_at_once(
    beating: str, submitted: list[tuple[str, int]]
) -> None:
    lost = running_run(other_process(stopped=True), status=RunStatus.QUEUED)
    held = running_run(other_process(beat_ago=1, pid=77), status=RunStatus.QUEUED)

    assert runs.recover_stuck_runs().resubmitted == 1
    assert submitted == [("execute", lost.pk)]
    lost.refresh_from_db()
    assert (lost.status, lost.process) == (RunStatus.QUEUED, beating)
    # Taken over once: the next look finds it this (live) process's.
    assert runs.recover_stuck_runs().resubmitted == 0
    held.refresh_from_db()
    assert held.process.startswith("web:elsewhere:77:")


# --- the heartbeat --------------------------------------------------------------------------


def test_a_claimed_run_names_its_process_and_beats_keep_the_row_alive(
    beating: str, submitted: list[tuple[str, int]], orders: None
) -> None:
    run = start_run("where is order 7")
    assert run.process == beating  # queued in this process's in-process queue
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert (run.status, run.process) == (RunStatus.COMPLETED, beating)

    row = ServerProcess.objects.get(identity=beating)
    assert (row.kind, row.stopped) == (ProcessKind.WEB, None)
    before = row.beat
    assert sweeper.pulse()
    row.refresh_from_db()
    assert row.beat > before

    heartbeat.stop()
    row.refresh_from_db()
    assert row.stopped is not None
    assert not sweeper.pulse()  # a stopped process beats no more


def test_old_rows_of_dead_processes_are_pruned(beating: str) -> None:
    old = other_process(beat_ago=2 * 24 * 3600)
    recent = other_process(beat_ago=3600, pid=99)

    runs.recover_stuck_runs()

    assert set(ServerProcess.objects.values_list("identity", flat=True)) == {beating, recent}
    assert old not in set(ServerProcess.objects.values_list("identity", flat=True))


def test_a_worker_thread_beats_and_its_row_says_stopped_at_a_clean_exit(settings: Any) -> None:
    settings.AGENTSITE_HEARTBEAT_SECONDS = 0.05
    try:
        assert sweeper.start_thread(ProcessKind.WORKER)
        assert sweeper.start_thread(ProcessKind.WORKER)  # once per process
        identity = heartbeat.owner()
        row = ServerProcess.objects.get(identity=identity)
        first = row.beat
        deadline = time.monotonic() + 5
        while row.beat == first and time.monotonic() < deadline:
            time.sleep(0.05)
            row.refresh_from_db()
        assert row.beat > first and row.kind == ProcessKind.WORKER
        sweeper._stop_at_exit()
        row.refresh_from_db()
        assert row.stopped is not None
    finally:
        heartbeat.reset()
        sweeper.forget_thread()


def test_without_a_heartbeat_a_process_owns_nothing(settings: Any) -> None:
    settings.AGENTSITE_HEARTBEAT_SECONDS = 0
    assert heartbeat.begin(ProcessKind.WEB) == ""
    assert not sweeper.start_thread(ProcessKind.COMMAND)
    assert not ServerProcess.objects.exists()


# --- a real server, and a real worker, killed mid-run --------------------------------------


def killed_mid_run(
    run: AgentRun, process: subprocess.Popen[bytes], log: Path, settings: Any
) -> float:
    """Wait for `run` to run in `process`, check it is owned there, kill -9 `process`, and
    recover here until the run fails: seconds from the kill to the failure."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status == RunStatus.RUNNING:
            break
        assert process.poll() is None, log.read_text(errors="replace")
        time.sleep(0.05)
    else:
        raise AssertionError(f"the run never started:\n{log.read_text(errors='replace')}")
    owner = ServerProcess.objects.get(identity=run.process)
    assert (owner.pid, owner.stopped) == (process.pid, None)
    settings.AGENTSITE_PROCESS_TIMEOUT = 2
    assert runs.recover_stuck_runs().failed == 0  # alive: left alone

    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    killed = time.monotonic()
    while time.monotonic() - killed < 10 and not runs.recover_stuck_runs().failed:
        time.sleep(0.2)
    took = time.monotonic() - killed
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED, log.read_text(errors="replace")
    assert RESTART in run.error.lower()
    assert not AgentRun.objects.filter(conversation=run.conversation).busy().exists()
    return took


@pytest.mark.usefixtures("orders")
def test_a_run_killed_with_its_server_fails_within_seconds(tmp_path: Path, settings: Any) -> None:
    alice = make_user()
    conversation = make_conversation(owner=alice, agent_name="support")
    site = start_site(
        live_database_url(),
        tmp_path / "site.log",
        extra_env={
            # The demo model types a word every 2 s: the run is mid-stream when killed.
            "AGENTSITE_DEMO_STREAM_DELAY": "2",
            "AGENTSITE_HEARTBEAT_SECONDS": "0.5",
        },
    )
    try:
        send(site, signed_in(site, alice.username), conversation.session_id, "where is order 7")
        deadline = time.monotonic() + 15
        while not AgentRun.objects.filter(conversation=conversation).exists():
            assert time.monotonic() < deadline, site.log()
            time.sleep(0.05)
        run = AgentRun.objects.get(conversation=conversation)
        took = killed_mid_run(run, site.process, site.log_path, settings)
    finally:
        stop_site(site)
    assert ServerProcess.objects.get(pid=site.process.pid).kind == ProcessKind.WEB
    # Two seconds of silence (the last beat came up to half a second before the kill), not 900.
    assert 1.0 < took < 6, took


@pytest.mark.usefixtures("orders")
def test_a_run_killed_with_its_db_worker_fails_within_seconds(
    tmp_path: Path, settings: Any
) -> None:
    settings.AGENTSITE_EXECUTOR = "tasks"
    log_path = tmp_path / "db_worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "AGENTSITE_LIVE_TEST_SERVER": "1",  # the demo model streams at the pace below
        "AGENTSITE_DEMO_STREAM_DELAY": "2",
        "AGENTSITE_EXECUTOR": "tasks",
        "AGENTSITE_HEARTBEAT_SECONDS": "0.5",
        "DATABASE_URL": live_database_url(),
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "db_worker", "--interval", "0.05"]
            + ["--no-startup-delay", "--no-reload"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        run = start_run("where is order 7")
        took = killed_mid_run(run, worker, log_path, settings)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    assert ServerProcess.objects.get(pid=worker.pid).kind == ProcessKind.WORKER
    assert 1.0 < took < 6, took


def test_gone_and_alive_split_the_processes_by_their_last_beat_and_stop() -> None:
    stopped = other_process(stopped=True, pid=1)
    silent = other_process(beat_ago=16, pid=2)
    alive = other_process(beat_ago=14, pid=3)
    since = timezone.now() - timedelta(seconds=15)

    def identities(rows: Any) -> set[str]:
        return set(rows.values_list("identity", flat=True))

    assert identities(ServerProcess.objects.gone(since)) == {stopped, silent}
    assert identities(ServerProcess.objects.alive(since)) == {alive}


def test_after_an_outage_of_its_own_a_process_gives_the_others_time_to_beat(
    beating: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database was out for 20 s: every process was silent, none of them is dead. The
    first beat that gets through does not fail the others' runs; two beats later it may."""
    run = running_run(other_process(beat_ago=20), quiet_for=20)
    monkeypatch.setattr(heartbeat, "_last_beat", time.monotonic() - 20)
    assert heartbeat.beat()

    assert runs.recover_stuck_runs().failed == 0
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING

    monkeypatch.setattr(heartbeat, "_judging_from", time.monotonic())
    assert runs.recover_stuck_runs().failed == 1


def test_a_process_timeout_shorter_than_two_beats_stops_the_site() -> None:
    """Live processes would be taken as gone between their beats, and their runs failed."""
    env = {
        **os.environ,
        "AGENTSITE_HEARTBEAT_SECONDS": "5",
        "AGENTSITE_PROCESS_TIMEOUT": "8",
        "DJANGO_SETTINGS_MODULE": "agentsite.settings",
    }
    refused = subprocess.run(
        [sys.executable, "-c", "import agentsite.settings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "AGENTSITE_PROCESS_TIMEOUT=8 must be at least two heartbeats" in refused.stderr
    env["AGENTSITE_PROCESS_TIMEOUT"] = "10"
    accepted = subprocess.run(
        [sys.executable, "-c", "import agentsite.settings"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert accepted.returncode == 0, accepted.stderr
