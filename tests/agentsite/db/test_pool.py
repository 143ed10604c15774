"""Database connections stay within a budget under load (`agentsite/db/pool.py`).

A throwaway PostgreSQL server whose `max_connections` is the budget, a real web process
(daphne, the tasks executor, Redis) and two real `manage.py run_worker` processes (each runs
many runs at once, on the same few connections); then many users at once log in, open a
conversation and send messages one after the other, each waiting for the offline demo
model's reply. Every process pools its connections
(`DATABASE_POOL_MAX_SIZE`), so the processes together never ask for more than the budget: no
500, no "too many clients", every message stored, every run completed.

The full load is 20 users × 30 messages on a 97-connection budget (a web process, two
workers); this test runs the same shape at half the users and a few messages each, on a
budget cut as the processes' pools are (see `BUDGET`).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError

from agentsite.db import pool
from engine.models import AgentRun
from tests import live
from tests.factories import make_conversation, make_user
from tests.postgres import PostgresServer, client_connections, running_postgres
from tests.services import running_redis

ROOT = Path(__file__).resolve().parents[3]
USERS = 10
MESSAGES = 3
# Pools: the web process 8, each worker 4; the sampler of this test 1 and the set-up's
# leftovers none. 8 + 2 × 4 + 1 = 17, with headroom for an administrator's psql: 24.
WEB_POOL = 8
WORKER_POOL = 4
BUDGET = 24
# Everyone's messages answered within this, or the test fails saying what was left.
LOAD_WITHIN = 45.0
PASSWORD = "load-test-password-7c1e"
SETUP = f"""
import django
django.setup()
from django.contrib.auth.models import User
from django.core.management import call_command
from demo.seed import seed_orders
call_command("migrate", verbosity=0, interactive=False)
seed_orders()
for n in range({USERS}):
    User.objects.create_user(f"load{{n}}", password={PASSWORD!r})
"""


def environment(server: PostgresServer, redis_url: str, pool_size: int) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": server.url,
        "REDIS_URL": redis_url,
        "AGENTSITE_EXECUTOR": "tasks",
        "DATABASE_POOL_MAX_SIZE": str(pool_size),
        "AGENTSITE_MESSAGES_PER_MINUTE": "0",
        "AGENTSITE_CONVERSATIONS_PER_HOUR": "0",
        "AGENTSITE_DEMO_STREAM_DELAY": "0",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("AGENTSITE_LIVE_TEST_SERVER", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    return env


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_worker(env: dict[str, str], log_path: Path) -> Worker:
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_worker", "--interval", "0.05"]
            + ["--no-startup-delay", "--no-reload"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Worker(process, log_path)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Peak:
    """The most client connections `pg_stat_activity` showed, sampled on one connection."""

    def __init__(self, server: PostgresServer) -> None:
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._connection = server.connect()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with self._connection.cursor() as cursor:
            while not self._stop.is_set():
                self.most = max(self.most, client_connections(cursor))
                self.samples += 1
                self._stop.wait(0.01)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        self._connection.close()
        return self.most


@dataclass
class Answers:
    """What the site answered, counted by status, with the body of every 5xx kept."""

    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, method: str, path: str, status: int, body: str) -> None:
        with self.lock:
            self.statuses[status] += 1
            if status >= 500 and status != 503:
                self.errors.append(f"{method} {path}: {status} {body[:300]!r}")


RUN_BLOCK = re.compile(r'<div id="run-(\d+)" class="turn" data-status="(\w+)"')


class User:
    def __init__(self, site: str, username: str, answers: Answers, deadline: float) -> None:
        self.deadline = deadline
        self.site = site
        self.username = username
        self.answers = answers
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def _csrf(self) -> str:
        return next((c.value or "" for c in self.jar if c.name == "csrftoken"), "")

    def call(
        self, method: str, path: str, data: dict[str, str] | None = None, *, htmx: bool = False
    ) -> tuple[int, str, str]:
        body = None
        headers = {"Referer": self.site + path}
        if data is not None:
            data = {**data, "csrfmiddlewaretoken": self._csrf()}
            body = urllib.parse.urlencode(data).encode()
        if htmx:
            headers["HX-Request"] = "true"
        request = urllib.request.Request(self.site + path, body, headers, method=method)
        try:
            with self.opener.open(request, timeout=LOAD_WITHIN) as response:
                status, text, url = response.status, response.read().decode(), response.url
        except urllib.error.HTTPError as error:
            status, text, url = error.code, error.read().decode(errors="replace"), error.url
        self.answers.record(method, path, status, text)
        return status, text, url

    def chat(self, messages: int) -> None:
        self.call("GET", "/accounts/login/")
        status, _, _ = self.call(
            "POST", "/accounts/login/", {"username": self.username, "password": PASSWORD}
        )
        assert status == 200, f"{self.username} could not log in: {status}"
        _, _, url = self.call("POST", "/chats/new/", {"agent": ""})
        session_id = urllib.parse.urlsplit(url).path.strip("/").split("/")[-1]
        last_run = ""
        for n in range(messages):
            text = f"where is order 7 ({self.username} #{n})"
            last_run = self._send(session_id, text, last_run)

    def _send(self, session_id: str, text: str, last_run: str) -> str:
        deadline = self.deadline
        while time.monotonic() < deadline:
            status, body, _ = self.call(
                "POST", f"/chats/{session_id}/messages/", {"text": text}, htmx=True
            )
            error = re.search(r'class="composer-error"[^>]*>([^<]*)<', body)
            if status == 200 and error is None:
                break
            # Refused (the site is busy, say): the composer kept the text; send it again.
            with self.answers.lock:
                self.answers.refused.append(f"{status} {html.unescape(error[1]) if error else ''}")
            time.sleep(0.2)
        else:
            self.answers.unfinished.append(f"{self.username}: {text!r} was never taken")
            return last_run
        while time.monotonic() < deadline:
            _, body, _ = self.call("GET", f"/chats/{session_id}/history/")
            found = RUN_BLOCK.search(body)
            if found and found[1] != last_run and found[2] in ("completed", "failed"):
                if found[2] == "failed":
                    self.answers.unfinished.append(f"{self.username}: run {found[1]} failed")
                return found[1]
            time.sleep(0.1)
        self.answers.unfinished.append(f"{self.username}: no reply to {text!r} in time")
        return last_run


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    with running_postgres(max_connections=BUDGET) as server:
        yield server


def rows(server: PostgresServer, sql: str) -> list[tuple[Any, ...]]:
    with server.connect() as connection, connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


def test_the_processes_stay_within_the_connection_budget_under_load(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    with running_redis(tmp_path / "redis") as redis:
        web_env = environment(postgres, redis.url, WEB_POOL)
        worker_env = environment(postgres, redis.url, WORKER_POOL)
        subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=web_env, check=True)
        peak = Peak(postgres)
        site = live.start_site(postgres.url, tmp_path / "daphne.log", web_env)
        workers = [start_worker(worker_env, tmp_path / f"worker{n}.log") for n in range(2)]
        answers = Answers()
        failures: list[str] = []

        def user(n: int) -> None:
            try:
                User(site.url, f"load{n}", answers, deadline).chat(MESSAGES)
            except Exception as error:  # noqa: BLE001  (reported below, with the logs)
                failures.append(f"load{n}: {error!r}")

        started = time.monotonic()
        deadline = started + LOAD_WITHIN
        try:
            threads = [threading.Thread(target=user, args=(n,)) for n in range(USERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()) + 5)
        finally:
            most = peak.stop()
            live.stop_site(site)
            for worker in workers:
                stop(worker.process)
        took = time.monotonic() - started

    runs = dict(rows(postgres, "SELECT status, count(*) FROM approvals_agentrun GROUP BY status"))
    (stored,) = rows(
        postgres, "SELECT count(*) FROM conversations_sessionitem WHERE payload->>'role' = 'user'"
    )[0]
    tasks = dict(
        rows(
            postgres,
            "SELECT status, count(*) FROM django_tasks_database_dbtaskresult GROUP BY status",
        )
    )
    logs = "\n".join(
        [f"--- daphne\n{site.log()[-3000:]}"]
        + [f"--- worker {n}\n{w.log()[-2000:]}" for n, w in enumerate(workers)]
    )
    summary = (
        f"peak {most} connections (budget {BUDGET}), {took:.1f} s, "
        f"answers {dict(answers.statuses)}, runs {runs}, tasks {tasks}, "
        f"user messages stored {stored}, refused {Counter(answers.refused)}"
    )
    print(summary)
    sent = USERS * MESSAGES
    assert not failures, f"{failures}\n{summary}\n{logs}"
    assert not answers.errors, f"{answers.errors[:5]}\n{summary}\n{logs}"
    assert "too many clients" not in postgres.log(), summary
    assert not answers.unfinished, f"{answers.unfinished[:5]}\n{summary}\n{logs}"
    assert stored == sent, summary
    assert runs == {"completed": sent}, summary
    assert most <= BUDGET, summary


# --- no connection in time: refused with a clear answer, never a bare 500 ----------------------


def pool_timeout() -> OperationalError:
    """What Django raises when no connection of the pool came free within its timeout."""
    from psycopg_pool import PoolTimeout

    try:
        try:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")
        except PoolTimeout as cause:
            raise OperationalError(str(cause)) from cause
    except OperationalError as error:
        return error


@pytest.mark.django_db
def test_a_message_that_finds_the_pool_exhausted_is_refused_with_its_text_kept(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice)
    client.force_login(alice)

    def exhausted(*args: Any, **kwargs: Any) -> None:
        raise pool_timeout()

    monkeypatch.setattr("engine.runs.start_run", exhausted)
    url = f"/chats/{conversation.session_id}/messages/"

    response = client.post(url, {"text": "cancel order 42"}, headers={"HX-Request": "true"})

    assert response.status_code == 200  # htmx swaps it: the composer, with the text kept
    body = response.content.decode()
    assert 'id="composer"' in body
    assert "cancel order 42</textarea>" in body
    assert html.escape(pool.BUSY) in body
    assert not AgentRun.objects.exists()

    plain = client.post(url, {"text": "cancel order 42"})
    assert plain.status_code == 503
    assert plain["Retry-After"] == str(pool.BUSY_RETRY_AFTER)
    assert html.escape(pool.BUSY) in plain.content.decode()


@pytest.mark.django_db
def test_any_page_that_finds_the_pool_exhausted_answers_503(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.force_login(make_user(username="alice"))

    def exhausted(*args: Any, **kwargs: Any) -> None:
        raise pool_timeout()

    monkeypatch.setattr("conversations.views._chats_page", exhausted)

    response = client.get("/chats/")

    assert response.status_code == 503
    assert response["Retry-After"] == str(pool.BUSY_RETRY_AFTER)
    assert html.escape(pool.BUSY) in response.content.decode()


def test_a_database_error_that_is_not_the_pool_is_not_called_busy() -> None:
    assert pool.is_exhausted(pool_timeout())
    assert pool.is_exhausted(OperationalError("FATAL:  sorry, too many clients already"))
    assert not pool.is_exhausted(OperationalError("deadlock detected"))


# --- the settings -----------------------------------------------------------------------------


SHOW_DATABASE = (
    "import agentsite.settings as s; from agentsite.db import health; "
    "d = s.DATABASES['default']; p = d.get('OPTIONS', {}).get('pool'); "
    "c = p and p.pop('check') is health.check_connection; "
    "print(d['CONN_MAX_AGE'], p, 'checked' if c else '')"
)


def database_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """agentsite.settings' default database, imported in a new interpreter with `env`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_")}
    environ.pop("DJANGO_SETTINGS_MODULE", None)
    environ.update({"DEBUG": "1", **env})
    return subprocess.run(
        [sys.executable, "-c", SHOW_DATABASE],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


POSTGRES_URL = "postgres://agentsite@127.0.0.1:5432/agentsite"


def test_postgresql_pools_by_default_with_the_sizes_of_the_settings() -> None:
    default = database_settings(DATABASE_URL=POSTGRES_URL)
    assert default.returncode == 0, default.stderr
    assert default.stdout.strip() == ("0 {'min_size': 2, 'max_size': 10, 'timeout': 10.0} checked")
    sized = database_settings(
        DATABASE_URL=POSTGRES_URL,
        DATABASE_POOL_MIN_SIZE="1",
        DATABASE_POOL_MAX_SIZE="32",
        DATABASE_POOL_TIMEOUT="2.5",
    )
    assert sized.stdout.strip() == "0 {'min_size': 1, 'max_size': 32, 'timeout': 2.5} checked"
    off = database_settings(DATABASE_URL=POSTGRES_URL, DATABASE_POOL="0")
    assert off.stdout.strip() == "60 None"
    sqlite = database_settings()
    assert sqlite.stdout.strip() == "60 None"


@pytest.mark.parametrize(
    "env",
    [
        {"DATABASE_CONN_MAX_AGE": "60"},
        {"DATABASE_POOL_MAX_SIZE": "1"},
        {"DATABASE_POOL_MIN_SIZE": "12"},
        {"DATABASE_POOL_TIMEOUT": "0"},
    ],
)
def test_it_refuses_pool_settings_it_cannot_keep(env: dict[str, str]) -> None:
    refused = database_settings(DATABASE_URL=POSTGRES_URL, **env)
    assert refused.returncode != 0
    (name,) = env
    last = refused.stderr.splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: ") and name in last, last
