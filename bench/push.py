"""Approval push: how long a new approval request takes to reach many reviewers' open inboxes,
on the cluster `make cluster` starts (agentsite/cluster.py: PostgreSQL, Redis, 2 web processes,
2 workers, nginx).

N inbox sockets (the inbox page's, `?show=pending`) are opened through nginx, which spreads
them over the web processes, each on a session of its own (as N reviewers' browsers: a socket
checks its session before a push, `engine.access`). Then alice asks, R times one after the
other, to cancel an order: each run pauses in a worker, whose pause commits the request and
publishes one event to Redis; every web process renders the row once and sends it to each of
its sockets, through nginx. A sample is one socket's delay: from the request's creation (its
`created`, written in the worker inside the pause's transaction) to the moment the row's
frame arrived here (the same machine's clock).

Two sets of rounds: back to back (the next request once every socket has the last), where a
socket's check of its session, kept for `RECHECK_SECONDS`, is fresh for most pushes; and
spaced by more than `RECHECK_SECONDS`, as approvals come in a quiet inbox, where every socket
checks its session before every push.

The sockets are 50 reviewers' (rita and 49 copies of her made for the benchmark, each with her
session's data signed for its own user: 50 logins would add 50 password hashes to the
set-up): each socket's check reads its own session and user, as 50 people's would.

`BENCH_PUSH_SPLIT=1 python -m bench --only push` adds where the time goes: the cluster's
processes load `bench/push_split/sitecustomize.py`, which stamps each request's event in the
worker (published, sent to Redis) and in each web process (a socket's message arrived, the
row's render asked and done, a frame sent), and a row gives the medians per stage. Off by
default: the stamps are file writes on the push's path (a few ms per event).
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import statistics
import time
from collections import defaultdict
from pathlib import Path

from websockets.asyncio.client import ClientConnection, connect

from agentsite.cluster import Cluster
from bench.harness import Config, Row, percentile
from engine.access import RECHECK_SECONDS
from tests.cluster import Person, cluster_rows, running_cluster, served_sockets

BENCHMARK = "approval push"
INBOX = "/ws/inbox/?show=pending"
GOAL_P99 = 0.100
ROW = re.compile(r'id="request-(\d+)"')
# The spaced rounds wait this long between requests: every socket's check has aged by then.
SPACED_SECONDS = RECHECK_SECONDS + 0.5
SESSION_COOKIE = "sessionid"
# Production's defaults where the tests' cluster shortens them, the demo's agents (not the
# benchmark agents this process registered), the demo model at once, no rate limit.
ENV = {
    "AGENTSITE_HEARTBEAT_SECONDS": "5",
    "AGENTSITE_PROCESS_TIMEOUT": "15",
    "AGENTSITE_SHUTDOWN_GRACE": "10",
    "AGENTSITE_SWEEP_SECONDS": "60",
    "AGENTSITE_AGENTS": "support=demo.agents.support_desk",
    "AGENTSITE_DEMO_STREAM_DELAY": "0",
    "LOG_LEVEL": "WARNING",
}

# Per socket, when each request's row arrived (time.time()).
Arrivals = list[dict[int, float]]


SPLIT_FOLDER = Path(__file__).parent / "push_split"
# The stages the stamps name (bench/push_split/sitecustomize.py), in the order they happen:
# (stage, which of a request's stamps: the first or the last over every process).
STAGES = [
    ("publish", min, "the worker publishes"),
    ("sent", min, "its group_send to the inbox returned"),
    ("dispatch", min, "the first socket's message arrived"),
    ("dispatch", max, "the last socket's"),
    ("render", min, "the row's render asked"),
    ("rendered", min, "rendered"),
    ("framed", min, "the first frame sent"),
    ("framed", max, "the last frame sent"),
]


def run(config: Config) -> list[Row]:
    reviewers = config.pick(10, 50)
    rounds = config.pick(5, 20)
    spaced_rounds = config.pick(3, 10)
    env = dict(ENV)
    stamps = config.workdir / "push-stamps"
    if os.environ.get("BENCH_PUSH_SPLIT"):
        path = os.environ.get("PYTHONPATH", "")
        env["PYTHONPATH"] = f"{SPLIT_FOLDER}{os.pathsep}{path}" if path else str(SPLIT_FOLDER)
        env["BENCH_PUSH_STAMPS"] = str(stamps)
    with running_cluster(env=env) as cluster:
        alice = Person.signed_in(cluster.url, "alice")
        rita = Person.signed_in(cluster.url, "rita")
        sessions = _reviewers_sessions(cluster, rita, reviewers)
        before = [served_sockets(web, "/ws/inbox/") for web in cluster.web]
        _warm_up, back_to_back, spaced = asyncio.run(
            _measure(alice, rita, sessions, [(rounds, 0.0), (spaced_rounds, SPACED_SECONDS)])
        )
        spread = [
            served_sockets(web, "/ws/inbox/") - b
            for web, b in zip(cluster.web, before, strict=True)
        ]
        created = {
            pk: when.timestamp()
            for pk, when in cluster_rows(
                cluster, "SELECT id, created FROM approvals_approvalrequest"
            )
        }
    rows = []
    if "BENCH_PUSH_STAMPS" in env:
        rows.append(_split(stamps, created, back_to_back + spaced))
    over = " + ".join(map(str, spread))
    sockets = f"{reviewers} reviewers' sockets, a session each, over the web processes ({over})"
    return [
        *rows,
        _row(f"{sockets}, {rounds} requests back to back", back_to_back, created, rounds),
        _row(
            f"{sockets}, {spaced_rounds} requests {SPACED_SECONDS:g} s apart (every socket "
            "checks its session first)",
            spaced,
            created,
            spaced_rounds,
        ),
    ]


def _row(case: str, arrived: Arrivals, created: dict[int, float], rounds: int) -> Row:
    delays = [at - created[pk] for socket in arrived for pk, at in socket.items()]
    # Where the time goes: to the first socket (the worker's commit, Redis, one web process's
    # render), then from the first socket to the last (the fan-out over every socket).
    per_request: dict[int, list[float]] = {}
    for socket in arrived:
        for pk, at in socket.items():
            per_request.setdefault(pk, []).append(at - created[pk])
    first = statistics.median(min(times) for times in per_request.values())
    fan_out = statistics.median(max(times) - min(times) for times in per_request.values())
    missing = len(arrived) * rounds - len(delays)
    p50, p99 = percentile(delays, 50), percentile(delays, 99)
    verdict = "met" if p99 <= GOAL_P99 and not missing else "MISSED"
    return Row(
        BENCHMARK,
        case,
        f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms",
        "—",
        "—",
        f"p99 ≤ {GOAL_P99 * 1000:.0f} ms, none lost: {verdict}",
        "from a request's creation in a worker (its pause's transaction) to its row on each "
        "open inbox socket through Redis, the web processes and nginx; "
        f"{len(delays)} samples, {missing} rows that never arrived; per request (medians): "
        f"{first * 1000:.1f} ms to the first socket, {fan_out * 1000:.1f} ms more to the "
        "last",
    )


def _split(stamps: Path, created: dict[int, float], arrived: Arrivals) -> Row:
    """The medians over every request of each stage's time after the request's creation."""
    seen: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in stamps.parent.glob(f"{stamps.name}.*"):
        for line in path.read_text().splitlines():
            stamped, stage, request_id = line.split()
            seen[int(request_id)][stage].append(float(stamped))
    for socket in arrived:
        for pk, at in socket.items():
            seen[pk]["arrived"].append(at)
    parts = []
    for stage, pick, words in [
        *STAGES,
        ("arrived", min, "here: the first"),
        ("arrived", max, "the last"),
    ]:
        times = [
            (pick(stages[stage]) - created[pk]) * 1000
            for pk, stages in seen.items()
            if stages.get(stage) and pk in created
        ]
        if times:
            parts.append(f"{words} {statistics.median(times):.1f}")
    return Row(
        BENCHMARK,
        f"where the time goes, both sets ({len(seen)} requests)",
        "—",
        "—",
        "—",
        "",
        "medians, ms after the request's creation: " + ", ".join(parts),
    )


def _reviewers_sessions(cluster: Cluster, person: Person, count: int) -> list[str]:
    """`count` session keys of as many reviewers: `person`'s own, and one each of `count` - 1
    reviewers made for the benchmark as copies of her (her groups and permissions, her
    password, so the same session hash holds), each signed in as after a login of her own
    (her session's data with the user changed, signed with the cluster's key)."""
    from django.contrib.sessions.backends.db import SessionStore
    from django.core import signing

    secret = cluster._secret_key()
    salt = "django.contrib.sessions." + SessionStore.__qualname__  # SessionBase.key_salt
    own = next(cookie.value for cookie in person.jar if cookie.name == SESSION_COOKIE)
    assert own, f"{person.username} has no session cookie"
    [(data, expires)] = cluster_rows(
        cluster, "SELECT session_data, expire_date FROM django_session WHERE session_key = %s", own
    )
    session = signing.loads(data, key=secret, salt=salt, serializer=signing.JSONSerializer)
    keys = [own]
    for number in range(1, count):
        [(user_id,)] = cluster_rows(
            cluster,
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, "
            "email, is_staff, is_active, date_joined) SELECT password, is_superuser, %s, '', '', "
            "'', is_staff, is_active, now() FROM auth_user WHERE username = %s RETURNING id",
            f"{person.username}-{number}",
            person.username,
        )
        for table, column in (
            ("auth_user_groups", "group_id"),
            ("auth_user_user_permissions", "permission_id"),
        ):
            cluster_rows(
                cluster,
                f"INSERT INTO {table} (user_id, {column}) SELECT %s, {column} FROM {table} "
                "JOIN auth_user ON auth_user.id = user_id WHERE username = %s RETURNING 1",
                user_id,
                person.username,
            )
        key = secrets.token_hex(16)
        signed = signing.dumps(
            {**session, "_auth_user_id": str(user_id)},
            key=secret,
            salt=salt,
            serializer=signing.JSONSerializer,
            compress=True,
        )
        cluster_rows(
            cluster,
            "INSERT INTO django_session (session_key, session_data, expire_date) "
            "VALUES (%s, %s, %s) RETURNING session_key",
            key,
            signed,
            expires,
        )
        keys.append(key)
    return keys


async def _socket(person: Person, session_key: str) -> ClientConnection:
    """An inbox socket through nginx on the session `session_key` (`person`'s other cookies)."""
    cookies = "; ".join(
        f"{cookie.name}={session_key if cookie.name == SESSION_COOKIE else cookie.value}"
        for cookie in person.jar
    )
    return await connect(
        person.url.replace("http://", "ws://") + INBOX,
        additional_headers={"Cookie": cookies, "Origin": person.url},
        open_timeout=10,
    )


async def _measure(
    alice: Person, rita: Person, sessions: list[str], sets: list[tuple[int, float]]
) -> list[Arrivals]:
    """For each set of (rounds, seconds between requests), the arrivals of its requests."""
    sockets = [await _socket(rita, key) for key in sessions]
    arrived: Arrivals = [{} for _ in sockets]

    async def listen(index: int) -> None:
        async for frame in sockets[index]:
            now = time.time()
            for pk in ROW.findall(str(frame)):
                arrived[index].setdefault(int(pk), now)

    listeners = [asyncio.create_task(listen(n)) for n in range(len(sockets))]
    results: list[Arrivals] = []
    try:
        # One untimed request first: each web process's first push compiles the row's
        # templates and opens its connections, once in its life (a twentieth of the samples,
        # which would be the p99 of the set).
        for rounds, pause in [(1, 0.0), *sets]:
            seen = [set(socket) for socket in arrived]
            for _ in range(rounds):
                await asyncio.sleep(pause)
                counts = sum(len(socket) for socket in arrived)
                session_id = await asyncio.to_thread(alice.new_conversation)
                await asyncio.to_thread(alice.say, session_id, "cancel order 42", htmx=True)
                # One request at a time: wait until every socket has it (or give up on it).
                deadline = time.monotonic() + 10
                while sum(len(socket) for socket in arrived) < counts + len(sockets):
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.01)
            results.append(
                [
                    {pk: at for pk, at in socket.items() if pk not in old}
                    for socket, old in zip(arrived, seen, strict=True)
                ]
            )
    finally:
        for socket in sockets:
            await socket.close()
        for listener in listeners:
            listener.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
    return results
