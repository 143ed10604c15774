"""The run engine: the only module that calls `Runner.run_streamed` and `RunState.from_json`.

One chat turn:
1. `start_run` stores a queued `AgentRun` and, after commit, hands it to the executor.
2. `execute` claims it (queued -> running), streams the agent on the conversation's session
   and, at the end of the stream, either completes the run or pauses it: in ONE transaction
   the signed `RunState`, one `ApprovalRequest` per interruption and the status "waiting".
3. `decide` records a reviewer's decision. A conditional UPDATE lets exactly one decision
   per request win; when none of that pause is still pending, another conditional UPDATE
   claims the run (waiting -> resuming) and the executor resumes it.
4. `resume` claims the snapshot (resuming -> running, consumed, and in the same transaction
   a `ConsumedState` row for its pause, unique) so that it, or any copy of it written back,
   is resumed once only, ever; checks it (signature, bound to this run and pause, schema
   version, agent fingerprint, argument hashes); applies the decisions from our own rows,
   matched by call id; and streams on.

The database is the truth; events are published only after commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hmac
import json
import logging
import math
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from agents import Agent, Runner, RunResultStreaming
from agents._tool_invocation import tool_invocation_identity_and_scope
from agents.exceptions import InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered
from agents.items import ToolApprovalItem
from agents.run_state import SUPPORTED_SCHEMA_VERSIONS, RunState
from agents.tool import ToolOriginType
from agents.version import __version__ as SDK_VERSION
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)
from django.utils import timezone
from django.utils.crypto import salted_hmac
from openai.types.responses import ResponseTextDeltaEvent

from agentsite.db import hops
from agentsite.db.hops import db_hop
from approvals.models import (
    ACTIVE_STATUSES,
    AgentRun,
    ApprovalDecision,
    ApprovalOrigin,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    ConsumedState,
    DecisionKind,
    ExpiryAction,
    RunStatus,
    ServerProcess,
    ToolKind,
    arguments_hash,
)
from common import formatting
from conversations.items import (
    is_user_message,
    message_text,
    output_view,
    parse_arguments,
    stopped_output,
)
from conversations.models import Conversation, run_branch
from conversations.session import open_session, place_run, record_turn_usage, rewrite_items
from engine import calls as paused_calls
from engine import context as run_context
from engine import (
    events,
    executor,
    heartbeat,
    mcp,
    model_errors,
    permissions,
    policies,
    providers,
    registry,
    signals,
)
from engine.executor import Job
from engine.sql import statements
from tracing import recording, redaction

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from engine.permissions import User

logger = logging.getLogger(__name__)

# The key, inside a saved state and so under its signature, that binds the state to its run
# and pause: {"run": id, "pause": n, "nonce": random hex}. States saved before it have none.
# (It sorts after "$schemaVersion", which stays first where staff read the state.)
STATE_BINDING = "$stateBinding"
MAX_INPUT_CHARS = 20_000
MAX_MESSAGE_CHARS = 2_000
# What a reviewer may write as a tool's output when answering as the tool.
MAX_RESPONSE_CHARS = 10_000
HEARTBEAT_SECONDS = 30
RATE_WINDOW = timedelta(minutes=1)


# --- errors ---------------------------------------------------------------------------------


class DecisionRefused(Exception):
    """A decision that cannot be taken; the message says why, for the person who tried."""


class AlreadyDecided(DecisionRefused):
    pass


class RequestExpired(DecisionRefused):
    pass


class RequestClosed(DecisionRefused):
    pass


class NeedsAnotherReviewer(DecisionRefused):
    """Separation of duties: nobody approves a call in a conversation she started herself
    (unless `AGENTSITE_SELF_APPROVAL` is on)."""


# Finer kinds of refusal, for callers that answer each differently (the JSON API's status
# codes); each is still a DecisionRefused with the same message.
class RequestWithdrawn(AlreadyDecided):
    """The person who asked withdrew the request."""


class NotAllowed(DecisionRefused):
    """The person may not decide tool calls at all."""


class StaleArguments(DecisionRefused):
    """The arguments changed since they were shown (`seen_hash`)."""


class InvalidDecision(DecisionRefused):
    """The decision itself is not acceptable: an empty or too long answer as the tool,
    edited arguments where edits are forbidden or that do not fit the tool's schema."""


class RateLimited(Exception):
    """Too many messages from one person in a minute; the message says when to try again,
    `retry_after` in how many seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RunFailure(Exception):
    """Ends a run as failed with this reason; nothing of the paused call executes."""


# --- starting -------------------------------------------------------------------------------


def start_run(
    conversation: Conversation, text: str, user: User | AnonymousUser | None = None
) -> AgentRun:
    """Queue a run of the conversation's agent on `text`; it starts after commit.

    Raises:
        ValueError: the text is empty or too long (nothing is stored).
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("The message is empty.")
    if len(text) > MAX_INPUT_CHARS:
        raise ValueError(
            f"The message is too long ({len(text)} characters; at most {MAX_INPUT_CHARS})."
        )
    agent_name = _turn_agent_name(conversation)
    registry.get_agent(agent_name)  # fail here, not in the background, for an unknown agent
    if user is not None and user.is_authenticated:
        _check_message_rate(user)
    run = AgentRun.objects.create(
        conversation=conversation,
        agent_name=agent_name,
        input=text,
        # Chosen here, so the run's trace can be linked before its first span arrives.
        trace_id=f"trace_{uuid.uuid4().hex}",
        requested_by=user if user is not None and user.is_authenticated else None,
        # The in-process executor's job lives in this process: should it go before the job
        # starts, recovery takes the run over at once (the claim lets one copy proceed).
        process=heartbeat.owner() if settings.AGENTSITE_EXECUTOR == "inprocess" else "",
    )
    # A run belongs to the branch the conversation is on as it starts: its session writes
    # there, and the chat shows it with that branch.
    place_run(run)
    run_id, conversation_id = run.pk, conversation.pk
    # After the caller's transaction commits (the chat view holds the conversation's lock),
    # or now when there is none: the INSERT above committed by itself.
    # Without waiting for delivery: a view's thread need not wait for the server's loop.
    transaction.on_commit(
        lambda: events.publish_threadsafe([_run_updated(run_id, conversation_id, RunStatus.QUEUED)])
    )
    transaction.on_commit(lambda: executor.submit("execute", run_id))
    return run


astart_run = sync_to_async(start_run)


def _own_agent_name(conversation: Conversation) -> str:
    """The agent the conversation was started with (the site's default for an old one)."""
    return conversation.agent_name or registry.default_agent_name()


def _turn_agent_name(conversation: Conversation) -> str:
    """The agent a new turn starts with: the one that answered last (after a handoff, its
    target), as the SDK's customer-service example does with `result.last_agent`; the
    conversation's own agent when none did, or when that one is no longer reachable."""
    started = _own_agent_name(conversation)
    current = conversation.current_agent
    if current and current != started:
        try:
            registry.get_agent(current)
        except registry.UnknownAgent:
            logger.info(
                "Conversation %s: %r is gone, %r answers", conversation.pk, current, started
            )
        else:
            return current
    return started


def _follow_agent(run: AgentRun, result: RunResultStreaming) -> None:
    """Store on the conversation the agent that answered this turn (in a final write's
    transaction): the next turn starts with it."""
    try:
        name = registry.public_name(_own_agent_name(run.conversation), result.last_agent)
    except Exception:
        name = None
    # Most turns end with the agent they started with: no write then (the conversation was
    # loaded with the claim, and takes one message at a time).
    if name is not None and name != run.conversation.current_agent:
        Conversation.objects.filter(pk=run.conversation_id).update(current_agent=name)


def _check_message_rate(user: User) -> None:
    """At most AGENTSITE_MESSAGES_PER_MINUTE runs started by one person in any minute (0: no
    limit), counted from the runs themselves, so every process applies the same count.

    Raises:
        RateLimited: the limit is reached; nothing is stored.
    """
    limit = settings.AGENTSITE_MESSAGES_PER_MINUTE
    if limit <= 0:
        return
    now = timezone.now()
    recent = list(
        AgentRun.objects.started_by_since(user, now - RATE_WINDOW)
        .order_by("-created")
        .values_list("created", flat=True)[:limit]
    )
    if len(recent) >= limit:
        wait = max(1, math.ceil((recent[-1] + RATE_WINDOW - now).total_seconds()))
        raise RateLimited(
            f"You are sending messages too fast: at most {limit} a minute. "
            f"Try again in {wait} second{'s' if wait != 1 else ''}.",
            retry_after=wait,
        )


# --- executing ------------------------------------------------------------------------------


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
        await fail_unfinished(run_id, f"The run stopped unexpectedly: {exc!r}")
        if not isinstance(exc, Exception):
            raise


async def execute(run_id: int) -> None:
    """Run a queued run to its end or its first pause. A run not queued is left alone."""
    run = await _claim(run_id, RunStatus.QUEUED)
    if run is None:
        return
    requester = run.requested_by
    if requester is not None and not requester.is_active:
        # Its job waited (a worker's queue) while the user was deactivated: no turn acts
        # for a user no longer allowed to act. (A resume checks its saved context instead.)
        await _fail(
            run,
            f"The user who asked ({requester.get_username()}) was deactivated before the run "
            "started; nothing was executed.",
        )
        return
    try:
        agent = registry.get_agent(run.agent_name)
    except Exception as exc:
        await _fail(run, f"The agent {run.agent_name!r} is not available: {exc}")
        return
    # The run's own MCP servers, opened as its agents need them, closed when it ends.
    async with mcp.scope():
        await _drive(run, agent, run.input)


async def resume(run_id: int) -> None:
    """Resume a run whose pause is fully decided. Each saved state is resumed at most once."""
    claimed = await db_hop(_claim_state_sync)(run_id)
    if claimed is None:
        return
    run, first_use = claimed
    await events.publish([_run_updated(run.pk, run.conversation_id, RunStatus.RUNNING)])
    if not first_use:
        await _fail(
            run,
            f"The saved state of pause {run.pause_count} was already resumed once or ended with "
            "its run (a copy of it was written back?); nothing was executed.",
        )
        return
    async with mcp.scope():
        try:
            agent = registry.get_agent(run.agent_name)
            state, edits = await _restore(run, agent)
            context = await _check_context(run)
        except RunFailure as failure:
            await _fail(run, str(failure))
            return
        except Exception as exc:
            await _fail(run, f"The run could not be resumed: {exc}")
            return
        if edits:
            await _edit_session_calls(run, edits)
        await _drive(run, agent, state, context)


@dataclass
class _Outcome:
    events: list[events.Event] = field(default_factory=list)
    resume: list[int] = field(default_factory=list)


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
    session = open_session(
        conversation.session_id,
        owner=conversation.owner_id,
        agent_name=run.agent_name,
        conversation_pk=conversation.pk,
        branch=run_branch(run),
    )
    result: RunResultStreaming | None = None
    stopper: _Stopper | None = None
    # Rules that ask for a person or reject stop calls of tools that need no approval too.
    await policies.aguard(agent)
    try:
        result = Runner.run_streamed(
            agent,
            run_input,
            context=context,
            session=session,
            run_config=_run_config(run, agent),
        )
        last_beat = time.monotonic()
        streamed = _Streamed(saved_at=last_beat)
        stopper = _Stopper.watching(run, result, streamed)
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
                await events.publish(
                    [
                        events.TextDelta(
                            run_id=run.pk,
                            conversation_id=conversation.pk,
                            delta=delta,
                            at=streamed.length,
                            segment=run.pause_count,
                        )
                    ]
                )
                streamed.add(delta)
            if streamed.due():
                await db_hop(_save_streamed)(run.pk, streamed.text())
    except (InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered) as tripped:
        await _end_by_guardrail(run, session, tripped, result)
        return
    except Exception as exc:
        await _end_by_error(run, session, exc, result)
        return
    finally:
        if stopper is not None:
            stopper.done()
    assert stopper is not None
    if stopper.stopped:
        await _end_stopped(run, session, stopper, result)
        return
    if result.interruptions:
        # What the run's MCP servers listed, read here on the loop that opened them.
        listed = mcp.listing()
        outcome = await _final_write(run.pk, _Outcome(), _save_pause, run, agent, result, listed)
    else:
        outcome = await _final_write(run.pk, _Outcome(), _save_completion, run, result)
    await events.publish(outcome.events)


# How often, at most, a streaming run stores what it has written so far (a reload shows it).
STREAMED_SAVE_SECONDS = 0.5


@dataclass
class _Streamed:
    """The text a run has streamed since it started or resumed (one "segment", numbered by
    the run's pause count). Each delta it publishes says where it starts (`at`, in code
    points) and `AgentRun.streamed_text` holds a prefix of it, so a page that renders the
    stored prefix appends only what it lacks (static/agentsite/chat.js)."""

    saved_at: float
    parts: list[str] = field(default_factory=list)
    length: int = 0
    saved_length: int = 0

    def add(self, delta: str) -> None:
        self.parts.append(delta)
        self.length += len(delta)

    def due(self) -> bool:
        now = time.monotonic()
        if self.length == self.saved_length or now - self.saved_at < STREAMED_SAVE_SECONDS:
            return False
        self.saved_at, self.saved_length = now, self.length
        return True

    def text(self) -> str:
        joined = "".join(self.parts)
        self.parts = [joined]
        return joined


def _save_streamed(run_id: int, text: str) -> None:
    try:
        AgentRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(streamed_text=text)
    except FINAL_WRITE_ERRORS as exc:
        # Only what a reload shows: the run goes on, and the next save catches up.
        logger.warning("Run %s: what it streamed could not be stored (%r).", run_id, exc)


# --- stopping a streamed run -----------------------------------------------------------------

# How often a streaming run reads whether its user pressed Stop in another process; a Stop
# taken by the process that runs it cancels at once (`_streaming`).
STOP_POLL_SECONDS = 1.0
STOPPED_REASON = "Stopped by {who}."
# Runs streaming in this process, and how to stop each, from any thread.
_streaming: dict[int, Callable[[], None]] = {}


class _Stopper:
    """Cancels a streamed run when its user asks (`stop` marks the run): at once when the
    Stop reaches this process, else within `STOP_POLL_SECONDS` (one indexed read a second
    while the run streams, never a write per token). Knows where the response being streamed
    starts in the run's `_Streamed` text, which the SDK drops on a cancel, so that what was
    said stays."""

    def __init__(self, run: AgentRun, result: RunResultStreaming, streamed: _Streamed) -> None:
        self.run_id = run.pk
        # A stop counts from this stream's claim on (a stop that came too late for an
        # earlier stream of the run, which paused meanwhile, does not stop this one).
        self.since = run.updated
        self.result = result
        self.stopped = False
        self.streamed = streamed
        self.response_from = 0
        self.loop = asyncio.get_running_loop()
        self.watcher = self.loop.create_task(self._watch())
        _streaming[run.pk] = self._stop_threadsafe

    @classmethod
    def watching(cls, run: AgentRun, result: RunResultStreaming, streamed: _Streamed) -> _Stopper:
        stopper = cls(run, result, streamed)
        if run.stop_requested is not None and run.stop_requested >= stopper.since:
            stopper.stop()
        return stopper

    def heard(self, data: Any) -> None:
        if getattr(data, "type", "") == "response.created":
            # A finished response is in the session already: only this one's text is kept.
            self.response_from = self.streamed.length

    def partial(self) -> str:
        """The text of the response the stop cut short."""
        return self.streamed.text()[self.response_from :]

    def stop(self) -> None:
        if not self.stopped and not self.result.is_complete:
            self.stopped = True
            self.result.cancel()

    def _stop_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop closed: the run is over anyway
            self.loop.call_soon_threadsafe(self.stop)

    async def _watch(self) -> None:
        while not self.stopped:
            await asyncio.sleep(STOP_POLL_SECONDS)
            if await db_hop(_stop_requested)(self.run_id, self.since):
                self.stop()

    def done(self) -> None:
        _streaming.pop(self.run_id, None)
        self.watcher.cancel()


def _stop_requested(run_id: int, since: Any) -> bool:
    try:
        return AgentRun.objects.filter(pk=run_id, stop_requested__gte=since).exists()
    except FINAL_WRITE_ERRORS:
        return False  # the database is away for a moment: the next read asks again


def stop(run: AgentRun | int, user: User | AnonymousUser | None) -> bool:
    """The conversation's owner stops a reply: a run that has not started (queued, or
    decided and not resumed yet) is cancelled at once, nothing of it executed; a streaming
    one is marked, and the process that runs it cancels the SDK's stream, keeps what was
    already said in the chat and the session, and ends the run as cancelled. False when
    the run had already ended (or paused: a waiting request is withdrawn instead).

    Raises:
        DecisionRefused: the user is not the one the conversation belongs to.
    """
    run_id = run.pk if isinstance(run, AgentRun) else int(run)
    found = (
        AgentRun.objects.filter(pk=run_id)
        .values_list("conversation__owner_id", "conversation_id")
        .first()
    )
    if user is None or not user.is_authenticated or found is None or found[0] != user.pk:
        raise DecisionRefused("Only the person who asked can stop this reply.")
    conversation_id = found[1]
    reason = STOPPED_REASON.format(who=user.get_username())
    if _fail_sync(
        run_id,
        reason,
        from_statuses=(RunStatus.QUEUED, RunStatus.RESUMING),
        status=RunStatus.CANCELLED,
    ):
        recording.record_stop(run_id, user.get_username(), timezone.now())
        events.publish_threadsafe(
            [_run_updated(run_id, conversation_id, RunStatus.CANCELLED, reason)]
        )
        return True
    now = timezone.now()
    if not AgentRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(stop_requested=now):
        return False
    signal = _streaming.get(run_id)
    if signal is not None:
        signal()  # it streams in this process: no need to wait for its next read
    return True


astop = sync_to_async(stop)


async def _end_stopped(
    run: AgentRun, session: Any, stopper: _Stopper, result: RunResultStreaming
) -> None:
    """What was said before the Stop stays: the SDK stores no part of a response it was
    cancelled in, so the text streamed so far goes into the session as the agent's message
    (unless the session already ends with it)."""
    partial = stopper.partial()
    try:
        recent = await session.get_items(STOP_LOOKBACK_ITEMS)
        added = _unanswered_calls(recent)
        said = bool(recent) and message_text(recent[-1]) == partial
        if partial.strip() and not (said and recent[-1].get("role") == "assistant"):
            added.append({"type": "message", "role": "assistant", "content": partial})
        if added:
            await session.add_items(added)
    except Exception:
        logger.exception("Run %s: what was said before its stop was not saved", run.pk)
    who = await db_hop(_stopped_by)(run)
    reason = STOPPED_REASON.format(who=who)
    # Recorded once the stream did stop (a Stop that came as the reply ended stops nothing).
    await db_hop(recording.record_stop)(run.pk, who, timezone.now())
    await _fail(run, reason, result, status=RunStatus.CANCELLED, from_statuses=(RunStatus.RUNNING,))


# A call stopped while it ran (a resumed run's approved call, saved with the pause) has no
# output in the session, which a model refuses on the next turn: it gets this one.
STOPPED_CALL_OUTPUT = (
    "The user stopped the reply while this call was running; it may or may not have completed."
)
STOP_LOOKBACK_ITEMS = 50


def _unanswered_calls(items: list[Any]) -> list[dict[str, Any]]:
    """An output for each tool call of the latest turn (since its user message) that has none,
    of the type its kind of call takes (a shell command's, a patch's, a function's)."""
    start = max((i for i, item in enumerate(items) if is_user_message(item)), default=-1)
    turn = items[start + 1 :]
    answered = {answer[0] for item in turn if (answer := output_view(item)) is not None}
    outputs = (stopped_output(item, STOPPED_CALL_OUTPUT) for item in turn)
    return [each for each in outputs if each is not None and each["call_id"] not in answered]


def _stopped_by(run: AgentRun) -> str:
    owner = Conversation.objects.filter(pk=run.conversation_id).values_list(
        "owner__username", flat=True
    )
    return owner.first() or "the user"


# --- guardrails -------------------------------------------------------------------------------

GUARDRAIL_INPUT_MESSAGE = (
    "Your message was not answered: a safety check of this agent refused it ({name})."
)
GUARDRAIL_OUTPUT_MESSAGE = "The agent's reply was held back by a safety check ({name})."


def guardrail_message(
    tripped: InputGuardrailTripwireTriggered | OutputGuardrailTripwireTriggered,
) -> str:
    """What the user reads when a guardrail ends the run: the guardrail's own words (its
    `output_info`, a text or a mapping with a "message"), else a plain sentence naming it."""
    result = tripped.guardrail_result
    info = result.output.output_info
    if isinstance(info, dict):
        info = info.get("message")
    if isinstance(info, str) and info.strip():
        return info.strip()[:MAX_MESSAGE_CHARS]
    name = result.guardrail.get_name() if hasattr(result.guardrail, "get_name") else "guardrail"
    if isinstance(tripped, InputGuardrailTripwireTriggered):
        return GUARDRAIL_INPUT_MESSAGE.format(name=name)
    return GUARDRAIL_OUTPUT_MESSAGE.format(name=name)


async def _end_by_guardrail(
    run: AgentRun,
    session: Any,
    tripped: InputGuardrailTripwireTriggered | OutputGuardrailTripwireTriggered,
    result: RunResultStreaming | None,
) -> None:
    """A guardrail that trips ends the run as "guardrail", with its message for the user.

    An input guardrail refused the message: the SDK had already stored it in the session,
    where the agent (and every guardrail, which reads the whole history) would meet it again
    on each later turn; it is taken out, and the run keeps it masked (card numbers, emails,
    ... as traces mask them), so a refused message is not kept as it was pasted."""
    message = guardrail_message(tripped)
    logger.info("Run %s: ended by a guardrail: %s", run.pk, message)
    masked = ""
    # Input guardrails run on a run's first turn only: a resumed run's turn holds executed
    # calls, which are never taken back.
    if isinstance(tripped, InputGuardrailTripwireTriggered) and run.pause_count == 0:
        try:
            await _take_back_input(session, run.input)
        except Exception:
            logger.exception("Run %s: the refused message could not be taken out", run.pk)
        masked = redaction.mask_text(run.input)
    await _fail(
        run,
        message,
        result,
        status=RunStatus.GUARDRAIL,
        from_statuses=(RunStatus.RUNNING,),
        masked_input=masked,
    )


async def _take_back_input(session: Any, text: str) -> None:
    """Pop the session's newest items back to and with the user's message `text`, if it is
    the newest user message (items of other runs are never touched)."""
    items = await session.get_items(20)
    for index in range(len(items) - 1, -1, -1):
        if is_user_message(items[index]):
            if message_text(items[index]).strip() != text.strip():
                return
            for _ in range(len(items) - index):
                await session.pop_item()
            return


# --- failures ---------------------------------------------------------------------------------

# What the log line of a failed run says: the detail without the provider's message, which
# may quote what the user wrote (the run's admin page shows it whole).
LOGGED_DETAIL = (
    "kind",
    "exception",
    "status_code",
    "request_id",
    "error_type",
    "error_code",
    "attempts",
    "model",
    "endpoint",
    "retry_after",
    "timeout_seconds",
)


async def _end_by_error(
    run: AgentRun, session: Any, exc: Exception, result: RunResultStreaming | None
) -> None:
    """A model call (or anything else in the run) failed: the run fails with a sentence the
    user understands (`model_errors`), the detail is kept for operators (the run's
    `error_detail`, a span of its trace, one log line), and nothing of the failed answer
    stays: the SDK stores a response's items only once it completed. When nothing of the
    turn was stored but the user's message, it is taken out of the session too, so "Send
    again" does not repeat it to the agent; the chat still shows it with the failed run."""
    failure = model_errors.describe(exc)
    logged = {key: failure.detail[key] for key in LOGGED_DETAIL if key in failure.detail}
    logger.warning("Run %s failed: %s", run.pk, json.dumps(logged, default=str))
    if run.pause_count == 0:
        # A resumed run's turn holds calls that executed: never taken back.
        try:
            await _take_back_unanswered(session, run.input)
        except Exception:
            logger.exception("Run %s: its unanswered message could not be taken out", run.pk)
    await _fail(run, failure.message, result, error_detail=failure.detail)


async def _take_back_unanswered(session: Any, text: str) -> bool:
    """Pop the user's message `text` if it is the session's newest item (nothing of its
    turn was stored after it: no tool ran); True if it was popped."""
    newest = await session.get_items(1)
    if not newest or not is_user_message(newest[-1]):
        return False
    if message_text(newest[-1]).strip() != text.strip():
        return False
    await session.pop_item()
    return True


# --- the final write, through a database outage ---------------------------------------------

# A connection that broke or a database that does not answer: worth another try.
FINAL_WRITE_ERRORS = (OperationalError, InterfaceError)
FINAL_WRITE_FIRST_DELAY = 0.05
FINAL_WRITE_MAX_DELAY = 2.0
ABANDONED_REASON = (
    "The run ended, but its result could not be saved: the database could not be reached. "
    "Nothing was retried."
)
# Runs of this process whose final write gave up, with the reason they fail with:
# `fail_abandoned` fails them on the process's next heartbeat that reaches the database.
_abandoned: dict[int, str] = {}
_abandoned_lock = threading.Lock()


async def _final_write[T](
    run_id: int,
    gave_up: T,
    write: Callable[..., T],
    *args: Any,
    lost_reason: str = ABANDONED_REASON,
) -> T:
    """`write(*args)` in a database thread, tried again with backoff for
    AGENTSITE_FINAL_WRITE_RETRY_SECONDS while the database cannot be reached (each write is
    one transaction, conditional on the run still running, so a retry never applies twice).
    If it still cannot be written, the run is left to this process's next heartbeat, which
    fails it, and `gave_up` is returned."""
    deadline = time.monotonic() + settings.AGENTSITE_FINAL_WRITE_RETRY_SECONDS
    delay = FINAL_WRITE_FIRST_DELAY
    attempt = 1
    while True:
        try:
            return await db_hop(_attempt_write)(write, *args)
        except FINAL_WRITE_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                logger.error(
                    "Run %s: its final write failed %d time(s), the last with %r; it fails at "
                    "this process's next heartbeat.",
                    run_id,
                    attempt,
                    exc,
                )
                with _abandoned_lock:
                    _abandoned[run_id] = lost_reason
                return gave_up
            logger.warning(
                "Run %s: its final write failed (%r); trying again in %.2g s.", run_id, exc, delay
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, FINAL_WRITE_MAX_DELAY)
        attempt += 1


def _attempt_write[T](write: Callable[..., T], *args: Any) -> T:
    try:
        return write(*args)
    except FINAL_WRITE_ERRORS:
        # The connection may be broken: the next attempt opens a new one.
        if not connection.in_atomic_block:
            with contextlib.suppress(DatabaseError):
                connection.close()
        raise


def fail_abandoned() -> int:
    """Fail this process's runs whose final write gave up (the database answers again: the
    heartbeat that calls this just reached it). Returns how many failed."""
    with _abandoned_lock:
        left = sorted(_abandoned.items())
    failed = 0
    for run_id, reason in left:
        if _fail_sync(run_id, reason, from_statuses=(RunStatus.RUNNING,)):
            failed += 1
            conversation_id = (
                AgentRun.objects.filter(pk=run_id).values_list("conversation_id", flat=True).get()
            )
            events.publish_sync([_run_updated(run_id, conversation_id, RunStatus.FAILED, reason)])
        with _abandoned_lock:
            _abandoned.pop(run_id, None)
    return failed


def _heartbeat(run_id: int) -> None:
    try:
        AgentRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(updated=timezone.now())
    except FINAL_WRITE_ERRORS as exc:
        # A sign of life only (the process's own heartbeat is what counts): a database that
        # does not answer for a moment does not end the run.
        logger.warning("Run %s: its sign of life could not be written (%r).", run_id, exc)


def _usage(result: RunResultStreaming | None) -> dict[str, int]:
    if result is None:
        return {}
    usage = result.context_wrapper.usage
    return {
        "requests": usage.requests,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
    }


def _store_turn_usage(run: AgentRun, result: RunResultStreaming) -> None:
    """What the run used so far, as its turn's usage in the session (the SDK's
    `store_run_usage`, on the run's branch): a resumed run's usage holds its pause's."""
    record_turn_usage(run.conversation_id, run_branch(run), result.context_wrapper.usage, run.pk)


def _trace_id(result: RunResultStreaming | None) -> str:
    trace = getattr(result, "trace", None)
    return str(getattr(trace, "trace_id", "") or "")


def _final_text(output: Any) -> str:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if hasattr(output, "model_dump_json"):
        return str(output.model_dump_json())
    return json.dumps(output, default=str, ensure_ascii=False)


def _save_completion(run: AgentRun, result: RunResultStreaming) -> _Outcome:
    now = timezone.now()
    run.trace_id = _trace_id(result) or run.trace_id
    with transaction.atomic():
        # Only a run that is still ours: one failed meanwhile (recovery, a crash handler)
        # stays so.
        saved = (
            AgentRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
                status=RunStatus.COMPLETED,
                final_output=_final_text(result.final_output),
                usage=_usage(result),
                trace_id=run.trace_id,
                state=None,
                state_signature="",
                streamed_text="",
                finished=now,
                updated=now,
            )
            == 1
        )
        if saved:
            recording.follow_run(run, RunStatus.COMPLETED)
            _follow_agent(run, result)
            _store_turn_usage(run, result)
            signals.run_completed.send(sender=AgentRun, run_id=run.pk)
    completed = _Outcome(events=[_run_updated(run.pk, run.conversation_id, RunStatus.COMPLETED)])
    if not saved:
        if AgentRun.objects.filter(pk=run.pk, status=RunStatus.COMPLETED).exists():
            # An earlier attempt committed before its connection broke (only this write
            # completes a run).
            return completed
        logger.warning("Run %s finished but was no longer running; its result was dropped.", run.pk)
        return _Outcome()
    return completed


def sign_state(state: Any) -> str:
    canonical = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # The salt keeps the module's old name: runs that waited for a reviewer across the move
    # to engine/ must still verify.
    return salted_hmac("agentsite.runs.state", canonical, algorithm="sha256").hexdigest()


def _origin(item: ToolApprovalItem, starting_agent: Agent[Any]) -> str:
    origin = getattr(item, "tool_origin", None)
    if origin is not None and origin.type == ToolOriginType.AGENT_AS_TOOL:
        return ApprovalOrigin.AGENT_AS_TOOL
    if item.agent is not None and item.agent.name != starting_agent.name:
        # Approvals inside an agent-as-tool carry that agent; anything else came after a handoff.
        if registry.is_agent_as_tool(starting_agent, item.agent.name):
            return ApprovalOrigin.AGENT_AS_TOOL
        return ApprovalOrigin.HANDOFF
    return ApprovalOrigin.TOOL


def _save_pause(
    run: AgentRun,
    agent: Agent[Any],
    result: RunResultStreaming,
    mcp_tools: dict[str, Any] | None = None,
) -> _Outcome:
    # The context as ids only (`engine/context.py`); anything else in it refuses to be saved.
    state = result.to_state().to_json(context_serializer=run_context.serialize, strict_context=True)
    run.trace_id = _trace_id(result) or run.trace_id
    interruptions = list(result.interruptions)
    # The approval policies, read once for the pause; a deciding verdict is a decision below.
    # A call that paused only because a rule's gate stopped it keeps that rule's verdict.
    calls = [
        policies.call_for(
            item.agent.name if item.agent else agent.name,
            item.tool_name or "",
            parse_arguments(paused_calls.arguments(item)),
            run.agent_name,
            paused_calls.kind(item),
        )
        for item in interruptions
    ]
    verdicts = policies.verdicts(calls, run.requested_by_id)
    context = result.context_wrapper.context
    verdicts = [
        policies.gated_verdict(context, item.call_id or "") or verdict
        for item, verdict in zip(interruptions, verdicts, strict=True)
    ]
    # Chosen now, like the verdict: a later change to the rule or the tool changes nothing.
    expiries = [
        expiry_policy(verdict, call.review) for verdict, call in zip(verdicts, calls, strict=True)
    ]
    now = timezone.now()
    expires_at = now + timedelta(seconds=settings.AGENTSITE_APPROVAL_TTL)
    outcome = _Outcome()
    try:
        with transaction.atomic():
            # FOR NO KEY UPDATE, as in `_record_decision`: the exporter's batch of this run's
            # trace checks its foreign key to the run on commit, while this waits for its row.
            locked = AgentRun.objects.select_for_update(no_key=True).get(pk=run.pk)
            if (
                locked.status in (RunStatus.WAITING, RunStatus.RESUMING)
                and locked.pause_count == run.pause_count + 1
            ):
                # An earlier attempt committed before its connection broke (only this write
                # moves a running run to waiting, or to resuming when policies decided all
                # of its calls: a resumption takes the state once, so asking again is safe).
                requests = list(ApprovalRequest.objects.of_pause(locked, locked.pause_count))
                outcome.events.extend(
                    events.ApprovalCreated.for_request(r) for r in requests if r.is_pending
                )
                outcome.events.append(_run_updated(run.pk, run.conversation_id, locked.status))
                if locked.status == RunStatus.RESUMING:
                    transaction.on_commit(lambda: executor.submit("resume", run.pk))
                return outcome
            if locked.status != RunStatus.RUNNING:
                # Failed meanwhile: asking reviewers to approve a dead run's calls is wrong.
                logger.warning("Run %s paused but was %s; nothing saved.", run.pk, locked.status)
                return outcome
            pause = locked.pause_count + 1
            state[STATE_BINDING] = {"run": run.pk, "pause": pause, "nonce": secrets.token_hex(16)}
            if mcp_tools:
                # The MCP servers the run opened: the resume opens them first, to hold their
                # tools against this fingerprint.
                state[STATE_BINDING]["mcp"] = sorted(mcp_tools)
            requests = [
                ApprovalRequest.objects.create(
                    run=locked,
                    pause=pause,
                    call_id=item.call_id or "",
                    agent_name=item.agent.name if item.agent else agent.name,
                    tool_name=item.tool_name or "",
                    arguments=parse_arguments(paused_calls.arguments(item)),
                    arguments_hash=arguments_hash(paused_calls.arguments(item)),
                    origin=_origin(item, agent),
                    kind=paused_calls.kind(item),
                    server=paused_calls.server(item)[:200],
                    expires_at=expires_at,
                    verdict=verdict.as_json(),
                    on_expiry=expiry.action,
                    escalate_to=expiry.group,
                    expiry_note=expiry.note,
                )
                for item, verdict, expiry in zip(interruptions, verdicts, expiries, strict=True)
            ]
            decided = [
                _decide_by_policy(request, verdict, now)
                for request, verdict in zip(requests, verdicts, strict=True)
                if verdict.decides
            ]
            # Every call decided by a policy: the run goes on at once, as after a person's
            # last decision (the state is saved first: it resumes through the same path).
            resuming = len(decided) == len(requests)
            AgentRun.objects.filter(pk=run.pk).update(
                status=RunStatus.RESUMING if resuming else RunStatus.WAITING,
                state=state,
                state_signature=sign_state(state),
                state_consumed=False,
                pause_count=pause,
                sdk_version=SDK_VERSION,
                state_schema_version=str(state.get("$schemaVersion", "")),
                agent_fingerprint=registry.fingerprint(agent, mcp_tools),
                trace_id=run.trace_id,
                usage=_usage(result),
                streamed_text="",
                updated=now,
            )
            status = RunStatus.RESUMING if resuming else RunStatus.WAITING
            # A copy: `run` stays as it was claimed, which a retry of this write compares.
            paused = copy.copy(run)
            paused.status = status
            for request, decision in decided:
                # In this transaction, as a person's: the trace shows it when the audit does.
                recording.record_decision(request, decision, request.status, paused)
            for request in requests:
                if request.is_pending:
                    signals.approval_created.send(sender=ApprovalRequest, request=request)
            for request, decision in decided:
                signals.approval_decided.send(
                    sender=ApprovalRequest, request=request, decision=decision
                )
            recording.follow_run(run, status)
            _follow_agent(run, result)
            _store_turn_usage(run, result)
            if resuming:
                transaction.on_commit(lambda: executor.submit("resume", run.pk))
    except IntegrityError as exc:
        # The model reused a call id of this run: its calls could no longer be told apart.
        _fail_sync(run.pk, f"The agent paused with a call id it had used before: {exc}", result)
        return _Outcome(events=[_run_updated(run.pk, run.conversation_id, RunStatus.FAILED)])
    # A call a policy decided never reaches an inbox.
    outcome.events.extend(
        events.ApprovalCreated.for_request(request) for request in requests if request.is_pending
    )
    outcome.events.append(_run_updated(run.pk, run.conversation_id, status))
    return outcome


@dataclass(frozen=True)
class Expiry:
    """A request's expiry policy: what happens when nobody decides it in time."""

    action: str = ExpiryAction.REJECT
    group: str = ""
    # Why it is not what the rule or the tool asked for, for reviewers ("" when it is).
    note: str = ""


def expiry_policy(verdict: policies.Verdict, review: registry.Review) -> Expiry:
    """The expiry policy of a call that paused with `verdict`: the one of the rule that sent
    it to a person, when it names one, else its tool's (`registry.review`); approve only
    where the tool's author allows it (else reject, and the note says so)."""
    by_rule = bool(verdict.on_expiry and verdict.policy_name and not verdict.failed)
    if by_rule:
        action, group = verdict.on_expiry, verdict.escalate_to.strip()
        whose = f"The policy “{verdict.policy_name}”"
    else:
        action, group, whose = review.on_expiry, review.escalate_to.strip(), "The tool"
    if action == ExpiryAction.APPROVE and not review.expiry_approval:
        return Expiry(
            note=f"{whose} would approve it on expiry, but the tool's author does not allow "
            "that: it is rejected on expiry."
        )
    if action == ExpiryAction.ESCALATE and not group:
        return Expiry(note=f"{whose} escalates it to no group: it is rejected on expiry.")
    if action not in ExpiryAction.values:
        return Expiry(note=f"{whose} says {action!r} on expiry, which is not known: rejected.")
    return Expiry(action, group if action == ExpiryAction.ESCALATE else "")


def _decide_by_policy(
    request: ApprovalRequest, verdict: policies.Verdict, now: Any
) -> tuple[ApprovalRequest, ApprovalDecision]:
    """Record the decision of the policy whose `verdict` decides `request` (just created, in
    the pause's transaction): the request decided by nobody in person, the audit's row
    naming the policy as it was (a later change to it changes neither)."""
    approve = verdict.action == policies.PolicyAction.APPROVE
    request.status = ApprovalStatus.APPROVED if approve else ApprovalStatus.REJECTED
    request.decided_at = now
    request.save(update_fields=["status", "decided_at"])
    decision = ApprovalDecision.objects.create(
        request=request,
        reviewer=None,
        approved=approve,
        kind=DecisionKind.APPROVED if approve else DecisionKind.REJECTED,
        message="" if approve else verdict.message.strip()[:MAX_MESSAGE_CHARS],
        note=verdict.sentence()[:MAX_MESSAGE_CHARS],
        arguments_hash=request.arguments_hash,
        # The rule as it was read; deleted since, the name alone stays (its row is locked
        # until this commits, so it cannot go in between).
        policy_id=ApprovalPolicy.objects.select_for_update(no_key=True)
        .filter(pk=verdict.policy_id or 0)
        .values_list("pk", flat=True)
        .first(),
        policy_name=verdict.policy_name,
    )
    return request, decision


def _run_updated(
    run_id: int, conversation_id: int, status: str, error: str = ""
) -> events.RunUpdated:
    return events.RunUpdated(
        run_id=run_id, conversation_id=conversation_id, status=status, error=error
    )


# --- claiming, failing ----------------------------------------------------------------------


async def _claim(run_id: int, expected: str) -> AgentRun | None:
    run = await db_hop(_claim_sync)(run_id, expected)
    if run is not None:
        await events.publish([_run_updated(run.pk, run.conversation_id, RunStatus.RUNNING)])
    return run


def _claim_sync(run_id: int, expected: str) -> AgentRun | None:
    """Move the run from `expected` to running; only one caller ever wins."""
    # One conditional UPDATE decides who wins (engine/sql.py says why it is plain SQL).
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(
            statements().claim, [RunStatus.RUNNING, now, heartbeat.owner(), run_id, expected]
        )
        claimed = cursor.rowcount == 1
    if not claimed:
        logger.info("Run %s was not %s (or already taken); left alone.", run_id, expected)
        return None
    return AgentRun.objects.select_related("conversation", "requested_by", "branch_link").get(
        pk=run_id
    )


def _claim_state_sync(run_id: int) -> tuple[AgentRun, bool] | None:
    """Move the run from resuming to running and take its saved state; only one caller ever
    wins. With the run: True if its pause's state was never taken before, False if a row says
    it was (a copy written back after its resumption or its run's failure)."""
    now = connection.ops.adapt_datetimefield_value(timezone.now())
    sql = statements()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                sql.claim_state,
                [RunStatus.RUNNING, now, heartbeat.owner(), True, run_id, RunStatus.RESUMING],
            )
            claimed = cursor.rowcount == 1
        if not claimed:
            logger.info("Run %s was not resuming (or already taken); left alone.", run_id)
            return None
        run = AgentRun.objects.select_related("conversation", "branch_link").get(pk=run_id)
        with connection.cursor() as cursor:
            cursor.execute(sql.consume, [run.pk, run.pause_count, _nonce(run.state), now])
            first_use = cursor.rowcount == 1
    if not first_use:
        logger.warning(
            "Run %s: the state of pause %s was taken before; refused.", run_id, run.pause_count
        )
    return run, first_use


def _nonce(state: Any) -> str:
    """The nonce a saved state is bound by; "" for a state saved before states were bound."""
    binding = state.get(STATE_BINDING) if isinstance(state, dict) else None
    nonce = binding.get("nonce") if isinstance(binding, dict) else None
    return nonce if isinstance(nonce, str) else ""


async def _fail(
    run: AgentRun,
    reason: str,
    result: RunResultStreaming | None = None,
    *,
    status: str = RunStatus.FAILED,
    from_statuses: tuple[str, ...] = ACTIVE_STATUSES,
    masked_input: str = "",
    error_detail: dict[str, Any] | None = None,
) -> None:
    """End the run as failed (or with another finished `status`, see `_fail_sync`), the
    write retried as every final write is, and tell the pages once it is stored."""
    end = functools.partial(
        _fail_sync,
        from_statuses=from_statuses,
        status=status,
        masked_input=masked_input,
        error_detail=error_detail,
    )
    if await _final_write(run.pk, False, end, run.pk, reason, result, lost_reason=reason):
        await events.publish([_run_updated(run.pk, run.conversation_id, status, reason)])


def _fail_sync(
    run_id: int,
    reason: str,
    result: RunResultStreaming | None = None,
    *,
    from_statuses: tuple[str, ...] = ACTIVE_STATUSES,
    quiet_since: Any = None,
    owned_by: str | None = None,
    status: str = RunStatus.FAILED,
    masked_input: str = "",
    error_detail: dict[str, Any] | None = None,
) -> bool:
    """Fail the run if it is still in one of `from_statuses`; True if this call failed it.
    (Or end it with another finished `status`: cancelled, guardrail; `reason` is its
    message, and `masked_input` replaces what the user wrote.) `error_detail`, for
    operators, is stored on the run and as a span of its trace.

    Its saved state goes with it: a failed run can never be resumed, whatever its status is
    set back to later."""
    now = timezone.now()
    changes: dict[str, Any] = {
        "status": status,
        "error": reason,
        "state": None,
        "state_signature": "",
        "streamed_text": "",
        "finished": now,
        "updated": now,
    }
    if masked_input:
        changes["input"] = masked_input
    if error_detail is not None:
        changes["error_detail"] = error_detail
    if result is not None:
        changes["usage"] = _usage(result)
        if _trace_id(result):
            changes["trace_id"] = _trace_id(result)
    with transaction.atomic():
        rows = AgentRun.objects.filter(pk=run_id, status__in=from_statuses)
        if quiet_since is not None:
            rows = rows.stuck(quiet_since)
        if owned_by is not None:
            rows = rows.filter(process=owned_by)
        paused = rows.filter(pause_count__gt=0).values_list("pause_count", "state").first()
        failed = rows.update(**changes)
        if failed and paused is not None:
            # Its last pause's state is taken too: a copy of it written back is refused.
            pause, state = paused
            ConsumedState.objects.bulk_create(
                [ConsumedState(run_id=run_id, pause=pause, nonce=_nonce(state))],
                ignore_conflicts=True,
            )
        if failed:
            # Whatever still waits in this run can no longer be decided.
            ApprovalRequest.objects.filter(run_id=run_id).pending().update(
                status=ApprovalStatus.CANCELLED
            )
            recording.follow_run(run_id)
            if error_detail is not None:
                recording.record_failure(run_id, reason, error_detail, now)
            signals.run_failed.send(sender=AgentRun, run_id=run_id, status=status, reason=reason)
    return bool(failed)


SHUTDOWN_REASON = (
    "Interrupted by a shutdown: the server stopped before this run ended. Nothing was retried."
)


def interrupt(run_ids: list[int]) -> int:
    """Fail the runs a stopping process could not finish in time (`executor.drain`): those
    still running, perhaps mid-tool, are never retried. Runs whose job had not started yet
    stay queued or resuming for the next process's recovery. Returns how many failed."""
    return sum(
        _fail_sync(run_id, SHUTDOWN_REASON, from_statuses=(RunStatus.RUNNING,))
        for run_id in run_ids
    )


async def fail_unfinished(run_id: int, reason: str) -> None:
    """Fail a run that a crash left queued, running or resuming; others stay as they are."""
    if await _final_write(run_id, False, _fail_sync, run_id, reason, lost_reason=reason):
        conversation_id = (
            await AgentRun.objects.filter(pk=run_id)
            .values_list("conversation_id", flat=True)
            .aget()
        )
        await events.publish([_run_updated(run_id, conversation_id, RunStatus.FAILED, reason)])


# --- restoring a paused run -----------------------------------------------------------------


async def _restore(run: AgentRun, agent: Agent[Any]) -> tuple[RunState[Any], dict[str, str]]:
    """The run's saved state, checked, with our decisions applied; and the calls a reviewer
    edited (call id -> the arguments they run with, as the JSON text the SDK passes on)."""
    saved = run.state
    if not isinstance(saved, dict):
        raise RunFailure(
            "This run has no saved state (it is missing, or was cleared when the run failed); "
            "nothing was executed."
        )
    if not hmac.compare_digest(sign_state(saved), run.state_signature):
        raise RunFailure(
            "The saved state was changed outside agentsite (its signature does not match); "
            "nothing was executed."
        )
    saved = dict(saved)
    binding = saved.pop(STATE_BINDING, None)
    # A state saved before states were bound has none; the (run, pause) row still guards it.
    if binding is not None and (
        not isinstance(binding, dict)
        or binding.get("run") != run.pk
        or binding.get("pause") != run.pause_count
    ):
        raise RunFailure(
            "The saved state belongs to another run or pause than this one; nothing was executed."
        )
    version = str(saved.get("$schemaVersion", ""))
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise RunFailure(
            f"The saved state has schema version {version or '(none)'}, which this SDK "
            f"({SDK_VERSION}) cannot read; nothing was executed."
        )
    servers = binding.get("mcp", []) if isinstance(binding, dict) else []
    try:
        await mcp.connect(registry.walk(agent), servers if isinstance(servers, list) else [])
    except mcp.ServerUnavailable as unavailable:
        raise RunFailure(f"{unavailable} Nothing was executed.") from unavailable
    if registry.fingerprint(agent, mcp.listing()) != run.agent_fingerprint:
        raise RunFailure(
            "The agent changed since this run paused (its tools, their arguments or approval "
            "settings differ, or those of its MCP servers); nothing was executed."
        )
    requests = await db_hop(_requests_with_decisions)(run)
    _refuse_injected_approvals(saved, requests)
    edits = _checked_edits(run, requests)
    saved = _with_edits(saved, requests, edits)
    try:
        state = await RunState.from_json(
            agent,
            saved,
            context_deserializer=run_context.deserialize,
            strict_context=True,
        )
    except Exception as exc:
        raise RunFailure(
            f"The saved state could not be read ({exc}); nothing was executed."
        ) from exc
    _apply_decisions(state, requests)
    return state, edits


async def _check_context(run: AgentRun) -> run_context.RunContext:
    """The context the resumed run acts with, from its (verified) saved state: it must be this
    run's, and the user who asked must still be active, or nothing of the paused call runs."""
    saved = (run.state or {}).get("context") or {}
    data = saved.get("context") if isinstance(saved, dict) else None
    if data is None:
        # Saved before runs carried a context: the run's own row says whom it acts for.
        context = run_context.RunContext.for_run(run)
    else:
        try:
            context = run_context.deserialize(data)
        except (TypeError, ValueError) as exc:
            raise RunFailure(
                f"The saved state's context could not be read ({exc}); nothing was executed."
            ) from exc
    expected = run_context.RunContext.for_run(run)
    # A user deleted while the run waited leaves `requested_by` empty (SET_NULL): the lookup
    # below says so.
    if (context.run_id, context.conversation_id, context.session_id) != (
        expected.run_id,
        expected.conversation_id,
        expected.session_id,
    ) or (run.requested_by_id is not None and context.user_id != run.requested_by_id):
        raise RunFailure(
            "The saved state acts for another run or user than this one; nothing was executed."
        )
    if context.user_id is not None:
        # Loaded here, once, for the tools too (kept on the context).
        reason = await db_hop(_requester_gone)(context)
        if reason:
            raise RunFailure(reason)
    return context


def _requester_gone(context: run_context.RunContext) -> str:
    """Why the user who asked can no longer be acted for, or "" when they still can."""
    try:
        run_context.requesting_user_sync(context)
    except run_context.RequesterUnavailable:
        user = get_user_model().objects.filter(pk=context.user_id or 0).first()
        if user is None:
            return "The user who asked was deleted while the run waited; nothing was executed."
        return (
            f"The user who asked ({user.get_username()}) was deactivated while the run "
            "waited; nothing was executed."
        )
    return ""


def _requests_with_decisions(run: AgentRun) -> dict[str, tuple[ApprovalRequest, ApprovalDecision]]:
    pairs: dict[str, tuple[ApprovalRequest, ApprovalDecision]] = {}
    for request in ApprovalRequest.objects.of_pause(run, run.pause_count):
        decision = request.decisions.order_by("-created", "-pk").first()
        if decision is None or not request.is_decided:
            raise RunFailure(
                f"The request for {request.tool_name} has no decision; nothing was executed."
            )
        pairs[request.call_id] = (request, decision)
    return pairs


def _refuse_injected_approvals(saved: dict[str, Any], requests: dict[str, Any]) -> None:
    """The SDK keeps decisions inside the state; ours live in our rows. None may be in there
    for a call that is waiting for us."""
    approvals = (saved.get("context") or {}).get("approvals") or {}
    for record in approvals.values() if isinstance(approvals, dict) else []:
        for key in ("approved", "rejected"):
            listed = record.get(key) if isinstance(record, dict) else None
            if isinstance(listed, list) and set(listed) & set(requests):
                raise RunFailure(
                    "The saved state already holds a decision for a call that waits for a "
                    "reviewer; it was tampered with, and nothing was executed."
                )


def _apply_decisions(
    state: RunState[Any], requests: dict[str, tuple[ApprovalRequest, ApprovalDecision]]
) -> None:
    interruptions = {item.call_id or "": item for item in state.get_interruptions()}
    if set(interruptions) != set(requests):
        raise RunFailure(
            "The saved state does not match this run's approval requests; nothing was executed."
        )
    for call_id, item in interruptions.items():
        request, decision = requests[call_id]
        seen = {
            arguments_hash(request.arguments),
            request.arguments_hash,
            decision.arguments_hash,
        }
        # An edited call was rewritten to the reviewer's arguments (`_with_edits`, which
        # checked the model's first): those must be what runs.
        runs_with = decision.edited_arguments_hash if decision.is_edit else request.arguments_hash
        if len(seen) != 1 or arguments_hash(paused_calls.arguments(item)) != runs_with:
            raise RunFailure(
                f"The arguments of {request.tool_name} are not the ones the reviewer saw; "
                "nothing was executed."
            )
    for call_id, item in interruptions.items():
        request, decision = requests[call_id]
        if decision.is_response:
            # Answered as the tool: the SDK's rejection is its one way to give the model an
            # output without running the tool, and it sends this exact text back as the
            # call's output (`RunState.reject(rejection_message=...)`). Never "always": the
            # reviewer answered this call, not the next ones.
            state.reject(item, rejection_message=decision.message)
        elif decision.approved:
            state.approve(item, always_approve=decision.always)
        else:
            state.reject(
                item,
                always_reject=decision.always,
                rejection_message=rejection_text(request, decision),
            )


# --- edit, then approve ------------------------------------------------------------------------
#
# The SDK (0.24) has no argument override on approve: `RunState.approve(item)` runs the call
# as the model made it. A saved state holds that call in several places (the model's
# response, the generated and session items, the pending interruption, the last processed
# response's function runs, which is what the SDK executes on resume), each a
# `{"type": "function_call", "call_id": ..., "arguments": "<json>"}`. An edited call is
# rewritten in all of them alike, in the copy of the verified state that is restored, never
# in the stored one (whose signature stays the one it was saved with), and only from a
# decision row whose edit is signed by the site. The conversation's session, which stored the
# model's call at the pause, is given the call that ran (`_edit_session_calls`).

EDIT_SALT = "agentsite.runs.edit"


def sign_edit(request: ApprovalRequest, reviewer_id: int | None, old: str, new: str) -> str:
    """The site's signature over an edit: which call (request, run, pause, call id), who
    edited it, and the hashes of the model's and the reviewer's arguments."""
    canonical = json.dumps(
        [request.pk, request.run_id, request.pause, request.call_id, reviewer_id, old, new],
        separators=(",", ":"),
    )
    return salted_hmac(EDIT_SALT, canonical, algorithm="sha256").hexdigest()


def _edit_fields(
    request: ApprovalRequest, run: AgentRun, reviewer: User | None, edited: Any
) -> dict[str, Any]:
    """What an edit adds to its decision; {} when the arguments are the model's.

    Raises:
        DecisionRefused: the call is not a function tool's (an MCP server's, a shell
            command, a patch: no schema here to check edits against, and a function tool of
            the same name must not lend it its own), the tool's author forbids edits, or they
            do not fit its schema.
    """
    if request.kind != ToolKind.FUNCTION:
        raise InvalidDecision(
            f"Only a function tool's arguments can be edited, and this is a call of a "
            f"{request.get_kind_display().lower()}; approve or reject it as it is."
        )
    sheet = registry.tool_sheet(run.agent_name, request.agent_name, request.tool_name)
    if not sheet.editable:
        raise InvalidDecision(
            f"The arguments of {request.tool_name} cannot be edited (its author does not "
            "allow it); approve or reject the call as it is."
        )
    errors = registry.argument_errors(sheet.schema, edited)
    if errors:
        raise InvalidDecision("The edited arguments do not fit the tool: " + "; ".join(errors))
    new = arguments_hash(edited)
    if new == request.arguments_hash:
        return {}
    reviewer_id = reviewer.pk if reviewer is not None else None
    return {
        "edited_arguments": edited,
        "edited_arguments_hash": new,
        "edit_signature": sign_edit(request, reviewer_id, request.arguments_hash, new),
    }


def _checked_edits(
    run: AgentRun, requests: dict[str, tuple[ApprovalRequest, ApprovalDecision]]
) -> dict[str, str]:
    """The edited calls of the pause (call id -> their arguments as JSON text), each edit
    checked: its hash, the site's signature over it, and that the tool still allows edits."""
    edits: dict[str, str] = {}
    for call_id, (request, decision) in requests.items():
        if not decision.is_edit:
            continue
        if request.kind != ToolKind.FUNCTION:
            raise RunFailure(
                f"The call of {request.tool_name} was edited, but it is not a function tool's "
                "(its arguments cannot be edited); nothing was executed."
            )
        signature = sign_edit(
            request, decision.reviewer_id, decision.arguments_hash, decision.edited_arguments_hash
        )
        if arguments_hash(decision.edited_arguments) != decision.edited_arguments_hash or not (
            hmac.compare_digest(signature, decision.edit_signature)
        ):
            raise RunFailure(
                f"The edited arguments of {request.tool_name} were changed outside agentsite "
                "(they do not match the reviewer's signed edit); nothing was executed."
            )
        if not registry.tool_sheet(run.agent_name, request.agent_name, request.tool_name).editable:
            raise RunFailure(
                f"The arguments of {request.tool_name} may no longer be edited; nothing was "
                "executed."
            )
        edits[call_id] = json.dumps(
            decision.edited_arguments, ensure_ascii=False, separators=(",", ":")
        )
    return edits


def _with_edits(
    saved: dict[str, Any],
    requests: dict[str, tuple[ApprovalRequest, ApprovalDecision]],
    edits: dict[str, str],
) -> dict[str, Any]:
    """A copy of the saved state whose edited calls carry the reviewer's arguments, wherever
    the state holds them. Each must hold the model's arguments first, or nothing runs."""
    if not edits:
        return saved
    edited = copy.deepcopy(saved)
    calls: dict[str, dict[str, Any]] = {}

    def rewrite(node: Any) -> None:
        if isinstance(node, dict):
            call_id = node.get("call_id")
            if node.get("type") == "function_call" and call_id in edits:
                request = requests[call_id][0]
                if arguments_hash(node.get("arguments")) != request.arguments_hash:
                    raise RunFailure(
                        f"The arguments of {request.tool_name} are not the ones the reviewer "
                        "saw; nothing was executed."
                    )
                calls.setdefault(call_id, dict(node))
                node["arguments"] = edits[call_id]
            for value in node.values():
                rewrite(value)
        elif isinstance(node, list):
            for value in node:
                rewrite(value)

    rewrite(edited)
    if set(calls) != set(edits):
        raise RunFailure(
            "The saved state does not hold a call the reviewer edited; nothing was executed."
        )
    _refingerprint(edited, calls, edits)
    return edited


def _refingerprint(
    state: dict[str, Any], calls: dict[str, dict[str, Any]], edits: dict[str, str]
) -> None:
    """The SDK's ledger of the run's tool invocations (`context.tool_invocations`) keeps a
    fingerprint of each call's arguments and refuses a call whose arguments differ from it
    ("reused a tool call ID"): an edited call's entry takes the fingerprint of the edited
    call, computed by the SDK's own function, once that function is seen to give the stored
    fingerprint for the model's call (else the SDK changed how it fingerprints: fail closed)."""
    ledger = (state.get("context") or {}).get("tool_invocations")
    for call_id, original in calls.items():
        entry = ledger.get(call_id) if isinstance(ledger, dict) else None
        if entry is None:
            continue  # a state without a ledger (schema < 1.15): nothing to keep in step
        before = tool_invocation_identity_and_scope(original)
        after = tool_invocation_identity_and_scope({**original, "arguments": edits[call_id]})
        if before is None or after is None or entry.get("fingerprint") != before[3]:
            raise RunFailure(
                "The saved state's record of this call cannot be brought in line with the "
                "edited arguments (the SDK's format changed?); nothing was executed."
            )
        entry["fingerprint"] = after[3]


async def _edit_session_calls(run: AgentRun, edits: dict[str, str]) -> None:
    """Give the conversation's session the calls as they run: the SDK stored the model's at
    the pause. Each edited call's item is rewritten in place, all in one transaction
    (`session.rewrite_items`; through the cipher when the session is encrypted), so the
    history never lacks an item however the process ends. Before the run goes on, by the
    one resume that claimed the state; should it fail, the run still runs the edited call
    (logged)."""
    conversation = run.conversation
    session = open_session(
        conversation.session_id,
        owner=conversation.owner_id,
        agent_name=run.agent_name,
        conversation_pk=conversation.pk,
        branch=run_branch(run),
    )

    turn_started = False  # items come newest first: older turns' calls stay as they ran

    def edited(item: Any) -> Any:
        nonlocal turn_started
        turn_started = turn_started or is_user_message(item)
        if (
            not turn_started
            and isinstance(item, dict)
            and item.get("type") == "function_call"
            and item.get("call_id") in edits
            and item.get("arguments") != edits[str(item["call_id"])]
        ):
            return {**item, "arguments": edits[str(item["call_id"])]}
        return None

    try:
        if not await rewrite_items(session, edited, STOP_LOOKBACK_ITEMS):
            logger.warning("Run %s: its session does not hold the edited call(s).", run.pk)
    except Exception:
        logger.exception("Run %s: the session was not given the edited call(s)", run.pk)


def rejection_text(request: ApprovalRequest, decision: ApprovalDecision) -> str:
    """What the model reads as the tool's output when a call is rejected (or answered as
    the tool: exactly the reviewer's text)."""
    if decision.is_response or request.status in (
        ApprovalStatus.EXPIRED,
        ApprovalStatus.WITHDRAWN,
    ):
        return decision.message
    if decision.by_policy:
        said = (
            f"This tool call was rejected by the policy “{decision.policy_name}”; it did not run."
        )
        return f"{said} {decision.message}" if decision.message else said
    if decision.message:
        return f"A reviewer rejected this tool call: {decision.message}"
    return str(settings.AGENTSITE_REJECTION_MESSAGE)


# --- deciding -------------------------------------------------------------------------------


def decide(
    request: ApprovalRequest | int,
    reviewer: User | AnonymousUser | None,
    approve: bool,
    *,
    message: str | None = None,
    always: bool = False,
    seen_hash: str | None = None,
    note: str | None = None,
    response: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> ApprovalDecision:
    """Record a reviewer's decision; resume the run when its pause is fully decided.

    Exactly one decision per request wins, whoever clicks how often. `message` is for the
    agent (read as the tool's output when rejected, so it may reach the customer); `note` is
    for reviewers only: kept in the audit, never given to the model, the session, the trace
    or the chat.

    With `response` (and `approve` False), the reviewer answers as the tool: the tool never
    runs, and the model reads exactly `response` as the call's output (kept as the
    decision's message, its kind "responded"). Like an approval, nobody answers for a call
    in her own conversation: what the tool "said" steers the agent.

    With `arguments` (and `approve`), the reviewer edits, then approves: the tool runs once
    with these instead of the model's, if its author allows edits (`registry.review`) and
    they fit its JSON schema. The decision keeps both hashes, the new arguments and the
    site's signature over the edit (kind "edited"); arguments equal to the model's are a
    plain approval.

    Raises:
        AlreadyDecided / RequestExpired / RequestClosed: with a message for the reviewer.
        NeedsAnotherReviewer: an approval (or an answer) in the reviewer's own conversation.
        DecisionRefused: the reviewer may not decide, the arguments changed since they
            were shown (`seen_hash`), `response` is empty or too long, or the edited
            `arguments` are not allowed or do not fit the tool.
    """
    if not permissions.is_reviewer(reviewer):
        raise NotAllowed("You are not allowed to approve or reject tool calls.")
    kind = DecisionKind.APPROVED if approve else DecisionKind.REJECTED
    if response is not None:
        if approve:
            raise ValueError("A call answered as the tool is not approved: it never runs.")
        response = response.strip()
        if not response:
            raise InvalidDecision(
                "Write the result the agent should read as the tool's output; it is empty."
            )
        if len(response) > MAX_RESPONSE_CHARS:
            raise InvalidDecision(
                f"The tool's output is too long ({len(response)} characters; at most "
                f"{MAX_RESPONSE_CHARS})."
            )
        kind, message = DecisionKind.RESPONDED, response
    if arguments is not None and (not approve or always or response is not None):
        raise ValueError("Edited arguments go with a plain approval.")
    return _record_decision(
        request,
        reviewer,
        approve,
        message=message,
        always=always,
        seen_hash=seen_hash,
        note=note,
        kind=kind,
        edited=arguments,
    )


SELF_APPROVAL_REFUSED = (
    "You started this conversation, so another reviewer must approve this call "
    "(separation of duties). You may still reject it."
)
SELF_RESPONSE_REFUSED = (
    "You started this conversation, so another reviewer must answer as the tool for this "
    "call (separation of duties). You may still reject it."
)


def needs_another_reviewer(request: ApprovalRequest, reviewer: Any) -> bool:
    """Whether `reviewer` may not approve `request` herself: it is a call in a conversation
    she started (or of a run she asked for) and `AGENTSITE_SELF_APPROVAL` is off."""
    if settings.AGENTSITE_SELF_APPROVAL or reviewer is None or reviewer.pk is None:
        return False
    run = request.run
    return reviewer.pk in (run.conversation.owner_id, run.requested_by_id)


adecide = sync_to_async(decide)

# What the model reads when the person who asked withdrew the call ("not approved" too, the
# words the demo model and most models take for a refusal).
WITHDRAWN_MESSAGE = "The user withdrew this request: it was not approved and did not run."


def withdraw(request: ApprovalRequest | int, user: User | AnonymousUser | None) -> ApprovalDecision:
    """The person who asked takes back a request that waits for a reviewer: it is closed as
    withdrawn (audited as a decision by that person), it leaves every open inbox, and the
    run resumes with the call rejected, so the agent answers and the conversation is free.

    The same conditional UPDATE as `decide`: a withdraw and a reviewer's click race for the
    request, and exactly one of them wins.

    Raises:
        AlreadyDecided / RequestClosed: with a message for the user ("Already approved by
            rita at ...").
        DecisionRefused: the user is not the one the conversation belongs to.
    """
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    owner = (
        ApprovalRequest.objects.filter(pk=request_id)
        .values_list("run__conversation__owner_id", flat=True)
        .first()
    )
    if user is None or not user.is_authenticated or owner is None or owner != user.pk:
        raise DecisionRefused("Only the person who asked can withdraw this request.")
    return _record_decision(
        request_id,
        cast("User", user),  # authenticated
        False,
        message=WITHDRAWN_MESSAGE,
        always=False,
        seen_hash=None,
        withdrawn=True,
    )


awithdraw = sync_to_async(withdraw)


def _record_decision(
    request: ApprovalRequest | int,
    reviewer: User | None,
    approve: bool,
    *,
    message: str | None,
    always: bool,
    seen_hash: str | None,
    expired: bool = False,
    withdrawn: bool = False,
    note: str | None = None,
    kind: DecisionKind | None = None,
    edited: dict[str, Any] | None = None,
) -> ApprovalDecision:
    request_id = request.pk if isinstance(request, ApprovalRequest) else int(request)
    responded = kind == DecisionKind.RESPONDED
    # An answer as the tool is read whole (`decide` bounds it); a message is cut to size.
    message = (message or "").strip()[: MAX_RESPONSE_CHARS if responded else MAX_MESSAGE_CHARS]
    note = (note or "").strip()[:MAX_MESSAGE_CHARS]
    with transaction.atomic():
        current = ApprovalRequest.objects.select_related("run").get(pk=request_id)
        # Deciders of one run queue here, so the last decision of a pause always sees the
        # others and exactly one of them claims the run. FOR NO KEY UPDATE, as strong as the
        # decision's own UPDATE of the run: FOR UPDATE would also hold off every check of a
        # foreign key to the run (the exporter's write of the run's trace checks one at its
        # commit, holding the trace's row this transaction writes next: a deadlock on
        # PostgreSQL, a 500 for a loser or a trace write lost).
        run = (
            AgentRun.objects.select_for_update(of=("self",), no_key=True)
            .select_related("conversation")
            .get(pk=current.run_id)
        )
        current.run = run
        if responded and current.kind == ToolKind.HOSTED_MCP:
            raise InvalidDecision(
                "A hosted MCP server runs its tools itself: its call cannot be answered as the "
                "tool. Approve or reject it."
            )
        if (approve or responded) and needs_another_reviewer(current, reviewer):
            raise NeedsAnotherReviewer(
                SELF_RESPONSE_REFUSED if responded else SELF_APPROVAL_REFUSED
            )
        if seen_hash is not None and seen_hash != current.arguments_hash:
            raise StaleArguments(
                "The arguments changed since this request was shown to you; reload it."
            )
        if approve and not current.arguments_intact:
            raise DecisionRefused(
                "The arguments of this request were changed outside agentsite, so what you "
                "would approve is not what would run; it cannot be approved. Reject it."
            )
        edit = _edit_fields(current, run, reviewer, edited) if edited is not None else {}
        if edit:
            kind = DecisionKind.EDITED
        now = timezone.now()
        status = (
            (ApprovalStatus.APPROVED if approve else ApprovalStatus.EXPIRED)
            if expired
            else ApprovalStatus.WITHDRAWN
            if withdrawn
            else ApprovalStatus.RESPONDED
            if responded
            else ApprovalStatus.APPROVED
            if approve
            else ApprovalStatus.REJECTED
        )
        # The sweep expires a request once it is overdue; a reviewer decides it while open;
        # the person who asked may withdraw it while it waits.
        requests = ApprovalRequest.objects.filter(pk=request_id)
        decidable = requests.pending() if expired or withdrawn else requests.open(now)
        if decidable.update(status=status, decided_at=now, decided_by=reviewer) != 1:
            _refuse(request_id, now)
        decision = ApprovalDecision.objects.create(
            request_id=request_id,
            reviewer=reviewer,
            approved=approve,
            message=message,
            always=always,
            arguments_hash=seen_hash or current.arguments_hash,
            withdrawn=withdrawn,
            note=note,
            kind=kind or _kind(status),
            **edit,
        )
        claimed = _claim_for_resume(run, current.pause)
        # In this transaction: the trace shows the decision exactly when the audit does.
        recording.record_decision(current, decision, status, run)
        recording.follow_run(run, RunStatus.RESUMING if claimed else run.status)
        signals.approval_decided.send(sender=ApprovalRequest, request=current, decision=decision)
        decided_event = events.ApprovalWithdrawn if withdrawn else events.ApprovalDecided
        decided = decided_event(
            request_id=request_id,
            run_id=run.pk,
            conversation_id=run.conversation_id,
            status=status,
            decided_by=reviewer.get_username() if reviewer is not None else None,
            decided_at=now,
            message=message,
        )
        published: list[events.Event] = [decided]
        if claimed:
            published.append(_run_updated(run.pk, run.conversation_id, RunStatus.RESUMING))
        transaction.on_commit(lambda: events.publish_threadsafe(published))
        if claimed:
            run_id = run.pk
            transaction.on_commit(lambda: executor.submit("resume", run_id))
    return decision


def _kind(status: str) -> DecisionKind:
    """The audit's kind of a decision that set a request to `status`."""
    return DecisionKind(status)


def closed_reason(request: ApprovalRequest, now: Any) -> DecisionRefused | None:
    """Why `request` can no longer be decided, as the error `decide` raises for it (its
    message is for the reviewer); None while it waits. Needs `decided_by` loaded."""
    when = request.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if request.decided_at else ""
    who = request.decider_display() or "someone"
    if request.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        return AlreadyDecided(f"Already {request.status} by {who} at {when}.")
    if request.status == ApprovalStatus.WITHDRAWN:
        return RequestWithdrawn(f"Withdrawn by {who} at {when}.")
    if request.status == ApprovalStatus.RESPONDED:
        return AlreadyDecided(f"Already answered as the tool by {who} at {when}.")
    if (
        request.status == ApprovalStatus.PENDING
        and request.expires_at <= now
        and request.on_expiry == ExpiryAction.ESCALATE
        and request.escalated_at is None
    ):
        return RequestExpired(
            f"Nobody decided this request in time; it is being escalated to "
            f"{request.escalate_to}. Reload it in a minute."
        )
    if (
        request.status == ApprovalStatus.PENDING
        and request.escalated_at is not None
        and request.escalated_at >= now
    ):
        # The decision came while the request was overdue and lost to the sweep that
        # escalated it: it is open again, under its new deadline.
        return _escalated_meanwhile(request)
    if request.status == ApprovalStatus.EXPIRED or request.expires_at <= now:
        expired_at = request.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return RequestExpired(f"This request expired at {expired_at}; it can no longer be decided.")
    if request.status != ApprovalStatus.PENDING:
        return RequestClosed(f"This request was {request.status}; it can no longer be decided.")
    return None


def _escalated_meanwhile(request: ApprovalRequest) -> RequestExpired:
    until = request.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return RequestExpired(
        f"Nobody decided this request in time, so it was escalated to "
        f"{request.escalate_to} just now; it waits again until {until}. Reload it to decide."
    )


def _refuse(request_id: int, now: Any) -> None:
    request = ApprovalRequest.objects.select_related("decided_by").get(pk=request_id)
    reason = closed_reason(request, now)
    if reason is None and request.escalated_at is not None:
        # Open now, yet the decision's update found it overdue: the sweep escalated it
        # meanwhile. Its `escalated_at` may come before `now` (the sweep read the clock
        # first and committed after the update had read the row).
        reason = _escalated_meanwhile(request)
    raise reason or RequestClosed(
        f"This request was {request.status}; it can no longer be decided."
    )


def _claim_for_resume(run: AgentRun, pause: int) -> bool:
    if ApprovalRequest.objects.of_pause(run, pause).pending().exists():
        return False
    claimed = AgentRun.objects.filter(
        pk=run.pk, status=RunStatus.WAITING, pause_count=pause
    ).update(status=RunStatus.RESUMING, updated=timezone.now())
    return claimed == 1


# --- expiry and recovery --------------------------------------------------------------------


def expire_overdue() -> int:
    """Deal with every request nobody decided in time, by its expiry policy (chosen at its
    pause): reject it (the agent is told it expired), escalate it once (its deadline is
    extended by AGENTSITE_ESCALATION_SECONDS and its group told; rejected at the new one), or
    approve it (the tool runs). A rejected or approved request's run resumes once its pause is
    decided. Reminders of requests that expire soon go out first (`send_reminders`). Each is
    one conditional UPDATE in its own transaction: however many processes sweep at once, one
    of them acts on a request, and a reviewer who decides meanwhile either wins or finds it
    closed (or, escalated, open again). Returns how many requests it expired, escalated or
    approved."""
    send_reminders()
    count = 0
    overdue = ApprovalRequest.objects.overdue().values_list(
        "pk", "created", "expires_at", "on_expiry", "escalate_to", "escalated_at", "expiry_note"
    )
    for request_id, created, expires_at, on_expiry, group, escalated_at, note in list(overdue):
        if on_expiry == ExpiryAction.ESCALATE and escalated_at is None:
            count += _escalate(request_id, group)
            continue
        waited = formatting.span_in_words(expires_at - created)
        if on_expiry == ExpiryAction.APPROVE and _approve_on_expiry(request_id, waited):
            count += 1
            continue
        if escalated_at is not None:
            note = f"Escalated to {group}; nobody decided by the extended deadline. {note}"
        try:
            _record_decision(
                request_id,
                None,
                False,
                message=(
                    f"This tool call was not approved: nobody decided within {waited}, "
                    "so the request expired. Tell the user."
                ),
                always=False,
                seen_hash=None,
                expired=True,
                note=note,
            )
        except DecisionRefused:
            continue  # decided a moment ago by a reviewer
        count += 1
    if count:
        logger.info("Expired, escalated or approved %d overdue approval request(s).", count)
    return count


APPROVED_ON_EXPIRY = "Approved: nobody decided within {waited} and the tool allows it."


def _approve_on_expiry(request_id: int, waited: str) -> bool:
    """Approve an overdue request whose expiry policy approves it, audited as the expiry
    (no reviewer, kind "approved on expiry"); False when it was decided meanwhile or cannot
    be approved (its arguments changed outside agentsite: then it is rejected)."""
    try:
        _record_decision(
            request_id,
            None,
            True,
            message="",
            always=False,
            seen_hash=None,
            expired=True,
            note=APPROVED_ON_EXPIRY.format(waited=waited),
            kind=DecisionKind.EXPIRY_APPROVED,
        )
    except DecisionRefused:
        return False
    return True


def _escalate(request_id: int, group: str) -> int:
    """Extend an overdue request's deadline once and tell `group`: 1 when this process did
    it, 0 when another one did or a reviewer decided it first."""
    now = timezone.now()
    until = now + timedelta(seconds=settings.AGENTSITE_ESCALATION_SECONDS)
    with transaction.atomic():
        won = (
            ApprovalRequest.objects.overdue(now)
            .filter(pk=request_id, on_expiry=ExpiryAction.ESCALATE, escalated_at__isnull=True)
            .update(escalated_at=now, expires_at=until)
        )
        if won != 1:
            return 0
        request = ApprovalRequest.objects.select_related("run").get(pk=request_id)
        signals.approval_escalated.send(sender=ApprovalRequest, request=request, group_name=group)
        # Every page that shows it re-renders it in place, with its new deadline: the inbox's
        # row and request panel, the chat's run (`approval.decided` with its status still
        # pending; "created" would add a second row, and a new type needs a handler in every
        # consumer).
        published: list[events.Event] = [
            events.ApprovalDecided(
                request_id=request.pk,
                run_id=request.run_id,
                conversation_id=request.run.conversation_id,
                status=request.status,
                decided_by=None,
                decided_at=None,
            )
        ]
        transaction.on_commit(lambda: events.publish_threadsafe(published))
    logger.info("Approval request %s escalated to %s until %s.", request_id, group, until)
    return 1


def send_reminders() -> int:
    """Send `approval_reminder` once for each open request that expires within
    AGENTSITE_APPROVAL_REMINDER_SECONDS (0: never), marked by a conditional UPDATE in the
    signal's transaction; how many were sent."""
    seconds = settings.AGENTSITE_APPROVAL_REMINDER_SECONDS
    if seconds <= 0:
        return 0
    now = timezone.now()
    due = ApprovalRequest.objects.due_for_reminder(now, timedelta(seconds=seconds))
    sent = 0
    for request_id in list(due.values_list("pk", flat=True)):
        with transaction.atomic():
            marked = (
                ApprovalRequest.objects.open(now)
                .filter(pk=request_id, reminded_at__isnull=True)
                .update(reminded_at=now)
            )
            if marked != 1:
                continue
            request = ApprovalRequest.objects.select_related("run").get(pk=request_id)
            signals.approval_reminder.send(sender=ApprovalRequest, request=request)
        sent += 1
    return sent


expire_overdue_async = db_hop(expire_overdue)


@dataclass
class Recovery:
    failed: int = 0
    resubmitted: int = 0

    def fail(self, run_id: int, conversation_id: int, **still: Any) -> None:
        """Fail a running run a dead process left, if it still is as listed (`still`: the
        conditions of `_fail_sync`), and tell its pages."""
        if _fail_sync(run_id, RESTART_REASON, from_statuses=(RunStatus.RUNNING,), **still):
            self.failed += 1
            events.publish_sync(
                [_run_updated(run_id, conversation_id, RunStatus.FAILED, RESTART_REASON)]
            )

    def resubmit(self, job: Job, run_id: int, taken: int) -> None:
        """Submit `job` again if this process's conditional UPDATE took the run (`taken`
        rows): of the processes that sweep at once, one does."""
        if taken:
            executor.submit(job, run_id)
            self.resubmitted += 1


RESTART_REASON = "Interrupted by a restart: the process running it stopped. Nothing was retried."


def recover_orphans() -> Recovery:
    """Deal at once with the runs of processes that are gone (their row says stopped, or they
    have not beaten for AGENTSITE_PROCESS_TIMEOUT); every heartbeat and sweep does this.

    - running: its process died (or stopped) mid-run, perhaps mid-tool. It fails with
      "interrupted by a restart"; nothing is retried.
    - queued, with the in-process executor: its job was in that process's queue, never
      started. This process takes the run over (a conditional UPDATE of its owner: one
      process does) and submits it again; should the old process be alive after all, the
      claim lets exactly one copy of the job proceed.

    Right after a database outage that kept this process's own beats out, nothing: the
    others were cut off as well, and get two beats to be heard (`heartbeat.may_judge`).
    """
    recovery = Recovery()
    if not heartbeat.may_judge():
        return recovery
    gone = ServerProcess.objects.gone(heartbeat.silent_since()).values("identity")
    statuses = [RunStatus.RUNNING]
    inprocess = settings.AGENTSITE_EXECUTOR == "inprocess"
    if inprocess:
        statuses.append(RunStatus.QUEUED)
    orphans = AgentRun.objects.filter(status__in=statuses, process__in=gone).exclude(process="")
    for run_id, conversation_id, status, owner in list(
        orphans.values_list("pk", "conversation_id", "status", "process")
    ):
        if status == RunStatus.RUNNING:
            # Conditional again: still running, still that process's.
            recovery.fail(run_id, conversation_id, owned_by=owner)
        else:
            taken = AgentRun.objects.filter(pk=run_id, status=status, process=owner).update(
                process=heartbeat.owner(), updated=timezone.now()
            )
            recovery.resubmit("execute", run_id, taken)
    return recovery


def recover_stuck_runs(older_than: timedelta | None = None) -> Recovery:
    """Deal with runs that a dead process left behind; no tool ever runs twice.

    - whatever `recover_orphans` finds: runs of processes known to be gone, at once.
    - running, quiet for `older_than`, and owned by no live process (a run without an owner:
      its process kept no heartbeat): its process died mid-run, perhaps mid-tool. It fails
      with "interrupted by a restart"; nothing is retried. A run whose process beats is left
      alone however quiet it is.
    - queued or resuming, and quiet for `older_than`: its job was lost before it started
      (the in-process executor's queue dies with its process). Nothing of it has executed
      (a resuming run's state is unconsumed), so the job is submitted again, by one of the
      processes that sweep at once (a conditional UPDATE); the claim in `execute`/`resume`
      lets exactly one copy of a job proceed should the lost one turn up after all.

    Rows of processes gone for a day are deleted.
    """
    if older_than is None:
        older_than = timedelta(seconds=settings.AGENTSITE_STUCK_RUN_TIMEOUT)
    recovery = recover_orphans()
    cutoff = timezone.now() - older_than
    alive = ServerProcess.objects.alive(heartbeat.silent_since()).values("identity")
    stuck = AgentRun.objects.stuck(cutoff)
    dead = stuck.filter(status=RunStatus.RUNNING).exclude(process__in=alive)
    for run_id, conversation_id in list(dead.values_list("pk", "conversation_id")):
        # Conditional again: a run that beat since the listing is alive and stays so.
        recovery.fail(run_id, conversation_id, quiet_since=cutoff)
    lost = stuck.exclude(status=RunStatus.RUNNING).filter(state_consumed=False)
    inprocess = settings.AGENTSITE_EXECUTOR == "inprocess"
    for run_id, status in list(lost.values_list("pk", "status")):
        # Taken once: every process sweeps, and the one whose conditional UPDATE (still that
        # status, still quiet) wins submits the job; the run is then fresh until the next
        # timeout. A queued in-process job is in this process's queue now, so the run names
        # it, as `start_run` does: should this process go too, recovery takes it at once.
        changes: dict[str, Any] = {"updated": timezone.now()}
        if inprocess and status == RunStatus.QUEUED:
            changes["process"] = heartbeat.owner()
        still = AgentRun.objects.filter(pk=run_id, status=status, state_consumed=False)
        job: Job = "execute" if status == RunStatus.QUEUED else "resume"
        recovery.resubmit(job, run_id, still.stuck(cutoff).update(**changes))
    heartbeat.prune()
    return recovery
