"""A server that is told to stop (SIGTERM, `agentsite/serve.py`) drains its runs: none is left
"running"."""

from __future__ import annotations

import asyncio
import http.cookiejar
import re
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from engine import executor, runs
from engine.models import AgentRun, RunStatus
from engine.runs import driving
from tests.factories import make_conversation, make_run, make_user
from tests.live import LiveSite, start_site, stop_site
from tests.live import test_database_url as live_database_url

# --- the executor's drain, in one process ---------------------------------------------------


async def test_a_draining_executor_waits_for_its_jobs_then_names_the_unfinished(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    durations = {1: 0.01, 2: 30.0}
    ran: list[int] = []

    async def job(kind: str, run_id: int) -> None:
        ran.append(run_id)
        await asyncio.sleep(durations[run_id])

    monkeypatch.setattr(executor._wiring, "runner", job)
    jobs = executor.InProcessExecutor()
    jobs.submit("execute", 1)
    jobs.submit("execute", 2)
    await asyncio.sleep(0)
    assert await jobs.drain(grace=0.3) == [2]
    jobs.submit("execute", 3)  # closing: a new job is left for recovery
    assert 3 not in durations and jobs.pending() == 1
    assert jobs.cancel_pending() == 1
    assert await jobs.await_idle(within=2)
    assert ran == [1, 2]


@pytest.mark.django_db
def test_interrupt_fails_running_runs_and_leaves_unstarted_ones_to_recovery() -> None:
    running = make_run(status=RunStatus.RUNNING)
    queued = make_run(status=RunStatus.QUEUED)
    assert runs.interrupt([running.pk, queued.pk]) == 1
    running.refresh_from_db()
    queued.refresh_from_db()
    assert (running.status, running.error) == (RunStatus.FAILED, runs.SHUTDOWN_REASON)
    assert queued.status == RunStatus.QUEUED


@pytest.mark.django_db(transaction=True)
async def test_a_cancelled_job_leaves_its_run_for_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    started = asyncio.Event()

    async def slow_execute(run_id: int) -> None:
        started.set()
        await asyncio.sleep(30)

    monkeypatch.setattr(driving, "execute", slow_execute)
    monkeypatch.setattr(runs, "expire_overdue_async", lambda: asyncio.sleep(0))
    from asgiref.sync import sync_to_async

    run = await sync_to_async(make_run)(status=RunStatus.QUEUED)
    task = asyncio.ensure_future(runs.run_job("execute", run.pk))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await AgentRun.objects.aget(pk=run.pk)).status == RunStatus.QUEUED


# --- a real server, stopped while it streams -------------------------------------------------


def signed_in(site: LiveSite, username: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{site.url}/accounts/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token
    form = {"username": username, "password": "pass-for-tests", "csrfmiddlewaretoken": token[1]}
    opener.open(
        urllib.request.Request(
            f"{site.url}/accounts/login/",
            data=urllib.parse.urlencode(form).encode(),
            headers={"Referer": f"{site.url}/accounts/login/"},
        ),
        timeout=10,
    )
    return opener


def send(site: LiveSite, opener: urllib.request.OpenerDirector, session_id: str, text: str) -> None:
    chat = opener.open(f"{site.url}/chats/{session_id}/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', chat)
    assert token, chat[:500]
    opener.open(
        urllib.request.Request(
            f"{site.url}/chats/{session_id}/messages/",
            data=urllib.parse.urlencode({"text": text, "csrfmiddlewaretoken": token[1]}).encode(),
            headers={"Referer": f"{site.url}/chats/{session_id}/"},
        ),
        timeout=10,
    )


def stop_while_streaming(tmp_path: Path, grace: str, delay: str) -> tuple[AgentRun, str, int]:
    alice = make_user()
    conversation = make_conversation(owner=alice, agent_name="support")
    site = start_site(
        live_database_url(),
        tmp_path / "site.log",
        extra_env={"AGENTSITE_DEMO_STREAM_DELAY": delay, "AGENTSITE_SHUTDOWN_GRACE": grace},
    )
    try:
        send(site, signed_in(site, alice.username), conversation.session_id, "where is order 7")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            run = AgentRun.objects.filter(conversation=conversation).first()
            if run is not None and run.status == RunStatus.RUNNING:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the run never started:\n{site.log()}")
        site.process.send_signal(signal.SIGTERM)
        code = site.process.wait(timeout=30)
    finally:
        stop_site(site)
    run.refresh_from_db()
    return run, site.log(), code


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("orders")
def test_a_stopping_server_marks_the_runs_it_cannot_finish_interrupted(tmp_path: Path) -> None:
    run, log, code = stop_while_streaming(tmp_path, grace="0.3", delay="0.4")
    assert (run.status, run.error) == (RunStatus.FAILED, runs.SHUTDOWN_REASON), log
    assert code == 0, log
    assert "1 run(s) did not end within 0.3 s; 1 marked interrupted" in log
    assert "Could not publish" not in log and "Traceback" not in log, log


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("orders")
def test_a_stopping_server_lets_a_run_end_within_its_grace(tmp_path: Path) -> None:
    run, log, code = stop_while_streaming(tmp_path, grace="20", delay="0.02")
    assert run.status == RunStatus.COMPLETED, log
    assert code == 0, log
    assert "Could not publish" not in log and "Traceback" not in log, log
