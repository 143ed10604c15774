"""Agents on `ScriptedModel` for run-engine tests, registered like any deployment's agents."""

from __future__ import annotations

from typing import Any

from agents import Agent, function_tool

from engine import registry

AGENT: Agent[Any] | None = None
EXECUTED: list[tuple[str, Any]] = []


def start(settings: Any, agent: Agent[Any], text: str, owner: Any = None) -> Any:
    """A run of `agent` (installed as the only agent) on `text`, queued in a new conversation
    of `owner`'s (alice's unless told), who asks. Needs the `submitted` fixture, or the
    executor runs it too."""
    from engine import runs
    from tests.factories import make_conversation, make_user

    install(settings, agent)
    owner = owner or make_user(username="alice")
    conversation = make_conversation(owner=owner, agent_name="scripted")
    return runs.start_run(conversation, text, owner)


def executed(run: Any, job: str = "execute") -> Any:
    """`run`'s job run to its end on an event loop of its own (as a worker's job may be),
    then the run as stored."""
    import asyncio

    from engine import runs

    asyncio.run(runs.execute(run.pk) if job == "execute" else runs.resume(run.pk))
    run.refresh_from_db()
    return run


def install(settings: Any, agent: Agent[Any], name: str = "scripted") -> str:
    """Register `agent` as the only agent, under `name`, through the real registry."""
    global AGENT
    AGENT = agent
    settings.AGENTSITE_AGENTS = {name: "tests.scripted.AGENT"}
    registry.reset()
    return name


@function_tool(needs_approval=True)
def delete_account(account: str) -> str:
    """Delete a customer account."""
    EXECUTED.append(("delete_account", account))
    return f"deleted {account}"


@function_tool(needs_approval=True)
def wire_money(account: str, amount: int) -> str:
    """Send money."""
    EXECUTED.append(("wire_money", (account, amount)))
    return f"sent {amount} to {account}"


@function_tool
def get_recovered() -> str:
    """Stands for `recover_runs` failing this run while it still runs (a wrong guess)."""
    from engine.models import AgentRun, RunStatus

    AgentRun.objects.filter(status=RunStatus.RUNNING).update(
        status=RunStatus.FAILED, error="Interrupted by a restart (wrongly)."
    )
    EXECUTED.append(("get_recovered", None))
    return "ok"
