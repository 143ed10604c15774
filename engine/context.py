"""The run context: on whose behalf a run acts, passed to every run the SDK's way.

Every run gets a `RunContext` (`Runner.run_streamed(..., context=...)`); tools read it through
`ToolContext.context` (needs_approval callables through `RunContextWrapper.context`). It holds
ids only: across a pause the saved `RunState` carries exactly what `serialize` writes
(`to_json(context_serializer=serialize, strict_context=True)`), and `deserialize` rebuilds it in
any process. The user is loaded from the database on first use (`requesting_user` /
`requesting_user_sync`) and kept on the context object, never in the state; an inactive or
deleted user is refused, so nothing acts for someone who may no longer act.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agents import RunContextWrapper
from django.contrib.auth import get_user_model

from agentsite.db.hops import db_hop

if TYPE_CHECKING:
    from engine.models import AgentRun
    from engine.permissions import User

# The keys `serialize` writes, in the saved state under `context.context`.
FIELDS = ("user_id", "conversation_id", "session_id", "run_id")


class RequesterUnavailable(Exception):
    """Nobody may be acted for: no user asked, or the one who asked was deleted or deactivated.
    The message says which, for the person who reads it."""


@dataclass(frozen=True)
class RunContext:
    """Who asked, in which conversation, for which run. Frozen: a tool cannot switch whom it
    acts for."""

    user_id: int | None
    conversation_id: int
    session_id: str
    run_id: int
    # The user, once loaded: process-local, left out of `serialize`, equality and repr.
    _user: Any = field(default=None, init=False, repr=False, compare=False)
    # Calls of tools that need no approval of their own that an approval policy sent to the
    # pause (call id -> its verdict, `engine.policies.Gate`): process-local, like `_user`.
    gated: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Each agent's span in this process's part of the run (agent name -> span id,
    # `engine.runs.spans`): where a decision on its calls goes in the trace.
    agent_spans: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def for_run(cls, run: AgentRun) -> RunContext:
        """The context of `run`: its requester (`AgentRun.requested_by`) is whom it acts for."""
        return cls(
            user_id=run.requested_by_id,
            conversation_id=run.conversation_id,
            session_id=run.conversation.session_id,
            run_id=run.pk,
        )


def serialize(context: Any) -> dict[str, Any]:
    """What a saved `RunState` keeps of the context: the ids, nothing else."""
    if not isinstance(context, RunContext):
        raise TypeError(f"A run's context must be a RunContext, not {type(context).__name__}.")
    return {name: getattr(context, name) for name in FIELDS}


def deserialize(data: Mapping[str, Any]) -> RunContext:
    """The context a saved `RunState` holds, rebuilt (its user not loaded yet)."""
    user_id, conversation_id, session_id, run_id = (data.get(name) for name in FIELDS)
    if (
        set(data) != set(FIELDS)
        or not (user_id is None or _is_id(user_id))
        or not _is_id(conversation_id)
        or not isinstance(session_id, str)
        or not _is_id(run_id)
    ):
        raise ValueError(f"Not a run context: {dict(data)!r}")
    return RunContext(
        user_id=user_id,
        conversation_id=int(conversation_id),  # type: ignore[arg-type]  # checked above
        session_id=session_id,
        run_id=int(run_id),  # type: ignore[arg-type]
    )


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def context_of(ctx: RunContextWrapper[Any] | RunContext | Any) -> RunContext:
    """The `RunContext` of a tool's or policy's `ctx` (or the context itself).

    Raises:
        RequesterUnavailable: the run has no RunContext (it was not started by the engine).
    """
    context = ctx.context if isinstance(ctx, RunContextWrapper) else ctx
    if not isinstance(context, RunContext):
        raise RequesterUnavailable(
            "This run does not say who asked, so nothing is done for anyone."
        )
    return context


def requesting_user_sync(ctx: RunContextWrapper[Any] | RunContext | Any) -> User:
    """The active user who asked for this run, loaded on first use (for sync tools, which run
    in a worker thread).

    Raises:
        RequesterUnavailable: no user asked, or the one who asked was deleted or deactivated.
    """
    context = context_of(ctx)
    if context._user is None:
        if context.user_id is None:
            raise RequesterUnavailable("Nobody signed in asked for this, so nothing is done.")
        user = get_user_model().objects.filter(pk=context.user_id).first()
        if user is None:
            raise RequesterUnavailable(
                "The user who asked was deleted, so nothing is done for them."
            )
        object.__setattr__(context, "_user", user)
    user = context._user
    if not user.is_active:
        raise RequesterUnavailable(
            f"The user who asked ({user.get_username()}) was deactivated, so nothing is done "
            "for them."
        )
    return user


async def requesting_user(ctx: RunContextWrapper[Any] | RunContext | Any) -> User:
    """`requesting_user_sync` for async code (needs_approval callables, async tools): one hop
    to a database thread the first time, none after."""
    context = context_of(ctx)
    if context._user is not None:
        return requesting_user_sync(context)
    return await db_hop(requesting_user_sync)(context)


def requesting_user_or_none(ctx: RunContextWrapper[Any] | RunContext | Any) -> User | None:
    """The active user who asked, or None when there is none to act for."""
    try:
        return requesting_user_sync(ctx)
    except RequesterUnavailable:
        return None
