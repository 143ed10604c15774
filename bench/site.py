"""Helpers that drive agentsite's run engine the way its tests do."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agents import Agent, RunConfig, Runner
from agents.memory import SessionABC
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from conversations.models import Conversation
from engine import executor, serverloop


@contextmanager
def jobs_recorded() -> Iterator[list[tuple[str, int]]]:
    """Jobs handed to the executor are recorded instead of run, so the benchmark runs them
    itself and the executor's scheduling does not blur the measurement."""
    submitted: list[tuple[str, int]] = []
    original = executor.submit
    executor.submit = lambda job, run_id: submitted.append((job, run_id))
    try:
        yield submitted
    finally:
        executor.submit = original


@contextmanager
def served_here() -> Iterator[None]:
    """Inside a coroutine: its running loop acts as the server's, as `asgi.py` binds it, so
    events published from worker threads (`start_run`, `decide` in a view's thread) are
    handed to it without waiting. Jobs are still recorded, and no sweeper starts."""
    with serverloop.bound(asyncio.get_running_loop()):
        yield


def conversation(agent_name: str) -> Conversation:
    return Conversation.objects.create(agent_name=agent_name)


def reviewer() -> Any:
    """A user allowed to decide approval requests and to read traces."""
    user = get_user_model().objects.create_user(username=f"rita-{uuid.uuid4().hex[:8]}")
    user.user_permissions.add(
        Permission.objects.get(
            codename="decide_approvalrequest", content_type__app_label="approvals"
        ),
        Permission.objects.get(codename="view_trace", content_type__app_label="tracing"),
    )
    return get_user_model().objects.get(pk=user.pk)  # without a stale permission cache


def sdk_session_id() -> str:
    return f"sdk-{uuid.uuid4().hex}"


async def sdk_turn(agent: Agent[Any], question: str, session: SessionABC, *, streamed: bool) -> Any:
    """One turn of the bare SDK, untraced: `Runner.run`, or with `streamed`
    `Runner.run_streamed` with its events read to the end (what agentsite's engine runs)."""
    config = RunConfig(tracing_disabled=True)
    if not streamed:
        return await Runner.run(agent, question, session=session, run_config=config)
    result = Runner.run_streamed(agent, question, session=session, run_config=config)
    async for _event in result.stream_events():
        pass
    return result
