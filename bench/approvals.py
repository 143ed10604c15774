"""Pause and resume: the two halves of a human approval, agentsite against the bare SDK.

A cycle is one turn whose tool needs approval, approved, then resumed to its end.
- pause: from the run's start to the approval request committed and its event published
  (ours: `runs.execute` of a queued run, with a reviewer's channel in the inbox group;
  peer: `Runner.run` to the interruption, then `to_state().to_json()`).
- resume: from the decision to the tool executed and the reply stored (ours: `runs.adecide`,
  as an ASGI view calls it, then `runs.resume`; peer: `RunState.from_json`, `approve`,
  `Runner.run`).
- approved by a policy: a whole turn whose call a rule approves, from the start to the
  reply stored (ours: `runs.execute`, which pauses, records the policy's decision and claims
  the run, then `runs.resume`; peer: one `Runner.run` of the same agent whose tool's
  `needs_approval` says no, the SDK's own way to let a call run without a person). Ours
  keeps what the peer does not: the saved state, the request, the audit row, the trace span.
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

from approvals.models import ApprovalPolicy, ApprovalRequest, ApprovalStatus, PolicyAction
from bench import site, tracing_setup
from bench.agents import SDK_APPROVAL_AGENT, UNREVIEWED_AGENT
from bench.harness import (
    Config,
    Goal,
    Row,
    Samples,
    arun,
    compared,
    interleave,
    median_of,
    ms,
    ratio,
)
from engine import events, runs
from engine.models import AgentRun, RunStatus

BENCHMARK = "pause and resume"
GOAL = Goal(1.5, "≤ 1.5×")  # issue 28, for the pause, the resume and a policy's approval
REQUEST = "Please refund order 42."
# What each row's ratio compares, per repeat (the full run's rows and `bench/check.py`).
STATISTIC = median_of

# Ours ("ours") and the SDK's ("peer") samples of one comparison.
Pair = dict[str, Samples]


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
                    await runs.adecide(request.pk, reviewer, runs.Decision.approve())
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
            result = await Runner.run(
                SDK_APPROVAL_AGENT, REQUEST, session=session, run_config=config
            )
            saved = result.to_state().to_json()
            pauses.append(time.perf_counter() - started)
            assert result.interruptions

            started = time.perf_counter()
            state = await RunState.from_json(SDK_APPROVAL_AGENT, saved)
            for item in state.get_interruptions():
                state.approve(item)
            result = await Runner.run(SDK_APPROVAL_AGENT, state, session=session, run_config=config)
            resumes.append(time.perf_counter() - started)
            assert result.final_output == "Done.", result.final_output
        return pauses, resumes

    return arun(cycles())


def site_policy_turns(count: int) -> list[float]:
    conversation = site.conversation("bench_approval")
    processors, _ = tracing_setup.site_processors()

    async def turns() -> list[float]:
        times = []
        with site.served_here():
            for _ in range(count):
                run = await runs.astart_run(conversation, REQUEST)
                started = time.perf_counter()
                await runs.execute(run.pk)
                await runs.resume(run.pk)
                times.append(time.perf_counter() - started)
                done = await AgentRun.objects.aget(pk=run.pk)
                assert done.status == RunStatus.COMPLETED, (done.status, done.error)
                request = await ApprovalRequest.objects.aget(run_id=run.pk)
                assert request.status == ApprovalStatus.APPROVED and request.decided_by_id is None
        return times

    policy = ApprovalPolicy.objects.create(
        name="bench: approve refunds", tool_name="refund_order", action=PolicyAction.APPROVE
    )
    try:
        with site.jobs_recorded(), tracing_setup.processors(processors):
            return arun(turns())
    finally:
        policy.delete()


def sdk_unreviewed_turns(count: int, path: Path) -> list[float]:
    session = SQLiteSession(site.sdk_session_id(), path)
    config = RunConfig(tracing_disabled=True)

    async def turns() -> list[float]:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            result = await Runner.run(UNREVIEWED_AGENT, REQUEST, session=session, run_config=config)
            times.append(time.perf_counter() - started)
            assert result.final_output == "Done.", result.final_output
        return times

    return arun(turns())


def pause_and_resume(repeats: int, count: int, path: Path) -> tuple[Pair, Pair]:
    """The pauses and the resumes of `repeats` interleaved repeats of `count` cycles each,
    ours ("ours") and the bare SDK's ("peer"), after one unrecorded warm-up each."""
    reviewer = site.reviewer()
    pause: Pair = {"ours": Samples(), "peer": Samples()}
    resume: Pair = {"ours": Samples(), "peer": Samples()}
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
    return pause, resume


def policy_turns(repeats: int, count: int, path: Path) -> Pair:
    """Turns approved by a policy ("ours") and the SDK's unreviewed turns ("peer"),
    interleaved, after one unrecorded warm-up each."""
    return interleave(
        {
            "ours": lambda: site_policy_turns(count),
            "peer": lambda: sdk_unreviewed_turns(count, path),
        },
        repeats,
    )


def durable(pause: Pair, resume: Pair) -> Samples:
    """The SDK's saved-state approval: its pause and its resume, added per cycle."""
    return Samples(
        repeats=[
            [a + b for a, b in zip(pauses, resumes, strict=True)]
            for pauses, resumes in zip(pause["peer"].repeats, resume["peer"].repeats, strict=True)
        ]
    )


def run(config: Config) -> list[Row]:
    repeats = config.pick(3, 10)
    count = config.pick(5, 20)
    path = config.workdir / "sdk-approvals.sqlite3"
    pause, resume = pause_and_resume(repeats, count, path)
    policy = policy_turns(repeats, count, path)
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
        _row(
            "approved by a policy ÷ the SDK's saved-state approval",
            {"ours": policy["ours"], "peer": durable(pause, resume)},
            "ours: as below; peer: the SDK's pause and resume above, added per cycle "
            "(Runner.run to the interruption, to_json, from_json, approve, Runner.run): the same "
            "durable path, with no rule, request, audit or trace",
        ),
        _row(
            "approved by a policy: a whole turn, start → reply",
            policy,
            "ours: runs.execute (the pause, the rule's verdict and decision, the run claimed) + "
            "runs.resume, the request never pending; peer: one Runner.run whose tool's "
            "needs_approval says no (no state, request, audit or trace kept)",
            None,  # a whole durable path against one plain run: a cost shown, not a goal
        ),
    ]


def _row(case: str, samples: dict[str, Samples], what: str, goal: Goal | None = GOAL) -> Row:
    ours, peer = samples["ours"], samples["peer"]
    return compared(
        BENCHMARK,
        case,
        f"p50 {ms(ours.percentile(50))}, p99 {ms(ours.percentile(99))}",
        f"p50 {ms(peer.percentile(50))}, p99 {ms(peer.percentile(99))}",
        ratio(ours, peer, STATISTIC),
        f"{what}. Ratio: median time, ours ÷ the SDK's; p50/p99 over all "
        f"{len(ours.flat())} samples each",
        goal,
    )
