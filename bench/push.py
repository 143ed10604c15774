"""Approval push: how long a new approval request takes to reach many reviewers' open inboxes,
on the cluster `make cluster` starts (agentsite/cluster.py: PostgreSQL, Redis, 2 web processes,
2 workers, nginx).

N inbox sockets (the inbox page's, `?show=pending`) are opened through nginx, which spreads
them over the web processes. Then alice asks, R times one after the other, to cancel an order:
each run pauses in a worker, whose pause commits the request and publishes one event to
Redis; every web process renders the row once and sends it to each of its sockets, through
nginx. A sample is one socket's delay: from the request's creation (its `created`, written in
the worker inside the pause's transaction) to the moment the row's frame arrived here (the
same machine's clock). The sockets share one reviewer's session (the push does the same work
per socket whoever holds it; 50 logins would only add 50 password hashes to the set-up).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time

from bench.harness import Config, Row, percentile
from tests.cluster import Person, cluster_rows, running_cluster, served_sockets

BENCHMARK = "approval push"
INBOX = "/ws/inbox/?show=pending"
GOAL_P99 = 0.100
ROW = re.compile(r'id="request-(\d+)"')
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


def run(config: Config) -> list[Row]:
    reviewers = config.pick(10, 50)
    rounds = config.pick(5, 20)
    with running_cluster(env=ENV) as cluster:
        alice = Person.signed_in(cluster.url, "alice")
        rita = Person.signed_in(cluster.url, "rita")
        before = [served_sockets(web, "/ws/inbox/") for web in cluster.web]
        arrived = asyncio.run(_measure(alice, rita, reviewers, rounds))
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
    delays = [at - created[pk] for socket in arrived for pk, at in socket.items()]
    # Where the time goes: to the first socket (the worker's commit, Redis, one web process's
    # render), then from the first socket to the last (the fan-out over every socket).
    per_request: dict[int, list[float]] = {}
    for socket in arrived:
        for pk, at in socket.items():
            per_request.setdefault(pk, []).append(at - created[pk])
    first = statistics.median(min(times) for times in per_request.values())
    fan_out = statistics.median(max(times) - min(times) for times in per_request.values())
    missing = reviewers * rounds - len(delays)
    p50, p99 = percentile(delays, 50), percentile(delays, 99)
    verdict = "met" if p99 <= GOAL_P99 and not missing else "MISSED"
    return [
        Row(
            BENCHMARK,
            f"{reviewers} reviewer sockets over the web processes ({' + '.join(map(str, spread))}),"
            f" {rounds} requests",
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
    ]


async def _measure(
    alice: Person, rita: Person, reviewers: int, rounds: int
) -> list[dict[int, float]]:
    sockets = [await rita.socket(INBOX) for _ in range(reviewers)]
    arrived: list[dict[int, float]] = [{} for _ in sockets]

    async def listen(index: int) -> None:
        async for frame in sockets[index]:
            now = time.time()
            for pk in ROW.findall(str(frame)):
                arrived[index].setdefault(int(pk), now)

    listeners = [asyncio.create_task(listen(n)) for n in range(reviewers)]
    try:
        for _ in range(rounds):
            counts = sum(len(seen) for seen in arrived)
            session_id = await asyncio.to_thread(alice.new_conversation)
            await asyncio.to_thread(alice.say, session_id, "cancel order 42")
            # One request at a time: wait until every socket has it (or give up on it).
            deadline = time.monotonic() + 10
            while sum(len(seen) for seen in arrived) < counts + reviewers:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
    finally:
        for socket in sockets:
            await socket.close()
        for listener in listeners:
            listener.cancel()
        await asyncio.gather(*listeners, return_exceptions=True)
    return arrived
