"""Concurrent conversations through the cluster: N people send a message at once, on a model
that takes a fixed time per call, on the cluster `make cluster` starts (2 web processes, 2
workers, nginx; agentsite/cluster.py).

The model is the demo's, after `BENCH_MODEL_LATENCY` seconds of waiting per call
(`LatencyDemoModel`, the cluster's `AGENTSITE_OFFLINE_MODEL`). A turn ("where is order 44") is
two model calls, so the ideal wall time is 2 × the latency whatever N is; efficiency = ideal ÷
the wall time from the first message sent (through nginx, from 20 threads, as the chat page
sends it: an htmx POST answered with the composer) to the last run's end (its `finished`).
The conversations are opened beforehand, untimed. One cluster serves every case; before
each, its workers are started again with the case's latency (the web processes never call the
model), and warmed by a few untimed turns until each has run one.

The workers are `manage.py run_worker` at `AGENTSITE_WORKER_CONCURRENCY` (the default, unless
the environment this runs in sets it); the row says which, the most runs each case had in
flight at once (from the task rows' claim and end), how long the messages took to be
accepted, how long a run took from its claim to its end, and the CPU of the web processes
and of the workers (÷ N: a turn's).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django_tasks_db.models import DBTaskResult

from bench.harness import Config, Row
from demo.model import OfflineDemoModel
from tests.cluster import Person, cluster_rows, running_cluster, wait_for

BENCHMARK = "conversations"
GOAL = 0.8
ENV = {
    "AGENTSITE_HEARTBEAT_SECONDS": "5",
    "AGENTSITE_PROCESS_TIMEOUT": "15",
    "AGENTSITE_SWEEP_SECONDS": "60",
    "AGENTSITE_AGENTS": "support=demo.agents.support_desk",
    "AGENTSITE_DEMO_STREAM_DELAY": "0",
    "AGENTSITE_OFFLINE_MODEL": "bench.conversations.LatencyDemoModel",
    "LOG_LEVEL": "WARNING",
}


class LatencyDemoModel(OfflineDemoModel):
    """The offline demo model, after waiting `BENCH_MODEL_LATENCY` seconds per call (a
    remote model's latency; the event loop is free meanwhile)."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(float(os.environ.get("BENCH_MODEL_LATENCY", "0")))
        return await super().get_response(*args, **kwargs)

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(float(os.environ.get("BENCH_MODEL_LATENCY", "0")))
        async for event in super().stream_response(*args, **kwargs):
            yield event


def run(config: Config) -> list[Row]:
    # (conversations, latency per model call)
    cases = config.pick([(10, 0.2)], [(20, 2.0), (100, 2.0), (100, 0.2)])
    # The workers inherit this process's environment, and so its setting.
    concurrency = settings.AGENTSITE_WORKER_CONCURRENCY
    rows = []
    with running_cluster(env=ENV) as cluster:
        alice = Person.signed_in(cluster.url, "alice")
        for conversations, latency in cases:
            _start_workers(cluster, latency)
            _warm(cluster, alice)
            seen = _measure(cluster, alice, conversations)
            ideal = 2 * latency
            efficiency = ideal / seen.wall
            web_ms, worker_ms = (1000 * cpu / conversations for cpu in (seen.web, seen.workers))
            rows.append(
                Row(
                    BENCHMARK,
                    f"{conversations} conversations at once, model {latency:g} s per call, "
                    "2 web processes + 2 workers",
                    f"{seen.wall:.1f} s wall, {efficiency:.0%} of ideal",
                    f"ideal {ideal:.1f} s",
                    f"{seen.wall / ideal:.2f}×",
                    f"efficiency ≥ {GOAL:.0%}: {'met' if efficiency >= GOAL else 'MISSED'}",
                    "wall time from the first message to the last run's end ÷ the ideal (2 "
                    f"model calls). The messages were accepted within {seen.sent:.1f} s; a run "
                    f"took {seen.run_median:.1f} s from its claim to its end (median; "
                    f"longest {seen.run_longest:.1f} s); at most {seen.most} runs in flight at "
                    f"once (manage.py run_worker, concurrency {concurrency} per worker). CPU "
                    f"over it: web processes {seen.web:.1f} s, workers {seen.workers:.1f} s "
                    f"({web_ms:.0f} + {worker_ms:.0f} ms a turn; "
                    f"{(seen.web + seen.workers) / seen.wall:.2f} cores)",
                )
            )
    return rows


def _start_workers(cluster: Any, latency: float) -> None:
    for worker in cluster.worker:
        worker.stop()
    for worker in cluster.worker:
        worker.env["BENCH_MODEL_LATENCY"] = str(latency)
        worker.spawn()
    for worker in cluster.worker:
        worker.wait()


def _warm(cluster: Any, alice: Person) -> None:
    """A few untimed turns, until every worker has run one: a worker's first runs pay about a
    second once (the SDK's and the clients' first use), which is a start's cost, not a
    turn's."""
    for _ in range(5):
        if _warm_round(cluster, alice) == len(cluster.worker):
            return


def _warm_round(cluster: Any, alice: Person) -> int:
    """Two turns per worker, waited for; how many workers ran them."""
    table = DBTaskResult._meta.db_table
    since = time.time()
    sessions = [alice.new_conversation() for _ in range(2 * len(cluster.worker))]
    for session in sessions:
        alice.say(session, "where is order 44", htmx=True)
    count = f"SELECT count(*), count(DISTINCT worker_ids) FROM {table} "
    ended = count + "WHERE status = 'SUCCESSFUL' AND enqueued_at >= to_timestamp(%s)"
    deadline = time.monotonic() + 60
    while True:
        [(done, workers)] = cluster_rows(cluster, ended, since)
        if done == len(sessions):
            return int(workers)
        assert time.monotonic() < deadline, f"the warm-up: {done} of {len(sessions)} turns"
        time.sleep(0.1)


def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


@dataclass
class Seen:
    wall: float  # the first message sent to the last run's end
    sent: float  # the first message sent to the last run's creation (its POST answered)
    run_median: float  # a run's claim to its end
    run_longest: float
    most: int  # runs in flight at once, at most
    web: float  # CPU seconds of the web processes
    workers: float  # and of the workers


def _measure(cluster: Any, alice: Person, conversations: int) -> Seen:
    [(before,)] = cluster_rows(cluster, "SELECT coalesce(max(id), 0) FROM approvals_agentrun")
    sessions = [alice.new_conversation() for _ in range(conversations)]
    web = [service.pid for service in cluster.web]
    workers = [service.pid for service in cluster.worker]
    web_before, workers_before = _cpu_seconds(web), _cpu_seconds(workers)
    started = time.time()
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda session: alice.say(session, "where is order 44", htmx=True), sessions))
    deadline = time.monotonic() + 600
    while True:
        [(done, failed)] = cluster_rows(
            cluster,
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status NOT IN ('queued', 'running', 'completed')) "
            "FROM approvals_agentrun WHERE id > %s",
            before,
        )
        assert not failed, f"{failed} run(s) did not complete"
        if done == conversations:
            break
        assert time.monotonic() < deadline, f"{done} of {conversations} runs completed"
        time.sleep(0.1)
    web_cpu, workers_cpu = _cpu_seconds(web) - web_before, _cpu_seconds(workers) - workers_before
    # A run's row says completed a moment before its worker marks the task finished.
    wait_for(
        "the runs' tasks marked finished",
        lambda: (
            not cluster_rows(
                cluster,
                f"SELECT 1 FROM {DBTaskResult._meta.db_table} "
                "WHERE started_at >= to_timestamp(%s) AND finished_at IS NULL",
                started,
            )
        ),
    )
    [(created, end)] = cluster_rows(
        cluster, "SELECT max(created), max(finished) FROM approvals_agentrun WHERE id > %s", before
    )
    runs = sorted(
        (finished - claimed).total_seconds()
        for claimed, finished in cluster_rows(
            cluster,
            f"SELECT started_at, finished_at FROM {DBTaskResult._meta.db_table} "
            "WHERE started_at >= to_timestamp(%s)",
            started,
        )
    )
    return Seen(
        wall=end.timestamp() - started,
        sent=created.timestamp() - started,
        run_median=statistics.median(runs),
        run_longest=runs[-1],
        most=_most_in_flight(cluster, started),
        web=web_cpu,
        workers=workers_cpu,
    )


def _most_in_flight(cluster: Any, since: float) -> int:
    """The most tasks claimed and not yet ended at one instant, of those claimed since
    `since` (their rows' `started_at` and `finished_at`)."""
    spans = cluster_rows(
        cluster,
        f"SELECT started_at, finished_at FROM {DBTaskResult._meta.db_table} "
        "WHERE started_at >= to_timestamp(%s)",
        since,
    )
    edges = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans if f is not None])
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most
