"""Concurrent conversations through the cluster: N people send a message at once, on a model
that takes a fixed time per call, on the cluster `make cluster` starts (2 web processes, 2
workers, nginx; agentsite/cluster.py).

The model is the demo's, after `BENCH_MODEL_LATENCY` seconds of waiting per call
(`LatencyDemoModel`, the cluster's `AGENTSITE_OFFLINE_MODEL`). A turn ("where is order 44") is
two model calls, so the ideal wall time is 2 × the latency whatever N is; efficiency = ideal ÷
the wall time from the first message sent (through nginx, from 20 threads) to the last run's
end (its `finished`). The conversations are opened beforehand, untimed.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.harness import Config, Row
from demo.model import OfflineDemoModel
from tests.cluster import Person, cluster_rows, running_cluster

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
    # (conversations, latency): 100 at 2 s would take about 200 s (see the rows' meaning).
    cases = config.pick([(10, 0.2)], [(100, 0.2), (20, 2.0)])
    rows = []
    for conversations, latency in cases:
        with running_cluster(env={**ENV, "BENCH_MODEL_LATENCY": str(latency)}) as cluster:
            wall, cpu = _measure(cluster, conversations)
        ideal = 2 * latency
        efficiency = ideal / wall
        rows.append(
            Row(
                BENCHMARK,
                f"{conversations} conversations at once, model {latency:g} s per call, "
                "2 web processes + 2 workers",
                f"{wall:.1f} s wall, {efficiency:.0%} of ideal",
                f"ideal {ideal:.1f} s",
                f"{wall / ideal:.2f}×",
                f"efficiency ≥ {GOAL:.0%}: {'met' if efficiency >= GOAL else 'MISSED'}",
                "wall time from the first message to the last run's end ÷ the ideal (2 model "
                f"calls); CPU of the cluster's web and worker processes over it: {cpu}. A "
                "db_worker runs one task at a time, so N runs on 2 workers take N ÷ 2 turns "
                "one after the other",
            )
        )
    return rows


def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _measure(cluster: Any, conversations: int) -> tuple[float, str]:
    alice = Person.signed_in(cluster.url, "alice")
    sessions = [alice.new_conversation() for _ in range(conversations)]
    pids = [service.pid for service in cluster.web + cluster.worker]
    cpu_before = _cpu_seconds(pids)
    started = time.time()
    with ThreadPoolExecutor(20) as pool:
        list(pool.map(lambda session: alice.say(session, "where is order 44"), sessions))
    deadline = time.monotonic() + 600
    while True:
        [(done, failed)] = cluster_rows(
            cluster,
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "count(*) FILTER (WHERE status NOT IN ('queued', 'running', 'completed')) "
            "FROM approvals_agentrun",
        )
        assert not failed, f"{failed} run(s) did not complete"
        if done == conversations:
            break
        assert time.monotonic() < deadline, f"{done} of {conversations} runs completed"
        time.sleep(0.1)
    [(end,)] = cluster_rows(cluster, "SELECT max(finished) FROM approvals_agentrun")
    wall = end.timestamp() - started
    cpu = _cpu_seconds(pids) - cpu_before
    return wall, f"{cpu:.1f} s ({cpu / wall:.2f} cores)"
