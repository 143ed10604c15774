"""Scaling: turns per second with 1 and with 2 workers, on a CPU-bound model, on the cluster
`make cluster` starts (agentsite/cluster.py).

The model is the demo's, after `CPU_SECONDS` of pure-Python work per call
(`CpuBoundDemoModel`, the cluster's `AGENTSITE_OFFLINE_MODEL`): a turn ("where is order 44":
the model asks for `lookup_order`, then replies) costs the worker two such calls plus
agentsite's own path, all CPU. Each round stops the workers, has alice send N messages (N
runs queued, one per conversation), starts 1 or 2 workers and waits until every run
completed; rounds alternate 1, 2, 1, 2, ... Throughput is N ÷ the time from the first claim
(the first task's `started_at`) to the last run's end (its `finished`), so a worker's start
is not counted.

Measured twice: with `AGENTSITE_WORKER_CONCURRENCY=1` (one run at a time per worker: what a
CPU-bound model wants, and what the goal is about: do two processes do twice the work), and
at the default concurrency, where a worker claims up to 50 queued runs as soon as it starts:
on runs queued beforehand the first worker up takes them all before the second has booted,
and runs that are all CPU gain nothing from overlapping on one event loop.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from agents.items import TResponseStreamEvent
from django.conf import settings

from bench.harness import Config, Row
from demo.model import OfflineDemoModel
from tests.cluster import Person, cluster_rows, running_cluster

BENCHMARK = "scaling"
CPU_SECONDS = 0.05  # per model call
GOAL = 1.7
CONCURRENCY = "AGENTSITE_WORKER_CONCURRENCY"
ENV = {
    "AGENTSITE_HEARTBEAT_SECONDS": "5",
    "AGENTSITE_PROCESS_TIMEOUT": "15",
    "AGENTSITE_SWEEP_SECONDS": "60",
    "AGENTSITE_AGENTS": "support=demo.agents.support_desk",
    "AGENTSITE_DEMO_STREAM_DELAY": "0",
    "AGENTSITE_OFFLINE_MODEL": "bench.scaling.CpuBoundDemoModel",
    "LOG_LEVEL": "WARNING",
}


def burn(seconds: float) -> None:
    """Spend `seconds` of this process's CPU time (not wall time) in Python."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class CpuBoundDemoModel(OfflineDemoModel):
    """The offline demo model, after `CPU_SECONDS` of computation per call, on the event loop
    as a model computed in the process would be."""

    async def get_response(self, *args: Any, **kwargs: Any) -> Any:
        burn(CPU_SECONDS)
        return await super().get_response(*args, **kwargs)

    async def stream_response(
        self, *args: Any, **kwargs: Any
    ) -> AsyncIterator[TResponseStreamEvent]:
        burn(CPU_SECONDS)
        async for event in super().stream_response(*args, **kwargs):
            yield event


def run(config: Config) -> list[Row]:
    turns = config.pick(10, 40)
    rounds = config.pick(1, 3)
    rows = []
    for concurrency in ("1", None):
        env = dict(ENV) if concurrency is None else {**ENV, CONCURRENCY: concurrency}
        rates: dict[int, list[float]] = {1: [], 2: []}
        with running_cluster(env=env, workers=2) as cluster:
            alice = Person.signed_in(cluster.url, "alice")
            for _ in range(rounds):
                for workers in (1, 2):
                    rates[workers].append(_round(cluster, alice, workers, turns))
        ratios = [two / one for one, two in zip(rates[1], rates[2], strict=True)]
        ratio = statistics.median(ratios)
        goal = f"≥ {GOAL}× (2 workers on 2 cores): {'met' if ratio >= GOAL else 'MISSED'}"
        rows.append(
            Row(
                BENCHMARK,
                f"{turns} turns, CPU-bound model ({CPU_SECONDS * 1000:.0f} ms CPU per call), "
                f"2 workers ÷ 1, {rounds} round(s), "
                + (
                    f"{CONCURRENCY}={concurrency}"
                    if concurrency
                    else f"default concurrency ({settings.AGENTSITE_WORKER_CONCURRENCY})"
                ),
                "2 workers: " + ", ".join(f"{rate:.1f}" for rate in rates[2]) + " turns/s",
                "1 worker: " + ", ".join(f"{rate:.1f}" for rate in rates[1]) + " turns/s",
                f"{ratio:.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]",
                goal if concurrency else "(reference)",
                "turns per second of the cluster's workers on runs queued beforehand, from the "
                "first claim to the last run's end, 2 workers ÷ 1 (ratio column: the median "
                "over rounds, and the lowest and highest); ideal 2.00× on 2 free cores, less "
                "what the web processes, PostgreSQL and the machine's other work take"
                + (
                    ""
                    if concurrency
                    else "; at the default concurrency the first worker up claims every "
                    "queued run before the second has booted"
                ),
            )
        )
    return rows


def _round(cluster: Any, alice: Person, workers: int, turns: int) -> float:
    for worker in cluster.worker:
        worker.stop()
    first = int(cluster_rows(cluster, "SELECT coalesce(max(id), 0) FROM approvals_agentrun")[0][0])
    [(since,)] = cluster_rows(cluster, "SELECT now()")
    for _ in range(turns):
        alice.say(alice.new_conversation(), "where is order 44")
    for worker in cluster.worker[:workers]:
        worker.spawn()
    for worker in cluster.worker[:workers]:
        worker.wait()
    deadline = time.monotonic() + 300
    while True:
        [(done, failed)] = cluster_rows(
            cluster,
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status NOT IN ('queued', 'running', 'completed')) "
            "FROM approvals_agentrun WHERE id > %s",
            first,
        )
        assert not failed, f"{failed} run(s) did not complete"
        if done == turns:
            break
        assert time.monotonic() < deadline, f"{done} of {turns} runs completed in 300 s"
        time.sleep(0.1)
    [(start,)] = cluster_rows(
        cluster,
        "SELECT min(started_at) FROM django_tasks_database_dbtaskresult WHERE enqueued_at >= %s",
        since,
    )
    [(end,)] = cluster_rows(
        cluster, "SELECT max(finished) FROM approvals_agentrun WHERE id > %s", first
    )
    return turns / (end - start).total_seconds()
