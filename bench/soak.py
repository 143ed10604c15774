"""Soak: turns that each wait for a reviewer, paced over minutes, on the cluster `make cluster`
starts (agentsite/cluster.py: PostgreSQL, Redis, 2 web processes, 2 workers, nginx); then
everything is accounted for from the cluster's database and logs.

Who asks: alice and four of the demo's customers (bruno, chen, grace, hugo: the benchmark
gives them passwords through the cluster's database), each in conversations of their own,
each turn a refund on an order of theirs ("refund $0.01 on order 42 (soak turn 17)"). A first
turn per order refunds $50.01, approved, so that every later refund brings the order's
refunds above the $50 threshold and waits for a reviewer (demo/tools.py): every turn pauses
once and resumes once. Who decides: rita and the demo's admin, whose inbox sockets (through
nginx) show each request as it appears; they decide it over HTTP as the request page's form
does, rejecting every `REJECT_EVERY`th request (by id) and approving the rest; their inbox
page, read every few seconds, is the backstop for a push that never came (counted).

Pace: paced turn i is sent at i × duration ÷ turns, into an idle conversation (its last run
finished; a person has `CONVERSATIONS_EACH` at once, and opens a new one after
`TURNS_PER_CONVERSATION` turns); when none is idle the turn waits, and the achieved rate says
so. Every `SAMPLE_SECONDS`: the cluster database's connections (pg_stat_activity, the
benchmark's own excluded), Redis's connected_clients (its own excluded), and the resident
memory (VmRSS) and open files of every web and worker process; one sample more when the
warm-up's last turn ends (the start of the memory comparison) and one at the end.

Afterwards, from the database: each message accepted has exactly one run, completed, with its
reply; each run paused once, its request decided once, as the reviewer chose; each approved
call refunded exactly once (`OrderEvent`, keyed on the tool call's id), each rejected call
never, and nothing else refunded; each order's refunded total is the sum of its refunds. From
the clients and nginx's access log: no response ≥ 500.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
import redis

from agentsite.cluster import Cluster
from bench.harness import Config, Row
from tests.cluster import Person, give_password, process_memory, running_cluster

BENCHMARK = "soak"
# What the accounting counts after a soak; each must be 0.
CHECKS = (
    "lost",
    "duplicated",
    "not completed",
    "paused other than once",
    "decided other than once",
    "refunded twice",
    "approved, never refunded",
    "rejected, refunded",
    "refunded unasked",
    "totals",
    "5xx",
    "client failures",
)
# Production's timings where the tests' cluster shortens them, the demo's agents, the demo
# model at once (no pause between streamed words), no rate limit (the tests' cluster's).
ENV = {
    "AGENTSITE_HEARTBEAT_SECONDS": "5",
    "AGENTSITE_PROCESS_TIMEOUT": "15",
    "AGENTSITE_SHUTDOWN_GRACE": "10",
    "AGENTSITE_SWEEP_SECONDS": "60",
    "AGENTSITE_AGENTS": "support=demo.agents.support_desk",
    "AGENTSITE_DEMO_STREAM_DELAY": "0",
    "LOG_LEVEL": "WARNING",
}
# Who asks, and the order of theirs the refunds go to (demo/seed.py: none refunded yet).
CUSTOMERS = {"alice": 42, "bruno": 3, "chen": 7, "grace": 31, "hugo": 58}
REVIEWERS = ("rita", "admin")  # admin: the demo's superuser, who may decide too
PASSWORD = "soak-bench-pass"
FIRST_REFUND = Decimal("50.01")  # above the threshold alone: approved, it puts the order above
REFUND = Decimal("0.01")  # every later turn: the order's refunds stay above the threshold
REJECT_EVERY = 10
REJECTION = "Not this one (soak)."
CONVERSATIONS_EACH = 3
TURNS_PER_CONVERSATION = 10
DECIDERS_EACH = 2  # requests a reviewer has open at once
SAMPLE_SECONDS = 10.0
PAGE_SECONDS = 5.0  # the reviewers' inbox page, read as a backstop to the pushes
TURN_TIMEOUT = 120.0
# The memory goal after the warm-up, per process: see docs/benchmarks.md for why 20 MiB.
RSS_GROWTH_LIMIT = 20 * 2**20
FINISHED = ("completed", "failed", "cancelled", "guardrail")
PENDING_ROW = re.compile(r'id="request-(\d+)" class="row row-pending"')
SEEN_HASH = re.compile(r'name="seen_hash" value="([0-9a-f]{64})"')
ACCESS_STATUS = re.compile(r'^\S+ \[[^]]+\] "[^"]*" (\d{3}) ', re.MULTILINE)
SOAK_APPLICATION = "agentsite-soak"  # the benchmark's own database connections


@dataclass
class Slot:
    """One conversation a person keeps open; a new one after `TURNS_PER_CONVERSATION`."""

    person: Person
    order: int
    session_id: str = ""
    turns: int = 0


@dataclass
class Sample:
    at: float  # seconds since the paced turns began (negative: during the first refunds)
    turns: int  # paced turns finished by then
    postgres: int
    redis: int
    processes: dict[str, tuple[int, int]]  # name → (RSS bytes, open files)


@dataclass
class Soak:
    cluster: Cluster
    turns: int
    seconds: float
    warmup: int
    statuses: Counter[int] = field(default_factory=Counter)  # every answer the clients got
    failures: list[str] = field(default_factory=list)  # what went wrong on the clients' side
    sent: list[tuple[str, str]] = field(default_factory=list)  # (session, text) accepted
    expected: dict[str, int] = field(default_factory=dict)  # session → messages accepted
    finished: dict[str, int] = field(default_factory=dict)  # session → runs finished
    chosen: dict[int, bool] = field(default_factory=dict)  # request id → approved
    pushed: set[int] = field(default_factory=set)  # requests an inbox socket showed
    offered: set[int] = field(default_factory=set)
    from_page: int = 0  # requests the inbox page showed before any socket did
    reconnects: int = 0
    priming: bool = True
    done: int = 0  # paced turns finished
    latencies: list[float] = field(default_factory=list)
    lag: float = 0.0  # the longest a paced turn waited past its time for an idle conversation
    samples: list[Sample] = field(default_factory=list)
    warm_sample: Sample | None = None
    began: float = 0.0
    ended: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- HTTP, every answer counted ---------------------------------------------------------

    def _http(
        self, person: Person, path: str, data: dict[str, str] | None = None
    ) -> tuple[int, str, str]:
        try:
            answer = person.get(path) if data is None else person.post(path, data)
        except OSError as error:  # refused, reset, timed out: no answer at all
            self._fail(f"{'POST' if data else 'GET'} {path} by {person.username}: {error!r}")
            return 0, "", ""
        with self._lock:
            self.statuses[answer[0]] += 1
        return answer

    def _fail(self, what: str) -> None:
        with self._lock:
            self.failures.append(what)

    def _new_conversation(self, person: Person) -> str:
        status, _, url = self._http(person, "/chats/new/", {"agent": ""})
        if status != 200:
            self._fail(f"{person.username}: a new conversation answered {status}")
            return ""
        return urllib.parse.urlsplit(url).path.strip("/").split("/")[-1]

    def _decide(self, reviewer: Person, pk: int, approve: bool) -> None:
        status, page, _ = self._http(reviewer, f"/inbox/{pk}/")
        seen = SEEN_HASH.search(page)
        if status != 200 or not seen:
            self._fail(f"request {pk}: its page answered {status} with no decision form")
            return
        form = {"action": "approve" if approve else "reject", "seen_hash": seen[1]}
        if not approve:
            form["message"] = REJECTION
        status, answer, _ = self._http(reviewer, f"/inbox/{pk}/decide/", form)
        if status != 200 or "Already" in answer:
            self._fail(f"request {pk}: the decision answered {status}: {answer[:200]!r}")
            return
        with self._lock:
            self.chosen[pk] = approve

    # --- the people -------------------------------------------------------------------------

    async def _turn(self, slot: Slot, amount: Decimal, label: str) -> bool:
        """One message in `slot`'s conversation, until its run has finished."""
        if not slot.session_id or slot.turns >= TURNS_PER_CONVERSATION:
            slot.session_id = await asyncio.to_thread(self._new_conversation, slot.person)
            slot.turns = 0
            if not slot.session_id:
                return False
        session = slot.session_id
        text = f"refund ${amount} on order {slot.order} ({label})"
        began = time.monotonic()
        status, page, _ = await asyncio.to_thread(
            self._http, slot.person, f"/chats/{session}/messages/", {"text": text}
        )
        if status != 200:
            self._fail(f"{label}: the message answered {status}: {page[:200]!r}")
            slot.session_id = ""  # its state is unknown: the next turn opens a new one
            return False
        self.sent.append((session, text))
        self.expected[session] = self.expected.get(session, 0) + 1
        slot.turns += 1
        while self.finished.get(session, 0) < self.expected[session]:
            if time.monotonic() - began > TURN_TIMEOUT:
                self._fail(f"{label}: its run had not finished after {TURN_TIMEOUT:g} s")
                return False
            await asyncio.sleep(0.05)
        self.latencies.append(time.monotonic() - began)
        return True

    async def _paced(self, slot: Slot, number: int, idle: asyncio.Queue[Slot]) -> None:
        if await self._turn(slot, REFUND, f"soak turn {number}"):
            self.done += 1
            if self.done == self.warmup:
                self.warm_sample = await asyncio.to_thread(self._sample)
                self.samples.append(self.warm_sample)
            idle.put_nowait(slot)
        elif not slot.session_id:
            idle.put_nowait(slot)  # not started: the slot opens a new conversation
        # A turn whose run never finished keeps its slot: that conversation stays busy.

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(64, thread_name_prefix="soak"))
        customers = {
            name: await asyncio.to_thread(Person.signed_in, self.cluster.url, name)
            for name in CUSTOMERS
        }
        reviewers = [
            await asyncio.to_thread(Person.signed_in, self.cluster.url, name) for name in REVIEWERS
        ]
        queue: asyncio.Queue[int] = asyncio.Queue()
        background = [asyncio.create_task(self._watch(r, queue)) for r in reviewers]
        background += [
            asyncio.create_task(self._decider(r, queue))
            for r in reviewers
            for _ in range(DECIDERS_EACH)
        ]
        background += [
            asyncio.create_task(self._read_page(reviewers[0], queue)),
            asyncio.create_task(self._poll_runs()),
            asyncio.create_task(self._sample_every()),
        ]
        try:
            await asyncio.sleep(1)  # the inbox sockets open
            # The first refund of each order, approved: from then on every refund waits.
            firsts = [Slot(person, CUSTOMERS[name]) for name, person in customers.items()]
            results = await asyncio.gather(
                *(self._turn(slot, FIRST_REFUND, "soak, first") for slot in firsts)
            )
            assert all(results), f"the first refunds did not all end: {self.failures[:5]}"
            self.priming = False
            slots = [
                Slot(person, CUSTOMERS[name])
                for _ in range(CONVERSATIONS_EACH)
                for name, person in customers.items()
            ]
            slots[: len(firsts)] = firsts  # their conversations go on
            idle: asyncio.Queue[Slot] = asyncio.Queue()
            for slot in slots:
                idle.put_nowait(slot)
            self.samples.append(await asyncio.to_thread(self._sample))
            self.began = time.monotonic()
            turns = []
            for number in range(self.turns):
                due = self.began + number * self.seconds / self.turns
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                slot = await idle.get()
                self.lag = max(self.lag, time.monotonic() - due)
                turns.append(asyncio.create_task(self._paced(slot, number, idle)))
            await asyncio.gather(*turns)
            self.ended = time.monotonic()
            await asyncio.sleep(2)  # the last pushes and exports settle
            self.samples.append(await asyncio.to_thread(self._sample))
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    # --- the reviewers ----------------------------------------------------------------------

    def _offer(self, pk: int, queue: asyncio.Queue[int]) -> None:
        if pk not in self.offered:
            self.offered.add(pk)
            queue.put_nowait(pk)

    async def _watch(self, reviewer: Person, queue: asyncio.Queue[int]) -> None:
        """The reviewer's open inbox: every pending row it is sent is offered to decide."""
        while True:
            try:
                socket = await reviewer.socket("/ws/inbox/?show=pending")
            except Exception as error:  # refused, or answered without an upgrade
                self._fail(f"{reviewer.username}'s inbox socket did not open: {error!r}")
                await asyncio.sleep(1)
                continue
            try:
                async for frame in socket:
                    for pk in map(int, PENDING_ROW.findall(str(frame))):
                        self.pushed.add(pk)
                        self._offer(pk, queue)
            except Exception as error:  # closed under it: count it, open another
                self._fail(f"{reviewer.username}'s inbox socket closed: {error!r}")
            finally:
                await socket.close()
            self.reconnects += 1

    async def _read_page(self, reviewer: Person, queue: asyncio.Queue[int]) -> None:
        while True:
            await asyncio.sleep(PAGE_SECONDS)
            _, page, _ = await asyncio.to_thread(self._http, reviewer, "/inbox/")
            for pk in map(int, PENDING_ROW.findall(page)):
                if pk not in self.offered:
                    self.from_page += 1
                    self._offer(pk, queue)

    async def _decider(self, reviewer: Person, queue: asyncio.Queue[int]) -> None:
        while True:
            pk = await queue.get()
            approve = self.priming or pk % REJECT_EVERY != 0
            await asyncio.to_thread(self._decide, reviewer, pk, approve)

    # --- watching the cluster ---------------------------------------------------------------

    async def _poll_runs(self) -> None:
        """How many runs of each conversation have finished, five times a second."""
        connection = await asyncio.to_thread(self._connect)
        try:
            while True:
                rows = await asyncio.to_thread(
                    lambda: connection.execute(
                        "SELECT c.session_id, count(*) FROM approvals_agentrun r "
                        "JOIN conversations_conversation c ON c.id = r.conversation_id "
                        "WHERE r.status = ANY(%s) GROUP BY c.session_id",
                        (list(FINISHED),),
                    ).fetchall()
                )
                self.finished = dict(rows)
                await asyncio.sleep(0.2)
        finally:
            connection.close()

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.cluster.database_url, autocommit=True, application_name=SOAK_APPLICATION
        )

    async def _sample_every(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_SECONDS)
            self.samples.append(await asyncio.to_thread(self._sample))

    def _sample(self) -> Sample:
        with self._connect() as connection:
            [(postgres,)] = connection.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = 'agentsite' "
                "AND application_name <> %s",
                (SOAK_APPLICATION,),
            ).fetchall()
        client = redis.Redis.from_url(self.cluster.redis_url)
        try:
            clients = int(client.info("clients")["connected_clients"]) - 1  # this one
        finally:
            client.close()
        processes = {}
        for service in self.cluster.web + self.cluster.worker:
            if not service.running():
                self._fail(f"{service.name} is not running")
                continue
            processes[service.name] = process_memory(service.pid)
        at = time.monotonic() - self.began if self.began else -1.0
        return Sample(at, self.done, postgres, clients, processes)


# --- accounting -------------------------------------------------------------------------------


def account(cluster: Cluster, soak: Soak) -> dict[str, list[str]]:
    """What the database and the logs say against what the clients did: each check's name
    with the problems it found (none: an empty list)."""
    with psycopg.connect(cluster.database_url, autocommit=True) as connection:

        def rows(sql: str, *params: object) -> list[tuple[Any, ...]]:
            return list(connection.execute(sql, params).fetchall())

        runs = rows(
            "SELECT r.id, c.session_id, r.input, r.status, r.final_output, r.pause_count "
            "FROM approvals_agentrun r JOIN conversations_conversation c "
            "ON c.id = r.conversation_id"
        )
        requests = rows("SELECT id, run_id, call_id, status FROM approvals_approvalrequest")
        decisions: dict[int, list[bool]] = {}
        for pk, approved in rows("SELECT request_id, approved FROM approvals_approvaldecision"):
            decisions.setdefault(pk, []).append(approved)
        events = rows("SELECT tool_call_id, kind, amount, order_id FROM demo_orderevent")
        orders = rows(
            "SELECT id, number, refunded_amount FROM demo_order WHERE number = ANY(%s)",
            list(CUSTOMERS.values()),
        )
        replies = dict(
            rows(
                "SELECT c.session_id, count(*) FROM conversations_sessionitem i "
                "JOIN conversations_conversation c ON c.id = i.conversation_id "
                "WHERE i.payload->>'role' = 'assistant' GROUP BY c.session_id"
            )
        )
    problems: dict[str, list[str]] = {name: [] for name in CHECKS}
    # Each message accepted: exactly one run of its conversation with its text, completed.
    run_of: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for run in runs:
        run_of.setdefault((run[1], run[2]), []).append(run)
    sent = Counter(soak.sent)
    for key, count in sent.items():
        found = run_of.get(key, [])
        if len(found) < count:
            problems["lost"].append(f"{key}: {count} sent, {len(found)} run(s)")
    for key, found in run_of.items():
        if len(found) > sent.get(key, 0):
            problems["duplicated"].append(f"{key}: {len(found)} runs, {sent.get(key, 0)} sent")
        for run in found:
            if run[3] != "completed" or not run[4]:
                problems["not completed"].append(f"run {run[0]}: {run[3]}, reply {run[4]!r}")
    runs_per_session = Counter(run[1] for run in runs)
    for session, count in runs_per_session.items():
        if replies.get(session, 0) != count:
            problems["lost"].append(
                f"{session}: {count} runs, {replies.get(session, 0)} assistant replies stored"
            )
    # Each run paused once; its request decided once, as the reviewer chose.
    requests_of = Counter(request[1] for request in requests)
    for run in runs:
        if run[5] != 1 or requests_of[run[0]] != 1:
            problems["paused other than once"].append(
                f"run {run[0]}: {run[5]} pause(s), {requests_of[run[0]]} request(s)"
            )
    approved_calls: set[str] = set()
    rejected_calls: set[str] = set()
    for pk, _, call_id, status in requests:
        made = decisions.get(pk, [])
        chosen = soak.chosen.get(pk)
        if chosen is None or made != [chosen]:
            problems["decided other than once"].append(
                f"request {pk} ({status}): decisions {made}, the reviewer chose {chosen}"
            )
        (approved_calls if status == "approved" else rejected_calls).add(call_id)
    # Each approved call refunded exactly once, each rejected call never, nothing else.
    refunds = Counter(event[0] for event in events)
    for call_id in approved_calls:
        if refunds[call_id] > 1:
            problems["refunded twice"].append(f"{call_id}: {refunds[call_id]} refunds")
        elif refunds[call_id] == 0:
            problems["approved, never refunded"].append(call_id)
    for call_id in rejected_calls:
        if refunds[call_id]:
            problems["rejected, refunded"].append(call_id)
    for call_id in set(refunds) - approved_calls - rejected_calls:
        problems["refunded unasked"].append(call_id)
    for order_id, number, refunded in orders:
        total = sum((e[2] for e in events if e[3] == order_id), Decimal("0"))
        if total != refunded:
            problems["totals"].append(f"order {number}: {refunded} refunded, events say {total}")
    # No answer ≥ 500, at the clients or in nginx's log.
    for status, count in soak.statuses.items():
        if status >= 500:
            problems["5xx"].append(f"{count} × {status} at the clients")
    logged = Counter(int(s) for s in ACCESS_STATUS.findall(nginx_log(cluster)))
    for status, count in logged.items():
        if status >= 500:
            problems["5xx"].append(f"{count} × {status} in nginx's access log")
    problems["client failures"] = list(soak.failures)
    return problems


def nginx_log(cluster: Cluster) -> str:
    path = cluster.logs / "nginx-access.log"
    return path.read_text(errors="replace") if path.exists() else ""


def error_lines(cluster: Cluster) -> int:
    """Lines of the web processes' and workers' logs that report an error."""
    return sum(
        1
        for service in cluster.web + cluster.worker
        for line in service.log().splitlines()
        if "Traceback" in line or " ERROR " in line or line.startswith("ERROR")
    )


# --- the rows ---------------------------------------------------------------------------------


def mib(size: float) -> str:
    return f"{size / 2**20:.1f}"


def run(config: Config) -> list[Row]:
    turns = config.pick(100, 2000)
    seconds = config.pick(60.0, 600.0)
    warmup = config.pick(20, 100)
    with running_cluster(env=ENV) as cluster:
        for name in (*CUSTOMERS, *REVIEWERS):
            give_password(cluster, name, PASSWORD)
        soak = Soak(cluster, turns, seconds, warmup)
        load_before = _loadavg()
        asyncio.run(soak.run())
        load_after = _loadavg()
        problems = account(cluster, soak)
        errors = error_lines(cluster)
        budget = (len(cluster.web) + len(cluster.worker)) * int(
            cluster.environment().get("DATABASE_POOL_MAX_SIZE") or 10
        )
        requests = len(soak.chosen)
        rejected = sum(1 for approved in soak.chosen.values() if not approved)
    _print_samples(soak)
    return _rows(soak, problems, errors, budget, requests, rejected, (load_before, load_after))


def _loadavg() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def _rows(
    soak: Soak,
    problems: dict[str, list[str]],
    errors: int,
    budget: int,
    requests: int,
    rejected: int,
    load: tuple[str, str],
) -> list[Row]:
    paced = soak.ended - soak.began
    rate = soak.done / paced if paced > 0 else 0.0
    latencies = sorted(soak.latencies)
    p50 = statistics.median(latencies) if latencies else 0.0
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
    counts = ", ".join(f"{name} {len(problems[name])}" for name in CHECKS)
    clean = not any(problems[name] for name in CHECKS)
    for name in CHECKS:
        for problem in problems[name][:5]:
            print(f"soak: {name}: {problem}", file=sys.stderr)

    after = [s for s in soak.samples if s.turns >= soak.warmup]
    start = soak.warm_sample or (after[0] if after else soak.samples[0])
    end = soak.samples[-1]
    postgres = max(s.postgres for s in soak.samples)
    redis_max = max(s.redis for s in soak.samples)
    files = {
        name: (start.processes[name][1], end.processes[name][1], max_files(soak, name))
        for name in end.processes
    }
    memory = []
    grown = 0
    for name, (rss, _) in end.processes.items():
        first = start.processes[name][0]
        grown = max(grown, rss - first)
        memory.append(f"{name} {mib(first)} → {mib(rss)} MiB ({slope(soak, name)})")
    bounded = postgres <= budget
    flat = grown <= RSS_GROWTH_LIMIT
    rows = [
        Row(
            BENCHMARK,
            f"{soak.done} paced turns with approvals ({soak.turns} asked) over "
            f"{soak.seconds:.0f} s, {len(CUSTOMERS)} customers, {len(REVIEWERS)} reviewers",
            f"{rate:.2f} turns/s achieved ({soak.turns / soak.seconds:.2f} asked), turn p50 "
            f"{p50:.2f} s, p99 {p99:.2f} s",
            "—",
            "—",
            f"0 lost, 0 duplicated, 0 5xx: {'met' if clean else 'MISSED'}",
            f"{len(soak.sent)} messages accepted ({len(CUSTOMERS)} first refunds included), "
            f"{requests} requests decided ({rejected} rejected); problems found: {counts}; "
            f"{errors} error lines in the web and worker logs; longest wait for an idle "
            f"conversation {soak.lag:.1f} s; {len(soak.pushed)} requests pushed to an inbox "
            f"socket, {soak.from_page} seen on the inbox page first, "
            f"{soak.reconnects} socket reconnects; load average {load[0]} → {load[1]}",
        ),
        Row(
            BENCHMARK,
            "connections over the soak",
            f"PostgreSQL max {postgres} (start {start.postgres}, end {end.postgres}); Redis "
            f"clients max {redis_max} (start {start.redis}, end {end.redis})",
            f"budget {budget}",
            "—",
            f"PostgreSQL ≤ budget: {'met' if bounded else 'MISSED'}",
            "every 10 s: pg_stat_activity of the cluster's database and Redis's "
            "connected_clients, the benchmark's own excluded; budget = (web + worker "
            "processes) × DATABASE_POOL_MAX_SIZE; open files per process (after warm-up → end, "
            "max): " + ", ".join(f"{n} {a} → {b}, {c}" for n, (a, b, c) in files.items()),
        ),
        Row(
            BENCHMARK,
            f"resident memory per process, after {soak.warmup} turns → the end",
            "; ".join(memory),
            "—",
            "—",
            f"growth ≤ {mib(RSS_GROWTH_LIMIT)} MiB per process: {'met' if flat else 'MISSED'}",
            "VmRSS of each web and worker process when the warm-up's last turn ended and "
            "after the last turn; in brackets the least-squares slope over the samples "
            "after the warm-up, per 1,000 turns",
        ),
    ]
    return rows


def max_files(soak: Soak, name: str) -> int:
    return max(s.processes[name][1] for s in soak.samples if name in s.processes)


def slope(soak: Soak, name: str) -> str:
    points = [
        (s.turns, s.processes[name][0])
        for s in soak.samples
        if s.turns >= soak.warmup and name in s.processes
    ]
    if len({turns for turns, _ in points}) < 2:
        return "too few samples for a slope"
    fit = statistics.linear_regression([p[0] for p in points], [p[1] for p in points])
    return f"{fit.slope * 1000 / 2**20:+.1f} MiB per 1,000 turns"


def _print_samples(soak: Soak) -> None:
    names = sorted({name for s in soak.samples for name in s.processes})
    print(
        "soak samples: s, turns, postgres, redis, "
        + ", ".join(f"{n} RSS MiB/files" for n in names),
        file=sys.stderr,
    )
    for s in soak.samples:
        cells = [
            f"{mib(s.processes[n][0])}/{s.processes[n][1]}" if n in s.processes else "—"
            for n in names
        ]
        print(
            f"  {s.at:6.0f} {s.turns:5d} {s.postgres:3d} {s.redis:3d} " + " ".join(cells),
            file=sys.stderr,
        )
