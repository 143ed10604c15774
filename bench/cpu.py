"""CPU per turn: the processor time one chat turn costs, agentsite's whole path against the
bare SDK's, as process CPU time (`time.process_time`: every thread of the process, the trace
exporter's and the database threads' included), not wall time.

Ours: alice's chat POST through Django's whole stack (`Client.post` to `chat_send`:
middleware, session, the conversation's lock, `start_run`), then the job as a `db_worker`
runs it (`asyncio.run(runs.run_job("execute", id))`: a fresh loop per job, the expiry sweep
each job starts with, the claim, streaming on a `DjangoSession`, the saved reply, events),
with trace export as the tracing app installs it (each repeat's final flush charged to its
last turn). Peer: `Runner.run` of the same agent on a `SQLiteSession`, tracing disabled.
"""

from __future__ import annotations

import asyncio
import time

from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.urls import reverse

from approvals.models import AgentRun, RunStatus
from bench import site, tracing_setup, turn
from bench.harness import Config, Goal, Row, compared, interleave, ms, ratio
from conversations.models import Conversation
from engine import runs

BENCHMARK = "CPU per turn"
GOAL = Goal(1.3, "≤ 1.3×")
QUESTION = turn.QUESTION


def site_turns(count: int, traced: bool) -> list[float]:
    """`count` turns of alice's through agentsite; the process CPU seconds of each."""
    alice = get_user_model().objects.create_user(username=f"alice-cpu-{AgentRun.objects.count()}")
    conversation = Conversation.objects.create(agent_name="bench_tool", owner=alice)
    client = Client(HTTP_HOST="localhost")
    client.force_login(alice)
    url = reverse("chat_send", args=[conversation.session_id])
    processors, _ = tracing_setup.site_processors()
    switch = tracing_setup.processors(processors) if traced else tracing_setup.disabled()
    times = []
    with (
        override_settings(AGENTSITE_MESSAGES_PER_MINUTE=0),
        site.jobs_recorded() as submitted,
        switch,
    ):
        for _ in range(count):
            started = time.process_time()
            response = client.post(url, {"text": QUESTION}, headers={"HX-Request": "true"})
            assert response.status_code == 200, response.content[:300]
            job, run_id = submitted.pop()
            assert job == "execute", job
            asyncio.run(runs.run_job("execute", run_id))
            times.append(time.process_time() - started)
        if traced:
            started = time.process_time()
            tracing_setup.flush(processors)
            times[-1] += time.process_time() - started
    last = AgentRun.objects.filter(conversation=conversation).latest("pk")
    assert last.status == RunStatus.COMPLETED, (last.status, last.error)
    assert AgentRun.objects.filter(conversation=conversation).count() == count
    return times


def run(config: Config) -> list[Row]:
    repeats = config.pick(3, 9)
    count = config.pick(5, 20)
    path = config.workdir / "sdk-cpu.sqlite3"
    samples = interleave(
        {
            "ours": lambda: site_turns(count, traced=True),
            "untraced": lambda: site_turns(count, traced=False),
            "peer": lambda: turn.sdk_turns(count, path, clock=time.process_time),
        },
        repeats,
    )
    ours, untraced, peer = samples["ours"], samples["untraced"], samples["peer"]
    return [
        compared(
            BENCHMARK,
            "chat POST → worker job → reply stored (mean CPU per turn)",
            ms(ours.mean()),
            ms(peer.mean()),
            ratio(ours, peer),
            "process CPU time (time.process_time, all threads) of a whole turn: the chat POST "
            "through Django's stack, the job as a db_worker runs it (asyncio.run of "
            "runs.run_job), trace export ÷ the bare SDK's Runner.run on a SQLiteSession, "
            f"tracing disabled; {count} turns a repeat, one tool call each",
            GOAL,
        ),
        compared(
            BENCHMARK,
            "the same, agentsite untraced (mean CPU per turn)",
            ms(untraced.mean()),
            ms(peer.mean()),
            ratio(untraced, peer),
            "reference: agentsite's turn with tracing off (SDK tracing disabled): what the "
            "path costs without trace export",
        ),
    ]
