"""CPU per turn: the processor time one chat turn costs, agentsite's whole path against the
bare SDK's, as process CPU time (`time.process_time`: every thread of the process, the trace
exporter's and the database threads' included), not wall time.

Ours: alice's chat POST through Django's whole stack (`Client.post` to `chat_send`:
middleware, session, the conversation's lock, `start_run`), then the job as a `db_worker`
runs it (`asyncio.run(runs.run_job("execute", id))`: a fresh loop per job, the claim,
streaming on a `DjangoSession`, the saved reply, events), with trace export as the tracing
app installs it (each repeat's final flush charged to its last turn). Peer: `Runner.run_streamed`
of the same agent on a `SQLiteSession`, its events read to the end (what the engine runs),
tracing disabled; `Runner.run` as a reference.

As in a web process, a server loop runs beside the POSTs (on a thread of this process, so its
CPU counts): the event `start_run` publishes goes to it (`events.publish_threadsafe`), as
daphne's process does, instead of a new loop and thread per event (`async_to_sync`), which
is only what a process without a server pays (a management command, WSGI).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import reverse

from bench import site, tracing_setup, turn
from bench.harness import Config, Goal, Row, Samples, interleave, mean_compared
from conversations.models import Conversation
from engine import runs, serverloop
from engine.models import AgentRun, RunStatus

BENCHMARK = "CPU per turn"
# Issue 28: against the SDK's streamed run, which is what the engine runs (a chat shows the
# reply as it is written); issue 14's 1.3× of `Runner.run` is kept as a reference row.
GOAL = Goal(1.5, "≤ 1.5×")
QUESTION = turn.QUESTION


@contextmanager
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running on a thread of this process until the block ends: the POSTs'
    server loop (bound around each, as `asgi.py` binds daphne's; not around the jobs, which
    run as a `db_worker` does, with no server loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="bench-server-loop", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@functools.cache
def _client() -> Client:
    """One client for every repeat, as one web process serves every request: its handler
    loads the middleware once (WhiteNoise's scan of the static files alone is ~70 ms, which a
    client per repeat charged to the turns of each repeat, ~3.5 ms a turn of the mean)."""
    return Client(HTTP_HOST="localhost")


def site_turns(
    count: int, traced: bool, parts: tuple[Samples, Samples] | None = None
) -> list[float]:
    """`count` turns of alice's through agentsite; the process CPU seconds of each. With
    `parts`, the repeat's POSTs and jobs apart too (the trace export's flush with the jobs)."""
    alice = get_user_model().objects.create_user(username=f"alice-cpu-{AgentRun.objects.count()}")
    conversation = Conversation.objects.create(agent_name="bench_tool", owner=alice)
    client = _client()
    client.force_login(alice)
    url = reverse("chat_send", args=[conversation.session_id])
    processors, _ = tracing_setup.site_processors()
    switch = tracing_setup.processors(processors) if traced else tracing_setup.disabled()
    times, posts, jobs = [], [], []
    with (
        override_settings(AGENTSITE_MESSAGES_PER_MINUTE=0),
        site.jobs_recorded() as submitted,
        switch,
        server_loop() as server,
    ):
        for _ in range(count):
            started = time.process_time()
            with serverloop.bound(server):
                response = client.post(url, {"text": QUESTION}, headers={"HX-Request": "true"})
            assert response.status_code == 200, response.content[:300]
            posted = time.process_time()
            job, run_id = submitted.pop()
            assert job == "execute", job
            asyncio.run(runs.run_job("execute", run_id))
            times.append(time.process_time() - started)
            posts.append(posted - started)
            jobs.append(times[-1] - posts[-1])
        if traced:
            started = time.process_time()
            tracing_setup.flush(processors)
            times[-1] += time.process_time() - started
            jobs[-1] += time.process_time() - started
    last = AgentRun.objects.filter(conversation=conversation).latest("pk")
    assert last.status == RunStatus.COMPLETED, (last.status, last.error)
    assert AgentRun.objects.filter(conversation=conversation).count() == count
    if parts is not None:
        parts[0].repeats.append(posts)
        parts[1].repeats.append(jobs)
    return times


def run(config: Config) -> list[Row]:
    repeats = config.pick(3, 9)
    count = config.pick(5, 20)
    path = config.workdir / "sdk-cpu.sqlite3"
    posts, jobs = Samples(), Samples()
    samples = interleave(
        {
            "ours": lambda: site_turns(count, traced=True, parts=(posts, jobs)),
            "untraced": lambda: site_turns(count, traced=False),
            "peer": lambda: turn.sdk_turns(count, path, clock=time.process_time, streamed=True),
            "run": lambda: turn.sdk_turns(count, path, clock=time.process_time),
        },
        repeats,
    )
    ours, untraced, peer = samples["ours"], samples["untraced"], samples["peer"]
    plain = samples["run"]
    for part in (posts, jobs):  # the warm-up's repeat is not recorded
        del part.repeats[: len(part.repeats) - repeats]
    # (case, ours, the peer, what it means, goal): each a mean CPU per turn, ours ÷ the peer's.
    rows: list[tuple[str, Samples, Samples, str, Goal | None]] = [
        (
            "chat POST → worker job → reply stored",
            ours,
            peer,
            "process CPU time (time.process_time, all threads) of a whole turn: the chat POST "
            "through Django's stack, the job as a db_worker runs it (asyncio.run of "
            "runs.run_job), trace export ÷ the bare SDK's Runner.run_streamed (its events "
            f"read to the end) on a SQLiteSession, tracing disabled; {count} turns a repeat, "
            "one tool call each",
            GOAL,
        ),
        (
            "… the same ÷ Runner.run",
            ours,
            plain,
            "reference: the whole turn ÷ the bare SDK's Runner.run (not streamed) on a "
            "SQLiteSession, tracing disabled (issue 14's goal was ≤ 1.3× of this)",
            None,
        ),
        (
            "… of which the chat POST",
            posts,
            peer,
            "Django's request to chat_send with a server loop beside it (as daphne's), "
            "start_run, the composer fragment; ÷ the whole bare SDK turn (streamed)",
            None,
        ),
        (
            "… of which the job",
            jobs,
            peer,
            "asyncio.run(runs.run_job) as a db_worker runs it, trace export included; ÷ the "
            "whole bare SDK turn (streamed)",
            None,
        ),
        (
            "the same, agentsite untraced",
            untraced,
            peer,
            "reference: agentsite's turn with tracing off (SDK tracing disabled): what the "
            "path costs without trace export",
            None,
        ),
    ]
    return [
        mean_compared(BENCHMARK, f"{case} (mean CPU per turn)", mine, theirs, meaning, goal)
        for case, mine, theirs, meaning, goal in rows
    ]
