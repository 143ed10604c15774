"""Running a job: claim the run, stream the agent on the conversation's session (or restore a
decided pause first), and hand the stream's end to the stage that saves or ends it."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agents import Agent, Runner, RunResultStreaming
from agents.exceptions import InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered
from agents.run_state import RunState
from django.conf import settings
from django.utils import timezone
from openai.types.responses import ResponseTextDeltaEvent

from agentsite.db import hops
from agentsite.db.hops import db_hop
from engine import context as run_context
from engine import events, mcp, policies, providers, registry
from engine.executor import Job
from engine.models import AgentRun, RunStatus
from engine.runs import (
    edits,
    endings,
    errors,
    final,
    restoring,
    rows,
    saving,
    spans,
    stopping,
    streaming,
)

logger = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 30


async def run_job(job: Job, run_id: int) -> None:
    """Run one job for an executor; whatever escapes it is logged and stored on the run.
    Overdue approvals are not swept here: each web process does it on its loop's timer
    (`engine.sweeper`), or cron does with `AGENTSITE_SWEEP_SECONDS=0`."""
    try:
        if job == "execute":
            await execute(run_id)
        else:
            await resume(run_id)
    except asyncio.CancelledError:
        # Only a stopping process cancels jobs (`executor.drain`, then `interrupt`): what a
        # cancelled job leaves queued or resuming is the next process's to recover.
        raise
    except BaseException as exc:
        logger.exception("Run %s: %s failed", run_id, job)
        await final.fail_unfinished(run_id, f"The run stopped unexpectedly: {exc!r}")
        if not isinstance(exc, Exception):
            raise


async def execute(run_id: int) -> None:
    """Run a queued run to its end or its first pause. A run not queued is left alone."""
    run = await rows.claim(run_id, RunStatus.QUEUED)
    if run is None:
        return
    requester = run.requested_by
    if requester is not None and not requester.is_active:
        # Its job waited (a worker's queue) while the user was deactivated: no turn acts
        # for a user no longer allowed to act. (A resume checks its saved context instead.)
        await final.fail(
            run,
            f"The user who asked ({requester.get_username()}) was deactivated before the run "
            "started; nothing was executed.",
        )
        return
    try:
        agent = registry.get_agent(run.agent_name)
    except Exception as exc:
        await final.fail(run, f"The agent {run.agent_name!r} is not available: {exc}")
        return
    # The run's own MCP servers, opened as its agents need them, closed when it ends.
    async with mcp.scope():
        await _drive(run, agent, run.input)


async def resume(run_id: int) -> None:
    """Resume a run whose pause is fully decided. Each saved state is resumed at most once."""
    claimed = await db_hop(rows.claim_state_sync)(run_id)
    if claimed is None:
        return
    run, first_use = claimed
    await events.publish([rows.run_updated(run.pk, run.conversation_id, RunStatus.RUNNING)])
    if not first_use:
        await final.fail(
            run,
            f"The saved state of pause {run.pause_count} was already resumed once or ended with "
            "its run (a copy of it was written back?); nothing was executed.",
        )
        return
    async with mcp.scope():
        try:
            agent = registry.get_agent(run.agent_name)
            state, edited = await restoring.restore(run, agent)
            context = await restoring.check_context(run)
        except errors.RunFailure as failure:
            await final.fail(run, str(failure))
            return
        except Exception as exc:
            await final.fail(run, f"The run could not be resumed: {exc}")
            return
        if edited:
            await edits.edit_session_calls(run, edited)
        await _drive(run, agent, state, context)


def _run_config(run: AgentRun, agent: Agent[Any]) -> Any:
    options: dict[str, Any] = {
        "workflow_name": f"agentsite: {agent.name}",
        "group_id": run.conversation.session_id,
        "trace_metadata": {"run_id": str(run.pk), "agent": run.agent_name},
        "trace_include_sensitive_data": settings.AGENTSITE_TRACE_SENSITIVE_DATA,
    }
    if run.trace_id:
        options["trace_id"] = run.trace_id
    return providers.run_config(**options)


async def _drive(
    run: AgentRun,
    agent: Agent[Any],
    run_input: str | RunState[Any],
    context: run_context.RunContext | None = None,
) -> None:
    # The SDK runs sync tools through `asyncio.to_thread`: on the hop threads, which give
    # their connections back to the pool (a worker's loop is new for each job, and a thread
    # of a loop's own executor would end holding its connection).
    hops.adopt(asyncio.get_running_loop())
    conversation = run.conversation
    # On whose behalf the run acts. A resumed run passes the context its state held: the SDK
    # keeps the state's approvals when given one (openai-agents-python #4244).
    if context is None:
        context = run_context.RunContext.for_run(run)
    session = rows.session_of(run)
    result: RunResultStreaming | None = None
    stopper: stopping.Stopper | None = None
    deltas = streaming.Deltas(run.pk, conversation.pk, run.pause_count)
    # Rules that ask for a person or reject stop calls of tools that need no approval too.
    await policies.aguard(agent)
    try:
        result = Runner.run_streamed(
            agent,
            run_input,
            context=context,
            session=session,
            run_config=_run_config(run, agent),
            hooks=spans.HOOKS,
        )
        last_beat = time.monotonic()
        streamed = streaming.Streamed(saved_at=last_beat)
        stopper = stopping.Stopper.watching(run, result, streamed)
        async for stream_event in result.stream_events():
            if time.monotonic() - last_beat > HEARTBEAT_SECONDS:
                # A run that streams is alive: `recover_runs` only fails runs gone quiet.
                last_beat = time.monotonic()
                await db_hop(_heartbeat)(run.pk)
            if stream_event.type == "raw_response_event":
                stopper.heard(stream_event.data)
            if stream_event.type == "raw_response_event" and isinstance(
                stream_event.data, ResponseTextDeltaEvent
            ):
                delta = stream_event.data.delta
                deltas.add(delta, streamed.length)
                streamed.add(delta)
            if streamed.due():
                await db_hop(streaming.save_streamed)(run.pk, streamed.text())
    except (InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered) as tripped:
        await deltas.flush()
        await endings.end_by_guardrail(run, session, tripped, result)
        return
    except Exception as exc:
        await deltas.flush()
        await endings.end_by_error(run, session, exc, result)
        return
    finally:
        if stopper is not None:
            stopper.done()
        # The deltas reach the pages before whatever the run says next (its end, its pause).
        await deltas.flush()
    assert stopper is not None
    if stopper.stopped:
        await stopping.end_stopped(run, session, stopper, result)
        return
    if result.interruptions:
        # What the run's MCP servers listed, read here on the loop that opened them.
        listed, described = mcp.listing(), mcp.descriptions()
        outcome = await final.write(
            run.pk, rows.Outcome(), saving.save_pause, run, agent, result, listed, described
        )
    else:
        outcome = await final.write(run.pk, rows.Outcome(), saving.save_completion, run, result)
    await events.publish(outcome.events)


def _heartbeat(run_id: int) -> None:
    try:
        AgentRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(updated=timezone.now())
    except final.FINAL_WRITE_ERRORS as exc:
        # A sign of life only (the process's own heartbeat is what counts): a database that
        # does not answer for a moment does not end the run.
        logger.warning("Run %s: its sign of life could not be written (%r).", run_id, exc)
