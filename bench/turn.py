"""Turn overhead: one agent turn with one tool call, on a model with no latency.

Peer: the bare SDK, `Runner.run` on a `SQLiteSession` file with tracing disabled.
Ours: agentsite's whole path, `runs.start_run` (the run row, its "queued" event) then
`runs.execute` (claim, stream the agent on a `DjangoSession`, save the result, events), with
trace export when the site has one. Jobs are recorded instead of scheduled, and the
benchmark awaits `runs.execute` itself. A turn is two model calls: the tool call, the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from agents import SQLiteSession
from agents.tracing.processor_interface import TracingProcessor

from bench import site, tracing_setup
from bench.agents import SDK_TOOL_AGENT
from bench.harness import Config, Goal, Row, Samples, arun, interleave, mean_and_median
from engine import runs
from engine.models import AgentRun, RunStatus

BENCHMARK = "turn overhead"
GOAL = Goal(1.3, "≤ 1.3×")  # issue 28
QUESTION = "Where is my order 7?"


def site_turns(
    count: int, processors: list[TracingProcessor], *, tracing: bool = True
) -> list[float]:
    """`count` turns through agentsite in one conversation; seconds per turn. Spans go to
    `processors`, and their final flush is charged to the last turn; with `tracing` off, the
    SDK makes no spans at all."""
    conversation = site.conversation("bench_tool")

    async def turns() -> list[float]:
        times = []
        with site.served_here():
            for _ in range(count):
                started = time.perf_counter()
                run = await runs.astart_run(conversation, QUESTION)
                await runs.execute(run.pk)
                times.append(time.perf_counter() - started)
        return times

    switch = tracing_setup.processors(processors) if tracing else tracing_setup.disabled()
    with site.jobs_recorded(), switch:
        times = arun(turns())
        started = time.perf_counter()
        tracing_setup.flush(processors)
        times[-1] += time.perf_counter() - started
    last = AgentRun.objects.filter(conversation=conversation).latest("pk")
    assert last.status == RunStatus.COMPLETED, (last.status, last.error)
    return times


def sdk_turns(
    count: int,
    path: Path,
    clock: Callable[[], float] = time.perf_counter,
    *,
    streamed: bool = False,
) -> list[float]:
    """`count` turns of the bare SDK on one `SQLiteSession`; `clock` seconds per turn (wall
    time unless told). `streamed`: `Runner.run_streamed`, its events read to the end (what
    agentsite's engine runs), instead of `Runner.run`."""
    session = SQLiteSession(site.sdk_session_id(), path)

    async def turns() -> list[float]:
        times = []
        for _ in range(count):
            started = clock()
            result = await site.sdk_turn(SDK_TOOL_AGENT, QUESTION, session, streamed=streamed)
            times.append(clock() - started)
            assert result.final_output == "Done.", result.final_output
        return times

    return arun(turns())


def measure(repeats: int, count: int, path: Path) -> tuple[dict[str, Samples], str]:
    """`repeats` interleaved repeats of `count` turns each, ours ("ours") and the bare SDK's
    ("peer"); with the words that say how agentsite's turns were traced."""
    processors, tracing_words = tracing_setup.site_processors()
    samples = interleave(
        {
            "ours": lambda: site_turns(count, processors),
            "peer": lambda: sdk_turns(count, path),
        },
        repeats,
    )
    return samples, tracing_words


def run(config: Config) -> list[Row]:
    samples, tracing_words = measure(
        config.pick(3, 15), config.pick(5, 20), config.workdir / "sdk-turns.sqlite3"
    )
    return mean_and_median(
        BENCHMARK,
        "one turn, one tool call",
        samples["ours"],
        samples["peer"],
        "time of a whole turn, agentsite's path (start_run + execute, DjangoSession, saved "
        f"run, events, {tracing_words}) ÷ the bare SDK's (Runner.run + SQLiteSession, "
        "tracing disabled); ours − peer is what agentsite adds to every turn",
        GOAL,
        "the same turns, medians: the typical turn, without the slow outliers",
    )
