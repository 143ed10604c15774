"""Turn overhead over HTTP: one turn with one tool call, the model a real HTTP server on
127.0.0.1 (`tests/provider.py`, the one the tests use) speaking Chat Completions, streamed.

Peer: the bare SDK, `Runner.run_streamed` on a `SQLiteSession` file, tracing disabled, with
an openai client built as agentsite builds one (retries, timeout), the same wire format,
buffered streamed tool calls and usage asked for, and the events consumed to the end.
Ours: agentsite's whole path, `runs.start_run` then `runs.execute`, with `OPENAI_BASE_URL`
pointing at the server, trace export as in `bench/turn.py`. A turn is two HTTP requests.
The server runs in this process, in threads: both sides pay for it alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agents import ModelSettings, RunConfig, Runner, SQLiteSession
from agents.models.openai_provider import OpenAIProvider
from agents.tracing.processor_interface import TracingProcessor
from django.test import override_settings

from bench import site, tracing_setup
from bench.agents import SDK_HTTP_AGENT
from bench.harness import Config, Goal, Row, arun, interleave, mean_and_median
from engine import providers, runs
from engine.models import AgentRun, RunStatus
from tests.provider import LocalProvider, text, tool_call

BENCHMARK = "turn over HTTP"
GOAL = Goal(1.5, "≤ 1.5×")
QUESTION = "Where is my order 7?"
MODEL = "bench-model"
REPLY = "Order 7 shipped yesterday."


def script(provider: LocalProvider, count: int) -> None:
    provider.reset()
    for _ in range(count):
        provider.script(tool_call("lookup_order", {"order_id": 7}), text(REPLY))


@contextmanager
def served_by(provider: LocalProvider) -> Iterator[None]:
    with override_settings(
        OPENAI_BASE_URL=provider.url, AGENTSITE_MODEL=MODEL, AGENTSITE_MODEL_API="auto"
    ):
        yield


def site_turns(
    provider: LocalProvider, count: int, processors: list[TracingProcessor]
) -> list[float]:
    conversation = site.conversation("bench_http")
    script(provider, count)

    async def turns() -> list[float]:
        times = []
        with site.served_here():
            for _ in range(count):
                started = time.perf_counter()
                run = await runs.astart_run(conversation, QUESTION)
                await runs.execute(run.pk)
                times.append(time.perf_counter() - started)
        return times

    with served_by(provider), site.jobs_recorded(), tracing_setup.processors(processors):
        times = arun(turns())
        started = time.perf_counter()
        tracing_setup.flush(processors)
        times[-1] += time.perf_counter() - started
    last = AgentRun.objects.filter(conversation=conversation).latest("pk")
    assert last.status == RunStatus.COMPLETED, (last.status, last.error)
    assert REPLY in last.final_output, last.final_output
    return times


def sdk_turns(provider: LocalProvider, count: int, path: Path) -> list[float]:
    session = SQLiteSession(site.sdk_session_id(), path)
    script(provider, count)
    with served_by(provider):
        client = providers.openai_client()  # built here, outside a loop: a client of its own
    config = RunConfig(
        model=MODEL,
        model_provider=OpenAIProvider(
            openai_client=client, use_responses=False, buffer_streamed_tool_calls=True
        ),
        model_settings=ModelSettings(include_usage=True),
        tracing_disabled=True,
    )

    async def turns() -> list[float]:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            result = Runner.run_streamed(
                SDK_HTTP_AGENT, QUESTION, session=session, run_config=config
            )
            async for _event in result.stream_events():
                pass
            times.append(time.perf_counter() - started)
            assert result.final_output == REPLY, result.final_output
        return times

    return arun(turns())


def run(config: Config) -> list[Row]:
    repeats = config.pick(3, 10)
    count = config.pick(5, 20)
    path = config.workdir / "sdk-http-turns.sqlite3"
    processors, tracing_words = tracing_setup.site_processors()
    with LocalProvider() as provider:
        samples = interleave(
            {
                "ours": lambda: site_turns(provider, count, processors),
                "peer": lambda: sdk_turns(provider, count, path),
            },
            repeats,
        )
    return mean_and_median(
        BENCHMARK,
        "one turn, one tool call, Chat Completions over HTTP",
        samples["ours"],
        samples["peer"],
        "a whole turn through the real openai client and a local HTTP server "
        f"(two streamed requests): agentsite's path ({tracing_words}) ÷ the bare SDK's "
        "(Runner.run_streamed + SQLiteSession, tracing disabled), the same client settings",
        GOAL,
        "the same turns, medians",
    )
