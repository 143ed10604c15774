"""agentsite across processes, on the cluster `make cluster` starts (agentsite/cluster.py):
PostgreSQL, Redis, two web processes and two workers behind nginx.

alice's chat socket is on web process 1 and rita's inbox socket on web process 2 (each
connected straight to its process); runs execute in the workers; every push crosses Redis.
A worker killed mid-run and a web process killed under an open page are noticed and
survived. One cluster for the module: each test leaves it with every process running.

Marked `cluster`: it brings its own PostgreSQL, so `make test` runs it once, in the SQLite
pass (the PostgreSQL pass would run the very same cluster again).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed

from agentsite.cluster import STATIC_ROOT, Cluster
from tests.cluster import (
    Person,
    cluster_rows,
    pid_of,
    read_until,
    running_cluster,
    served_sockets,
    service_of,
    wait_for,
)

pytestmark = pytest.mark.cluster

# The demo model types a word every 0.2 s: a reply takes a few seconds, long enough to kill
# its worker in the middle of it.
STREAM_DELAY = "0.2"
RESTART_REASON = "Interrupted by a restart"
REPLY = "The order system replied"  # the demo model's answer after cancel_order
INBOX = "/ws/inbox/?show=pending"  # the inbox page's socket (its access log drops the query)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with running_cluster(AGENTSITE_DEMO_STREAM_DELAY=STREAM_DELAY) as running:
        yield running


@pytest.fixture
def everything_running(cluster: Cluster) -> Cluster:
    """The cluster with all its processes: whatever an earlier test killed is started again
    (on its port: nginx takes a web process back once its failure has aged out)."""
    for service in cluster.services:
        if not service.running():
            service.start()
    return cluster


def run_of(cluster: Cluster, session_id: str) -> tuple[int, str, str, str] | None:
    """The latest run of a conversation: id, status, process, error."""
    rows = cluster_rows(
        cluster,
        "SELECT r.id, r.status, r.process, r.error FROM approvals_agentrun r "
        "JOIN conversations_conversation c ON c.id = r.conversation_id "
        "WHERE c.session_id = %s ORDER BY r.id DESC LIMIT 1",
        session_id,
    )
    return rows[0] if rows else None


def pending_request(cluster: Cluster, run_id: int) -> int | None:
    rows = cluster_rows(
        cluster,
        "SELECT id FROM approvals_approvalrequest WHERE run_id = %s AND status = 'pending'",
        run_id,
    )
    return rows[0][0] if rows else None


def process_kind(cluster: Cluster, identity: str) -> str:
    return str(
        cluster_rows(
            cluster, "SELECT kind FROM approvals_serverprocess WHERE identity = %s", identity
        )[0][0]
    )


def worker_pids(cluster: Cluster) -> set[int]:
    return {service.pid for service in cluster.worker if service.running()}


def cancellations(cluster: Cluster, number: int) -> int:
    return int(
        cluster_rows(
            cluster,
            "SELECT count(*) FROM demo_orderevent e JOIN demo_order o ON o.id = e.order_id "
            "WHERE o.number = %s AND e.kind = 'cancelled'",
            number,
        )[0][0]
    )


def test_nginx_serves_the_site_over_both_web_processes_and_the_static_files_itself(
    everything_running: Cluster,
) -> None:
    cluster = everything_running
    with urllib.request.urlopen(cluster.url + "/accounts/login/", timeout=10) as response:
        page = response.read().decode()
        assert response.headers["Server"].startswith("nginx")
        assert "content-security-policy" in {name.lower() for name in response.headers}
    # The page names its stylesheet by the content's hash (collectstatic's manifest).
    stylesheet = page.split('href="/static/agentsite/site.', 1)[1].split('"', 1)[0]
    path = f"/static/agentsite/site.{stylesheet}"
    request = urllib.request.Request(cluster.url + path, headers={"Accept-Encoding": "identity"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.read() == (STATIC_ROOT / path.removeprefix("/static/")).read_bytes()
        assert "immutable" in response.headers["Cache-Control"]
    # The web processes never saw it: nginx answered from collectstatic's folder.
    assert not any(path in web.log() for web in cluster.web)

    # least_conn spreads the requests over both web processes.
    before = [web.log().count('"GET /accounts/login/"') for web in cluster.web]
    for _ in range(8):
        with urllib.request.urlopen(cluster.url + "/accounts/login/", timeout=10) as response:
            assert response.status == 200
    after = [web.log().count('"GET /accounts/login/"') for web in cluster.web]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_a_request_crosses_processes_live_and_its_decision_resumes_in_a_worker(
    everything_running: Cluster,
) -> None:
    cluster = everything_running
    web_1, web_2 = cluster.web
    alice = Person.signed_in(cluster.url, "alice")
    rita = Person.signed_in(cluster.url, "rita")
    session_id = alice.new_conversation()

    async def scenario() -> tuple[str, str]:
        chat = await alice.socket(f"/ws/chats/{session_id}/", via=web_1)
        inbox = await rita.socket(INBOX, via=web_2)
        await asyncio.to_thread(alice.say, session_id, "cancel order 42")
        said = time.monotonic()
        # The run pauses in a worker; the request reaches rita's socket on web 2 live.
        row = await read_until(inbox, "cancel_order", "alice", within=15)
        print(f"alice's message to rita's inbox row: {time.monotonic() - said:.2f} s")
        run = await asyncio.to_thread(run_of, cluster, session_id)
        assert run is not None and run[1] == "waiting", run
        paused_in = run[2]
        request_id = await asyncio.to_thread(pending_request, cluster, run[0])
        assert request_id is not None and f"request-{request_id}" in row

        await asyncio.to_thread(rita.decide, request_id)
        decided = time.monotonic()
        # Resumed in a worker; the reply reaches alice's socket on web 1 live, whole.
        final = await read_until(chat, 'data-status="completed"', REPLY, within=20)
        print(f"rita's decision to alice's whole reply: {time.monotonic() - decided:.2f} s")
        assert "order 42" in final.lower() and "cancelled" in final
        resumed = await asyncio.to_thread(run_of, cluster, session_id)
        assert resumed is not None and resumed[1] == "completed"
        await chat.close()
        await inbox.close()
        return paused_in, resumed[2]

    paused_in, resumed_in = asyncio.run(scenario())
    for identity in (paused_in, resumed_in):
        assert process_kind(cluster, identity) == "worker"
        assert pid_of(identity) in worker_pids(cluster)
    assert served_sockets(web_1, f"/ws/chats/{session_id}/") == 1
    assert served_sockets(web_2, "/ws/inbox/") >= 1
    assert cancellations(cluster, 42) == 1


def test_a_worker_killed_mid_run_is_noticed_within_seconds_and_its_run_never_runs_again(
    everything_running: Cluster,
) -> None:
    cluster = everything_running
    alice = Person.signed_in(cluster.url, "alice")
    rita = Person.signed_in(cluster.url, "rita")
    session_id = alice.new_conversation()
    alice.say(session_id, "cancel order 44")
    run_id = wait_for("the run paused", lambda: _paused(cluster, session_id))
    request_id = pending_request(cluster, run_id)
    assert request_id is not None
    rita.decide(request_id)

    # The tool ran (the order is cancelled) and the reply is streaming, in one worker.
    wait_for("the tool ran", lambda: cancellations(cluster, 44) == 1, within=15)
    run = run_of(cluster, session_id)
    assert run is not None and run[1] == "running", run
    worker = service_of(cluster, run[2])
    assert worker in cluster.worker
    worker.kill()
    killed = time.monotonic()

    failed = wait_for(
        "the run failed",
        lambda: (r := run_of(cluster, session_id)) is not None and r[1] == "failed" and r,
        within=15,
    )
    took = time.monotonic() - killed
    print(f"worker killed with -9: its run failed {took:.2f} s later")
    assert RESTART_REASON in failed[3], failed
    # Noticed by the others' heartbeats: five silent seconds (AGENTSITE_PROCESS_TIMEOUT), not
    # the 15 minutes of the stuck-run timeout.
    assert took < 10, took
    # Never re-run: still failed a while later, nobody claimed it, the tool ran once.
    time.sleep(3)
    assert run_of(cluster, session_id) == failed
    assert cancellations(cluster, 44) == 1
    # The conversation takes a message again.
    alice.say(session_id, "where is order 44")
    wait_for(
        "the next message answered",
        lambda: (
            (r := run_of(cluster, session_id)) is not None
            and r[0] != run_id
            and r[1] == "completed"
        ),
        within=20,
    )


def _paused(cluster: Cluster, session_id: str) -> int | None:
    run = run_of(cluster, session_id)
    return run[0] if run is not None and run[1] == "waiting" else None


def test_a_web_process_killed_under_an_open_inbox_sends_it_to_the_other_which_resyncs(
    everything_running: Cluster,
) -> None:
    cluster = everything_running
    alice = Person.signed_in(cluster.url, "alice")
    rita = Person.signed_in(cluster.url, "rita")
    session_id = alice.new_conversation()

    async def scenario() -> None:
        before = [served_sockets(web, "/ws/inbox/") for web in cluster.web]
        inbox = await rita.socket(INBOX)  # through nginx
        opened = await asyncio.to_thread(
            wait_for,
            "a web process logged rita's socket",
            lambda: (
                [
                    n
                    for n, web in enumerate(cluster.web)
                    if served_sockets(web, "/ws/inbox/") > before[n]
                ]
                or None
            ),
        )
        assert len(opened) == 1, opened
        serving, other = cluster.web[opened[0]], cluster.web[1 - opened[0]]

        serving.kill()
        with pytest.raises(ConnectionClosed):  # gone, without a goodbye
            await read_until(inbox, "never", within=5)
        # While her socket is down, a request arrives: nobody can push it to her.
        await asyncio.to_thread(alice.say, session_id, "email alice@example.com about my refund")
        run_id = await asyncio.to_thread(
            wait_for, "the run paused", lambda: _paused(cluster, session_id)
        )
        request_id = await asyncio.to_thread(pending_request, cluster, run_id)

        # Her page reconnects through nginx: the other process takes it.
        others_before = served_sockets(other, "/ws/inbox/")
        again = await rita.socket(INBOX)
        await asyncio.to_thread(
            wait_for,
            "the other process logged her new socket",
            lambda: served_sockets(other, "/ws/inbox/") == others_before + 1,
        )
        # ...and re-reads its list (live.js's resync): the request is there.
        status, rows, _ = rita.get("/inbox/rows/", headers={"HX-Request": "true"})
        assert status == 200 and f"request-{request_id}" in rows and "send_email" in rows
        await again.close()

    asyncio.run(scenario())
