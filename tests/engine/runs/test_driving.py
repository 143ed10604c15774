"""A run driven through its life (`engine/runs/driving.py`): it pauses, is decided and resumes
exactly once, from the database alone, on any loop; through handoffs, agents used as tools,
several calls of one pause and "always". (Its start: test_starting.py; its restore's checks:
test_restoring.py; its decisions: test_decisions*.py.)"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection

from approvals.models import (
    ApprovalDecision,
    ApprovalOrigin,
    ApprovalRequest,
    ApprovalStatus,
    arguments_hash,
)
from demo.models import Order
from engine import events, registry, runs
from engine.models import AgentRun, RunStatus
from engine.runs import rows
from tests import scripted
from tests.factories import (
    cancellations,
    make_reviewer,
    make_user,
    outputs_for,
    session_items,
    start_run,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def pause(text: str, agent_name: str = "support") -> AgentRun:
    run = start_run(text, agent_name)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.error
    return run


def test_it_pauses_with_a_signed_state_and_one_request(submitted: list) -> None:
    run = pause("cancel order 42")

    request = run.approval_requests.get()
    assert request.tool_name == "cancel_order"
    assert request.arguments == {"order_id": 42}
    assert request.arguments_hash == arguments_hash({"order_id": 42})
    assert request.agent_name == "Support desk"
    assert request.origin == ApprovalOrigin.TOOL
    assert request.status == ApprovalStatus.PENDING
    assert request.pause == run.pause_count == 1
    assert run.state["$schemaVersion"] == run.state_schema_version
    assert run.state_signature == runs.sign_state(run.state)
    assert run.agent_fingerprint == registry.fingerprint(registry.get_agent("support"))
    assert run.sdk_version.startswith("0.24")
    assert cancellations() == 0
    assert Order.objects.get(number=42).status == "placed"


async def test_it_publishes_events_only_about_what_was_committed(submitted: list) -> None:
    layer = get_channel_layer()
    inbox = await layer.new_channel()
    await layer.group_add(events.INBOX_GROUP, inbox)
    run = await sync_to_async(start_run)("cancel order 42")
    watcher = await layer.new_channel()
    await layer.group_add(events.conversation_group(run.conversation_id), watcher)

    await runs.execute(run.pk)

    created = await asyncio.wait_for(layer.receive(inbox), 2)
    assert created["type"] == "approval.created"
    request = await ApprovalRequest.objects.aget(run=run)
    assert created["event"]["request_id"] == request.pk
    assert created["event"]["call"] == "cancel_order(order_id=42)"
    seen = []
    while True:
        message = await asyncio.wait_for(layer.receive(watcher), 2)
        seen.append((message["type"], message["event"].get("status")))
        if message["type"] == "run.updated" and message["event"]["status"] == "waiting":
            break
    assert ("run.updated", "running") in seen
    assert ("approval.created", None) in seen


def test_a_paused_run_resumes_in_a_new_loop_from_the_database_only(submitted: list) -> None:
    run_id = pause("cancel order 42").pk
    rita = make_reviewer()

    # Throw away every in-memory object: the registry's agents, the run, the request.
    registry.reset()
    request_id = ApprovalRequest.objects.get(run_id=run_id).pk
    runs.decide(request_id, rita, runs.Decision.approve())
    assert submitted[-1] == ("resume", run_id)
    assert AgentRun.objects.get(pk=run_id).status == RunStatus.RESUMING

    asyncio.run(runs.resume(run_id))  # a brand-new event loop

    run = AgentRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert Order.objects.get(number=42).status == "cancelled"
    assert cancellations() == 1
    call_id = ApprovalRequest.objects.get(run_id=run_id).call_id
    assert len(outputs_for(run, call_id)) == 1
    replies = [i for i in session_items(run) if i.get("role") == "assistant"]
    assert len(replies) == 1
    assert "cancel" in run.final_output.lower()


def test_fifty_concurrent_approvals_make_one_decision_and_one_execution(submitted: list) -> None:
    run = pause("cancel order 42")
    request = run.approval_requests.get()
    reviewers = [make_reviewer(f"reviewer{i}") for i in range(50)]
    start_line = threading.Barrier(50)
    outcomes: list[str] = []

    def click(reviewer: Any) -> None:
        start_line.wait()
        try:
            runs.decide(request.pk, reviewer, runs.Decision.approve())
            outcomes.append("decided")
        except runs.AlreadyDecided as refusal:
            outcomes.append(str(refusal))
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=(r,)) for r in reviewers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert outcomes.count("decided") == 1
    refusals = [o for o in outcomes if o != "decided"]
    assert len(refusals) == 49
    winner = ApprovalRequest.objects.get(pk=request.pk).decided_by
    assert all(r.startswith(f"Already approved by {winner.username} at ") for r in refusals)
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert submitted.count(("resume", run.pk)) == 1

    asyncio.run(runs.resume(run.pk))
    assert cancellations() == 1


def test_approve_racing_reject_ends_in_one_decision(submitted: list) -> None:
    run = pause("cancel order 42")
    request = run.approval_requests.get()
    reviewers = [(make_reviewer(f"r{i}"), i % 2 == 0) for i in range(20)]
    start_line = threading.Barrier(20)
    wins: list[bool] = []

    def click(reviewer: Any, approve: bool) -> None:
        start_line.wait()
        try:
            decision = runs.Decision.approve() if approve else runs.Decision.reject("no")
            runs.decide(request.pk, reviewer, decision)
            wins.append(approve)
        except runs.AlreadyDecided:
            pass
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=pair) for pair in reviewers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(wins) == 1
    decision = ApprovalDecision.objects.get(request=request)
    assert decision.approved == wins[0]
    request.refresh_from_db()
    assert request.status == (ApprovalStatus.APPROVED if wins[0] else ApprovalStatus.REJECTED)
    asyncio.run(runs.resume(run.pk))
    assert cancellations() == (1 if wins[0] else 0)


def test_resuming_one_snapshot_twice_executes_the_tool_once(submitted: list) -> None:
    run = pause("cancel order 42")
    runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())

    async def both() -> None:
        await asyncio.gather(runs.resume(run.pk), runs.resume(run.pk))
        await runs.resume(run.pk)  # and once more, later

    asyncio.run(both())

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    call_id = run.approval_requests.get().call_id
    # The demo tool is idempotent by call id; the session shows whether the SDK ran it twice.
    assert len(outputs_for(run, call_id)) == 1
    assert cancellations() == 1


def test_a_rejection_message_reaches_the_model_and_the_tool_never_runs(submitted: list) -> None:
    run = pause("cancel order 42")
    runs.decide(
        run.approval_requests.get().pk,
        make_reviewer(),
        runs.Decision.reject("Customer must call us first"),
    )
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert cancellations() == 0
    assert Order.objects.get(number=42).status == "placed"
    call_id = run.approval_requests.get().call_id
    [output] = outputs_for(run, call_id)
    assert "Customer must call us first" in str(output["output"])
    assert "Customer must call us first" in run.final_output


def test_a_rejection_without_message_uses_the_site_default(submitted: list, settings: Any) -> None:
    settings.AGENTSITE_REJECTION_MESSAGE = "Declined by our review team."
    run = pause("cancel order 42")
    runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.reject())
    asyncio.run(runs.resume(run.pk))
    [output] = outputs_for(run, run.approval_requests.get().call_id)
    assert output["output"] == "Declined by our review team."


def test_an_approval_inside_an_agent_used_as_a_tool_pauses_and_resumes(submitted: list) -> None:
    run = pause("research refund policy")
    request = run.approval_requests.get()
    assert request.tool_name == "search_knowledge_base"
    assert request.agent_name == "Researcher"
    assert request.origin == ApprovalOrigin.AGENT_AS_TOOL

    runs.decide(request.pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert "refund" in run.final_output.lower()


def handoff_agent() -> Agent[Any]:
    specialist = Agent(
        name="Specialist",
        model=ScriptedModel(
            [
                [function_call("delete_account", {"account": "acme"}, call_id="call_del")],
                [assistant_message("Deleted acme.", item_id="msg_2")],
            ]
        ),
        tools=[scripted.delete_account],
    )
    return Agent(
        name="Front",
        model=ScriptedModel([[function_call("transfer_to_specialist", {}, call_id="call_h")]]),
        handoffs=[specialist],
    )


def test_an_approval_after_a_handoff_pauses_and_resumes_on_the_starting_agent(
    submitted: list, settings: Any
) -> None:
    name = scripted.install(settings, handoff_agent())
    run = pause("please delete acme", agent_name=name)
    request = run.approval_requests.get()
    assert (request.agent_name, request.tool_name, request.origin) == (
        "Specialist",
        "delete_account",
        ApprovalOrigin.HANDOFF,
    )
    assert scripted.EXECUTED == []

    runs.decide(request.pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Deleted acme."
    assert scripted.EXECUTED == [("delete_account", "acme")]


def two_calls_agent() -> Agent[Any]:
    return Agent(
        name="Ops",
        model=ScriptedModel(
            [
                [
                    function_call("delete_account", {"account": "a"}, call_id="c1"),
                    function_call("wire_money", {"account": "b", "amount": 5}, call_id="c2"),
                ],
                [assistant_message("Done.", item_id="m1")],
            ]
        ),
        tools=[scripted.delete_account, scripted.wire_money],
    )


def test_several_requests_of_one_pause_are_decided_one_at_a_time(
    submitted: list, settings: Any
) -> None:
    name = scripted.install(settings, two_calls_agent())
    run = pause("do both", agent_name=name)
    first, second = run.approval_requests.order_by("call_id")
    rita = make_reviewer()

    runs.decide(first.pk, rita, runs.Decision.approve())
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.WAITING
    assert submitted.count(("resume", run.pk)) == 0

    runs.decide(second.pk, rita, runs.Decision.reject("not today"))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RESUMING
    asyncio.run(runs.resume(run.pk))

    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert scripted.EXECUTED == [("delete_account", "a")]


def test_approve_always_covers_the_rest_of_the_run(submitted: list, settings: Any) -> None:
    agent = Agent(
        name="Ops",
        model=ScriptedModel(
            [
                [function_call("delete_account", {"account": "a"}, call_id="c1")],
                [function_call("delete_account", {"account": "b"}, call_id="c2")],
                [assistant_message("Both gone.", item_id="m1")],
            ]
        ),
        tools=[scripted.delete_account],
    )
    name = scripted.install(settings, agent)
    run = pause("delete a and b", agent_name=name)
    runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.approve(always=True))
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.pause_count == 1  # the second call did not ask again
    assert scripted.EXECUTED == [("delete_account", "a"), ("delete_account", "b")]


def test_a_decision_needs_the_permission(submitted: list) -> None:
    run = pause("cancel order 42")
    with pytest.raises(runs.DecisionRefused, match="not allowed"):
        runs.decide(
            run.approval_requests.get().pk, make_user(username="mallory"), runs.Decision.approve()
        )
    assert ApprovalDecision.objects.count() == 0


def test_a_decision_on_arguments_the_reviewer_did_not_see_is_refused(submitted: list) -> None:
    run = pause("cancel order 42")
    with pytest.raises(runs.DecisionRefused, match="arguments changed"):
        runs.decide(
            run.approval_requests.get().pk,
            make_reviewer(),
            runs.Decision.approve(),
            seen_hash="0" * 64,
        )
    assert run.approval_requests.get().status == ApprovalStatus.PENDING


def test_a_decision_after_the_run_failed_is_refused(submitted: list) -> None:
    run = pause("cancel order 42")
    rows.fail_sync(run.pk, "boom", from_statuses=(RunStatus.WAITING,))
    with pytest.raises(runs.RequestClosed, match="cancelled"):
        runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())


@pytest.mark.parametrize("ends_with", ["a reply", "a pause"])
def test_a_run_failed_meanwhile_is_neither_completed_nor_paused(
    submitted: list, settings: Any, ends_with: str
) -> None:
    last_step = (
        [assistant_message("All done.", item_id="m1")]
        if ends_with == "a reply"
        else [function_call("delete_account", {"account": "x"}, call_id="c2")]
    )
    agent = Agent(
        name="Ops",
        model=ScriptedModel([[function_call("get_recovered", {}, call_id="c1")], last_step]),
        tools=[scripted.get_recovered, scripted.delete_account],
    )
    name = scripted.install(settings, agent)
    run = start_run("go", agent_name=name)
    asyncio.run(runs.execute(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.final_output == ""
    assert run.state is None
    assert ApprovalRequest.objects.filter(run=run).count() == 0
    assert scripted.EXECUTED == [("get_recovered", None)]


async def test_a_decision_is_announced_to_every_inbox_after_commit(submitted: list) -> None:
    run = await sync_to_async(pause)("cancel order 42")
    layer = get_channel_layer()
    inbox = await layer.new_channel()
    await layer.group_add(events.INBOX_GROUP, inbox)
    request = await ApprovalRequest.objects.aget(run=run)
    rita = await sync_to_async(make_reviewer)()

    await runs.adecide(request.pk, rita, runs.Decision.reject("<b>no</b>"))

    message = await asyncio.wait_for(layer.receive(inbox), 2)
    assert message["type"] == "approval.decided"
    assert message["event"]["request_id"] == request.pk
    assert message["event"]["status"] == "rejected"
    assert message["event"]["decided_by"] == "rita"
    assert message["event"]["message"] == "<b>no</b>"  # escaping is the page's job
