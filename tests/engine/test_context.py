"""Every run acts for the person who asked: the run context, across a pause, in any process."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, Runner, RunState, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext

from approvals.models import ApprovalRequest
from conversations.session import DjangoSession
from engine import registry, runs
from engine.context import (
    RequesterUnavailable,
    RunContext,
    deserialize,
    requesting_user,
    requesting_user_sync,
    serialize,
)
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_conversation, make_reviewer, make_user, outputs_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_registry")]

# What the tools below saw: (tool, user pk, username).
seen: list[tuple[str, int, str]] = []


@pytest.fixture(autouse=True)
def nothing_seen() -> None:
    seen.clear()


@function_tool
def whoami(ctx: ToolContext[RunContext]) -> str:
    """Say who asked."""
    user = requesting_user_sync(ctx)
    seen.append(("whoami", user.pk, user.get_username()))
    return f"You are {user.get_username()}."


async def always(ctx: RunContextWrapper[RunContext], params: dict[str, Any], call_id: str) -> bool:
    # A policy reads the user too (async: one hop, then the context's copy).
    user = await requesting_user(ctx)
    seen.append(("policy", user.pk, user.get_username()))
    return True


@function_tool(needs_approval=always)
def close_my_account(ctx: ToolContext[RunContext], reason: str) -> str:
    """Close the account of the person asking."""
    user = requesting_user_sync(ctx)
    seen.append(("close_my_account", user.pk, user.get_username()))
    return f"Closed the account of {user.get_username()}."


def account_agent(name: str = "Accounts") -> Agent[RunContext]:
    return Agent(
        name=name,
        model=ScriptedModel(
            [
                [function_call("whoami", {}, call_id="call_who")],
                [function_call("close_my_account", {"reason": "moving"}, call_id="call_close")],
                [assistant_message("Your account is closed.", item_id="msg_done")],
            ]
        ),
        tools=[whoami, close_my_account],
    )


def paused_run(settings: Any, user: Any, *, owner: Any = "same") -> AgentRun:
    name = scripted.install(settings, account_agent())
    conversation = make_conversation(owner=user if owner == "same" else owner, agent_name=name)
    run = runs.start_run(conversation, "please close my account", user)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.error
    return run


def approve_and_resume_elsewhere(run: AgentRun) -> AgentRun:
    """Approve, then resume in another thread with its own event loop and connection: what
    the run knows there comes from the database alone."""
    runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())
    errors: list[BaseException] = []

    def resume() -> None:
        try:
            asyncio.run(runs.resume(run.pk))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=resume)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive() and errors == []
    return AgentRun.objects.get(pk=run.pk)


def test_it_gives_a_tool_the_user_who_asked(settings: Any, submitted: list) -> None:
    alice = make_user(username="alice", email="alice@example.com")

    run = paused_run(settings, alice)

    assert seen == [("whoami", alice.pk, "alice"), ("policy", alice.pk, "alice")]
    assert run.requested_by == alice


def test_the_saved_state_holds_only_the_context_ids(settings: Any, submitted: list) -> None:
    alice = make_user(username="alice", email="alice@example.com", first_name="Alice")

    run = paused_run(settings, alice)

    context = run.state["context"]
    assert context["context"] == {
        "user_id": alice.pk,
        "conversation_id": run.conversation_id,
        "session_id": run.conversation.session_id,
        "run_id": run.pk,
    }
    assert context["context_meta"]["serialized_via"] == "context_serializer"
    saved = json.dumps(run.state)
    for secret in ("alice@example.com", "Alice", alice.password, "_user"):
        assert secret not in saved


def test_a_resume_in_a_fresh_loop_gives_the_tool_the_same_user(
    settings: Any, submitted: list
) -> None:
    alice = make_user(username="alice")
    run = paused_run(settings, alice)
    seen.clear()

    run = approve_and_resume_elsewhere(run)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Your account is closed."
    assert seen == [("close_my_account", alice.pk, "alice")]
    [output] = outputs_for(run, "call_close")
    assert output["output"] == "Closed the account of alice."


def test_resuming_with_a_context_does_not_interrupt_the_approved_call_again(
    settings: Any, submitted: list
) -> None:
    """openai-agents-python #4244: the engine passes `context=` on resume too; the approved
    call runs, and the run does not pause a second time."""
    run = approve_and_resume_elsewhere(paused_run(settings, make_user(username="alice")))

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.pause_count == 1
    assert ApprovalRequest.objects.filter(run=run).count() == 1
    assert [tool for tool, *_ in seen].count("close_my_account") == 1


async def test_the_sdk_keeps_an_approval_when_resumed_with_a_context() -> None:
    """#4244 at the SDK itself: `Runner.run(agent, state, context=...)` after `from_json`
    with our deserializer executes the approved call instead of asking again."""
    executed: list[int] = []

    @function_tool(needs_approval=True)
    def archive(ctx: ToolContext[RunContext]) -> str:
        """Archive the conversation."""
        executed.append(ctx.context.conversation_id)
        return "archived"

    agent = Agent(
        name="Archivist",
        model=ScriptedModel(
            [
                [function_call("archive", {}, call_id="call_archive")],
                [assistant_message("Archived.", item_id="msg_done")],
            ]
        ),
        tools=[archive],
    )
    context = RunContext(user_id=None, conversation_id=7, session_id="conv_x", run_id=1)
    first = await Runner.run(agent, "archive it", context=context)
    assert [item.tool_name for item in first.interruptions] == ["archive"]
    saved = first.to_state().to_json(context_serializer=serialize, strict_context=True)

    state = await RunState.from_json(
        agent, saved, context_deserializer=deserialize, strict_context=True
    )
    state.approve(state.get_interruptions()[0])
    fresh = RunContext(user_id=None, conversation_id=7, session_id="conv_x", run_id=1)
    result = await Runner.run(agent, state, context=fresh)

    assert result.interruptions == []
    assert executed == [7]
    assert result.final_output == "Archived."


def test_a_user_deactivated_during_the_pause_fails_the_resume_closed(
    settings: Any, submitted: list
) -> None:
    alice = make_user(username="alice")
    run = paused_run(settings, alice)
    seen.clear()
    alice.is_active = False
    alice.save()

    run = approve_and_resume_elsewhere(run)

    assert run.status == RunStatus.FAILED
    assert run.error == (
        "The user who asked (alice) was deactivated while the run waited; nothing was executed."
    )
    assert seen == []
    assert outputs_for(run, "call_close") == []
    assert run.state is None


def test_a_user_deleted_during_the_pause_fails_the_resume_closed(
    settings: Any, submitted: list
) -> None:
    # A conversation nobody owns, so that deleting alice leaves the run (requested_by is
    # SET_NULL) while her id stays in the saved context.
    alice = make_user(username="alice")
    run = paused_run(settings, alice, owner=None)
    seen.clear()
    alice.delete()

    run = approve_and_resume_elsewhere(run)

    assert run.status == RunStatus.FAILED
    assert run.error == (
        "The user who asked was deleted while the run waited; nothing was executed."
    )
    assert seen == []
    assert outputs_for(run, "call_close") == []


def test_a_context_that_names_another_user_fails_the_resume_closed(
    settings: Any, submitted: list
) -> None:
    alice, bob = make_user(username="alice"), make_user(username="bob")
    run = paused_run(settings, alice)
    seen.clear()
    state = json.loads(json.dumps(run.state))
    state["context"]["context"]["user_id"] = bob.pk
    AgentRun.objects.filter(pk=run.pk).update(state=state, state_signature=runs.sign_state(state))

    run = approve_and_resume_elsewhere(run)

    assert run.status == RunStatus.FAILED
    assert "acts for another run or user" in run.error
    assert seen == []


def test_a_state_saved_before_runs_carried_a_context_acts_for_the_runs_requester(
    settings: Any, submitted: list
) -> None:
    alice = make_user(username="alice")
    run = paused_run(settings, alice)
    seen.clear()
    state = json.loads(json.dumps(run.state))
    # What the engine saved before it passed a context: none.
    state["context"]["context"] = None
    state["context"]["context_meta"] = {"original_type": "none", "serialized_via": "none"}
    AgentRun.objects.filter(pk=run.pk).update(state=state, state_signature=runs.sign_state(state))

    run = approve_and_resume_elsewhere(run)

    assert run.status == RunStatus.COMPLETED, run.error
    assert seen == [("close_my_account", alice.pk, "alice")]


def test_an_agent_renamed_since_the_pause_fails_the_resume_closed(
    settings: Any, submitted: list
) -> None:
    """openai-agents-python #4264: the SDK dropped interruptions owned by an agent renamed
    since the pause. Our fingerprint covers the agents' names, so the resume refuses first."""
    front_model = ScriptedModel([[function_call("transfer_to_accounts", {}, call_id="call_h")]])
    front = Agent(name="Front", model=front_model, handoffs=[account_agent()])
    name = scripted.install(settings, front)
    alice = make_user(username="alice")
    run = runs.start_run(make_conversation(owner=alice, agent_name=name), "close it", alice)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    request = run.approval_requests.get()
    assert (run.status, request.agent_name) == (RunStatus.WAITING, "Accounts")
    before = registry.fingerprint(front)
    seen.clear()

    renamed = Agent(name="Front", handoffs=[account_agent("Account team")])
    scripted.install(settings, renamed, name=name)
    assert registry.fingerprint(renamed) != before

    run = approve_and_resume_elsewhere(run)

    assert run.status == RunStatus.FAILED
    assert "The agent changed since this run paused" in run.error
    assert seen == []
    assert outputs_for(run, "call_close") == []


def test_a_tool_outside_a_run_of_the_engine_acts_for_nobody() -> None:
    wrapper = RunContextWrapper(context=None)
    with pytest.raises(RequesterUnavailable, match="does not say who asked"):
        requesting_user_sync(wrapper)
    anonymous = RunContext(user_id=None, conversation_id=1, session_id="c", run_id=1)
    with pytest.raises(RequesterUnavailable, match="Nobody signed in"):
        requesting_user_sync(anonymous)


def test_the_user_is_loaded_once_and_refused_once_inactive() -> None:
    alice = make_user(username="alice")
    context = RunContext(user_id=alice.pk, conversation_id=1, session_id="c", run_id=1)

    assert requesting_user_sync(context) == alice
    first = requesting_user_sync(context)
    assert requesting_user_sync(RunContextWrapper(context=context)) is first
    first.is_active = False
    with pytest.raises(RequesterUnavailable, match=r"\(alice\) was deactivated"):
        requesting_user_sync(context)
    assert serialize(context) == {
        "user_id": alice.pk,
        "conversation_id": 1,
        "session_id": "c",
        "run_id": 1,
    }


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"user_id": "1", "conversation_id": 1, "session_id": "c", "run_id": 1},
        {"user_id": 1, "conversation_id": True, "session_id": "c", "run_id": 1},
        {"user_id": 1, "conversation_id": 1, "session_id": 5, "run_id": 1},
        {"user_id": 1, "conversation_id": 1, "session_id": "c", "run_id": 1, "email": "x"},
    ],
)
def test_it_refuses_a_context_that_is_not_ids(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Not a run context"):
        deserialize(data)


def test_a_user_deactivated_before_the_run_starts_gets_no_turn(
    settings: Any, submitted: list
) -> None:
    """A queued run (its job waiting for a worker) whose user was deactivated meanwhile
    fails before the agent is asked anything: it would act for nobody allowed."""
    alice = make_user(username="alice")
    name = scripted.install(settings, account_agent())
    conversation = make_conversation(owner=alice, agent_name=name)
    run = runs.start_run(conversation, "please close my account", alice)
    alice.is_active = False
    alice.save()

    asyncio.run(runs.execute(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error == (
        "The user who asked (alice) was deactivated before the run started; nothing was executed."
    )
    assert seen == []
    assert asyncio.run(DjangoSession(conversation.session_id).get_items()) == []
