"""Starting a turn: a queued `AgentRun` on the conversation's current branch, with the agent that
answers next, within the person's message rate; the executor gets it after commit."""

from __future__ import annotations

import logging
import math
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentsite.db.sql import columns
from conversations.models import Conversation
from conversations.session import current_branch
from engine import events, executor, heartbeat, registry
from engine.models import AgentRun, RunStatus
from engine.runs import errors, rows

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    from engine.permissions import User


logger = logging.getLogger(__name__)
RATE_WINDOW = timedelta(minutes=1)


def start_run(
    conversation: Conversation,
    text: str,
    user: User | AnonymousUser | None = None,
    *,
    branch: str | None = None,
) -> AgentRun:
    """Queue a run of the conversation's agent on `text`; it starts after commit. It runs on
    the branch the conversation is on now: `branch`, as a caller holding the conversation's
    lock read it, else read here (its session writes there, and the chat shows it with that
    branch).

    Raises:
        ValueError: the text is empty or too long (nothing is stored).
    """
    text = (text or "").strip()
    if not text:
        raise ValueError("The message is empty.")
    if len(text) > errors.MAX_INPUT_CHARS:
        raise ValueError(
            f"The message is too long ({len(text)} characters; at most {errors.MAX_INPUT_CHARS})."
        )
    agent_name = turn_agent_name(conversation)
    registry.get_agent(agent_name)  # fail here, not in the background, for an unknown agent
    if user is not None and user.is_authenticated:
        _check_message_rate(user)
    if branch is None:
        branch = current_branch(conversation.pk)
    run = AgentRun(
        conversation=conversation,
        branch=branch,
        agent_name=agent_name,
        input=text,
        # Chosen here, so the run's trace can be linked before its first span arrives.
        trace_id=f"trace_{uuid.uuid4().hex}",
        requested_by=user if user is not None and user.is_authenticated else None,
        # The in-process executor's job lives in this process: should it go before the job
        # starts, recovery takes the run over at once (the claim lets one copy proceed).
        process=heartbeat.owner() if settings.AGENTSITE_EXECUTOR == "inprocess" else "",
    )
    # The ORM's INSERT, without its compilation of 25 columns (`agentsite.db.sql.Columns`).
    columns(AgentRun).insert(run)
    run_id, conversation_id = run.pk, conversation.pk
    # After the caller's transaction commits (the chat view holds the conversation's lock),
    # or now when there is none: the INSERT above committed by itself.
    # Without waiting for delivery: a view's thread need not wait for the server's loop.
    transaction.on_commit(
        lambda: events.publish_threadsafe(
            [rows.run_updated(run_id, conversation_id, RunStatus.QUEUED)]
        )
    )
    transaction.on_commit(lambda: executor.submit("execute", run_id))
    return run


astart_run = sync_to_async(start_run)


def own_agent_name(conversation: Conversation) -> str:
    """The agent the conversation was started with (the site's default for an old one)."""
    return conversation.agent_name or registry.default_agent_name()


def turn_agent_name(conversation: Conversation) -> str:
    """The agent a new turn starts with: the one that answered last (after a handoff, its
    target), as the SDK's customer-service example does with `result.last_agent`; the
    conversation's own agent when none did, or when that one is no longer reachable."""
    started = own_agent_name(conversation)
    current = conversation.answering_agent or started
    if current != started:
        try:
            registry.get_agent(current)
        except registry.UnknownAgent:
            logger.info(
                "Conversation %s: %r is gone, %r answers", conversation.pk, current, started
            )
        else:
            return current
    return started


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
        raise errors.RateLimited(
            f"You are sending messages too fast: at most {limit} a minute. "
            f"Try again in {wait} second{'s' if wait != 1 else ''}.",
            retry_after=wait,
        )
