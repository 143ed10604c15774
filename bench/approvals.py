"""Pause and resume: the two halves of a human approval, agentsite against the bare SDK.

A cycle is one turn whose tool needs approval, approved, then resumed to its end.
- pause: from the run's start to the approval request committed and its event published
  (ours: `runs.execute` of a queued run, with a reviewer's channel in the inbox group;
  peer: `Runner.run` to the interruption, then `to_state().to_json()`).
- resume: from the decision to the tool executed and the reply stored (ours: `runs.adecide`,
  as an ASGI view calls it, then `runs.resume`; peer: `RunState.from_json`, `approve`,
  `Runner.run`).
Each repeat runs its cycles in one conversation (ours) or `SQLiteSession` (peer), ours and
the peer's repeats alternating.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agents import RunConfig, Runner, SQLiteSession
from agents.run_state import RunState
from channels.layers import get_channel_layer

from approvals.models import AgentRun, ApprovalRequest, RunStatus
from bench import site, tracing_setup
from bench.agents import APPROVAL_AGENT
from bench.harness import Config, Row, Samples, arun, compared, median_of, ms, ratio
from engine import events, runs

BENCHMARK = "pause and resume"
REQUEST = "Please refund order 42."


def site_cycles(count: int, reviewer: Any) -> tuple[list[float], list[float]]:
    conversation = site.conversation("bench_approval")
    layer = get_channel_layer()
    processors, _ = tracing_setup.site_processors()

    async def cycles() -> tuple[list[float], list[float]]:
        inbox = await layer.new_channel()
        await layer.group_add(events.INBOX_GROUP, inbox)
        pauses, resumes = [], []
        try:
            with site.served_here():
                for _ in range(count):
                    run = await runs.astart_run(conversation, REQUEST)
                    started = time.perf_counter()
                    await runs.execute(run.pk)
                    pauses.append(time.perf_counter() - started)

                    created = await layer.receive(inbox)
                    assert created["type"] == "approval.created", created
                    request = await ApprovalRequest.objects.aget(run_id=run.pk)

                    started = time.perf_counter()
                    await runs.adecide(request.pk, reviewer, True)
                    await runs.resume(run.pk)
                    resumes.append(time.perf_counter() - started)

                    await layer.receive(inbox)  # approval.decided
                    done = await AgentRun.objects.aget(pk=run.pk)
                    assert done.status == RunStatus.COMPLETED, (done.status, done.error)
        finally:
            await layer.group_discard(events.INBOX_GROUP, inbox)
        return pauses, resumes

    with site.jobs_recorded(), tracing_setup.processors(processors):
        return arun(cycles())


def sdk_cycles(count: int, path: Path) -> tuple[list[float], list[float]]:
    session = SQLiteSession(site.sdk_session_id(), path)
    config = RunConfig(tracing_disabled=True)

    async def cycles() -> tuple[list[float], list[float]]:
        pauses, resumes = [], []
        for _ in range(count):
            started = time.perf_counter()
            result = await Runner.run(APPROVAL_AGENT, REQUEST, session=session, run_config=config)
            saved = result.to_state().to_json()
            pauses.append(time.perf_counter() - started)
            assert result.interruptions

            started = time.perf_counter()
            state = await RunState.from_json(APPROVAL_AGENT, saved)
            for item in state.get_interruptions():
                state.approve(item)
            result = await Runner.run(APPROVAL_AGENT, state, session=session, run_config=config)
            resumes.append(time.perf_counter() - started)
            assert result.final_output == "Done.", result.final_output
        return pauses, resumes

    return arun(cycles())


def run(config: Config) -> list[Row]:
    repeats = config.pick(3, 10)
    count = config.pick(5, 20)
    path = config.workdir / "sdk-approvals.sqlite3"
    reviewer = site.reviewer()
    pause = {"ours": Samples(), "peer": Samples()}
    resume = {"ours": Samples(), "peer": Samples()}
    contenders = {
        "ours": lambda: site_cycles(count, reviewer),
        "peer": lambda: sdk_cycles(count, path),
    }
    for repeat in range(1 + repeats):  # the first is a warm-up
        for name, contender in contenders.items():
            pauses, resumes = contender()
            if repeat:
                pause[name].repeats.append(pauses)
                resume[name].repeats.append(resumes)
    return [
        _row(
            "pause: interruption → request committed, event published",
            pause,
            "ours: runs.execute of a turn whose tool needs approval, until the request row is "
            "committed and approval.created reached the inbox group; peer: Runner.run to the "
            "interruption + to_state().to_json()",
        ),
        _row(
            "resume: decision → tool executed",
            resume,
            "ours: runs.adecide + runs.resume (checks, RunState.from_json, approve, the tool, the "
            "reply, the run completed); peer: RunState.from_json + approve + Runner.run",
        ),
    ]


def _row(case: str, samples: dict[str, Samples], what: str) -> Row:
    ours, peer = samples["ours"], samples["peer"]
    return compared(
        BENCHMARK,
        case,
        f"p50 {ms(ours.percentile(50))}, p99 {ms(ours.percentile(99))}",
        f"p50 {ms(peer.percentile(50))}, p99 {ms(peer.percentile(99))}",
        ratio(ours, peer, median_of),
        f"{what}. Ratio: median time, ours ÷ the SDK's; p50/p99 over all "
        f"{len(ours.flat())} samples each",
    )
