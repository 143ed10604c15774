"""Stop: the user ends a reply that is being written.

The SDK's streamed run is cancelled, what was already said stays in the chat and the session,
the run ends as cancelled (not failed) and its trace says so (status OK: a stop is no
failure; a span names who stopped it). A run that had not started is cancelled at once and
nothing of it executes; a Stop reaches a run streaming in another process through the
database within a second; the conversation takes a new message afterwards.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from conversations.session import DjangoSession
from engine import events, runs
from engine.models import AgentRun, ConsumedState, RunStatus
from engine.runs import stopping
from tests import scripted
from tests.factories import make_conversation, make_reviewer, make_user
from tracing import recording
from tracing.models import Span, Trace, TraceStatus

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry", "fresh_layer"),
]

# The offline model's answer to a greeting: long enough to stop in the middle.
GREETING = "hello"


@pytest.fixture
def slow_words(settings: Any) -> None:
    settings.AGENTSITE_DEMO_STREAM_DELAY = 0.05


def items_of(conversation_id: int) -> list[dict[str, Any]]:
    from conversations.models import Conversation

    session_id = Conversation.objects.get(pk=conversation_id).session_id
    return asyncio.run(DjangoSession(session_id).get_items())


async def words_heard(run: AgentRun, count: int) -> str:
    """Listen to the run's conversation until `count` words have streamed; what they say."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(events.conversation_group(run.conversation_id), channel)
    heard: list[str] = []
    while len(heard) < count:
        message = await asyncio.wait_for(layer.receive(channel), 5)
        if message["type"] == "run.text_delta":
            heard.append(message["event"]["delta"])
    return "".join(heard)


async def stop_mid_stream(run: AgentRun, alice: Any, *, words: int = 4) -> str:
    execution = asyncio.create_task(runs.execute(run.pk))
    heard = await words_heard(run, words)
    assert await sync_to_async(runs.stop)(run.pk, alice) is True
    await asyncio.wait_for(execution, 5)
    return heard


@pytest.mark.usefixtures("slow_words")
async def test_a_stop_mid_stream_keeps_what_was_said_and_cancels_the_run(
    submitted: list, alice: Any, traces: Any
) -> None:
    conversation = await sync_to_async(make_conversation)(owner=alice)
    run = await sync_to_async(runs.start_run)(conversation, GREETING, alice)

    heard = await stop_mid_stream(run, alice)

    await run.arefresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.error == "Stopped by alice."
    assert run.final_output == ""
    assert run.finished is not None
    items = await sync_to_async(items_of)(conversation.pk)
    assert items[0] == {"role": "user", "content": GREETING}
    said = items[-1]
    assert said["role"] == "assistant"
    # What streamed before the stop, and less than the whole reply.
    assert said["content"].startswith(heard)
    assert len(said["content"]) < len("I'm the offline demo model, so I only understand")
    # The trace: OK (a stop is no failure), with who stopped it.
    await sync_to_async(traces.flush)()
    trace = await Trace.objects.aget(trace_id=run.trace_id)
    assert trace.status == TraceStatus.OK
    stop = await Span.objects.aget(trace=trace, name=recording.STOP_SPAN_NAME)
    assert stop.span_data["data"] == {"stopped_by": "alice", "run_status": "cancelled"}

    # The conversation takes a new message, which sees what was said.
    again = await sync_to_async(runs.start_run)(conversation, "where is order 7", alice)
    await runs.execute(again.pk)
    await again.arefresh_from_db()
    assert again.status == RunStatus.COMPLETED, again.error


@pytest.mark.usefixtures("slow_words")
async def test_a_stop_taken_by_another_process_reaches_the_stream_within_a_poll(
    submitted: list, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process only marks the run (it cannot signal this one's stream): the
    streaming process reads the mark on its next poll."""
    monkeypatch.setattr(stopping, "STOP_POLL_SECONDS", 0.05)
    conversation = await sync_to_async(make_conversation)(owner=alice)
    run = await sync_to_async(runs.start_run)(conversation, GREETING, alice)
    execution = asyncio.create_task(runs.execute(run.pk))
    await words_heard(run, 3)

    marked = await AgentRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).aupdate(
        stop_requested=timezone.now()
    )
    assert marked == 1
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(execution, 5)

    assert asyncio.get_running_loop().time() - started < 1.0
    await run.arefresh_from_db()
    assert run.status == RunStatus.CANCELLED
    items = await sync_to_async(items_of)(conversation.pk)
    assert items[-1]["role"] == "assistant" and items[-1]["content"]


@pytest.mark.usefixtures("slow_words")
async def test_the_runs_streaming_on_a_loop_read_their_stop_marks_together(
    submitted: list, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three runs stream at once on this loop: each poll is one read for the three (not one
    each), and a mark set for one of them stops that one alone."""
    monkeypatch.setattr(stopping, "STOP_POLL_SECONDS", 0.05)
    loop = asyncio.get_running_loop()
    reads: list[tuple[float, set[int]]] = []
    real = stopping._stops_requested

    all_three = asyncio.Event()
    ids: set[int] = set()

    def counted(since: dict[int, Any]) -> list[int]:
        reads.append((loop.time(), set(since)))
        if ids and set(since) == ids:
            loop.call_soon_threadsafe(all_three.set)
        return real(since)

    monkeypatch.setattr(stopping, "_stops_requested", counted)
    started = []
    for _ in range(3):
        conversation = await sync_to_async(make_conversation)(owner=alice)
        started.append(await sync_to_async(runs.start_run)(conversation, GREETING, alice))
    executions = [asyncio.create_task(runs.execute(run.pk)) for run in started]
    ids.update(run.pk for run in started)
    await asyncio.gather(*(words_heard(run, 3) for run in started))
    await asyncio.wait_for(all_three.wait(), 5)  # a poll that read the three at once
    await AgentRun.objects.filter(pk=started[0].pk).aupdate(stop_requested=timezone.now())
    await asyncio.wait_for(executions[0], 5)
    await asyncio.wait_for(asyncio.gather(*executions[1:]), 30)

    statuses = [(await AgentRun.objects.aget(pk=run.pk)).status for run in started]
    assert statuses == [RunStatus.CANCELLED, RunStatus.COMPLETED, RunStatus.COMPLETED]
    # One read a poll for all three: never more reads than polls fit in the time they took
    # (three watchers of their own would read about three times that).
    span = reads[-1][0] - reads[0][0]
    assert len(reads) >= 3
    assert len(reads) <= span / stopping.STOP_POLL_SECONDS + 2, (len(reads), span)
    # The watcher ends with the last run, and reads nothing more.
    count = len(reads)
    await asyncio.sleep(5 * stopping.STOP_POLL_SECONDS)
    assert len(reads) == count
    assert not stopping._watched.get(loop)
    assert loop not in stopping._watchers


def test_a_queued_run_stopped_never_starts(submitted: list, alice: Any) -> None:
    conversation = make_conversation(owner=alice)
    run = runs.start_run(conversation, GREETING, alice)

    assert runs.stop(run, alice) is True
    asyncio.run(runs.execute(run.pk))  # its job comes late: nothing happens

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert items_of(conversation.pk) == []


def test_a_decided_run_stopped_before_it_resumes_executes_nothing(
    approved_run: AgentRun, alice: Any
) -> None:
    from demo.models import OrderEvent

    run = approved_run
    request = ApprovalRequest.objects.get(run=run)

    assert runs.stop(run.pk, alice) is True
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.state is None
    assert ConsumedState.objects.filter(run=run, pause=1).exists()
    assert not OrderEvent.objects.filter(tool_call_id=request.call_id).exists()


def test_a_finished_run_or_someone_else_s_is_not_stopped(submitted: list, alice: Any) -> None:
    conversation = make_conversation(owner=alice)
    run = runs.start_run(conversation, "where is order 7", alice)
    with pytest.raises(runs.DecisionRefused, match="Only the person who asked"):
        runs.stop(run, make_user(username="mallory"))
    asyncio.run(runs.execute(run.pk))
    assert runs.stop(run, alice) is False
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED


def test_the_chat_offers_stop_while_a_reply_is_written(submitted: list, alice: Any) -> None:
    conversation = make_conversation(owner=alice)
    client = Client()
    client.force_login(alice)
    client.post(reverse("chat_send", args=[conversation.session_id]), {"text": GREETING})
    run = AgentRun.objects.get(conversation=conversation)
    url = reverse("chat_stop", args=[conversation.session_id, run.pk])
    page = client.get(reverse("chat", args=[conversation.session_id])).content.decode()
    assert f'action="{url}"' in page

    answer = client.post(url, HTTP_HX_REQUEST="true")
    assert "Stopping…" in answer.content.decode()
    page = client.get(reverse("chat", args=[conversation.session_id])).content.decode()
    assert "You stopped this reply; nothing more of it will run." in page
    assert f'action="{url}"' not in page
    assert "Last reply stopped" in client.get(reverse("chats")).content.decode()
    late = client.post(url, follow=True)
    assert "This reply had already ended; nothing was stopped." in late.content.decode()
    other = Client()
    other.force_login(make_user(username="bob"))
    assert other.post(url).status_code == 404


entered, release = threading.Event(), threading.Event()


@function_tool(needs_approval=True)
def close_account(account: str) -> str:
    """Close an account (slowly: the test stops the reply while it runs)."""
    entered.set()
    release.wait(5)
    return f"closed {account}"


async def test_a_call_stopped_while_it_runs_gets_an_output_so_the_next_turn_works(
    submitted: list, settings: Any, alice: Any
) -> None:
    """A resumed run's approved call was saved with the pause; stopped while it runs, it
    would stay without an output, which a model refuses on the next turn."""
    agent: Agent[Any] = Agent(
        name="Closer",
        model=ScriptedModel(
            [
                [function_call("close_account", {"account": "acme"}, call_id="call_close")],
                [assistant_message("Closed.")],
                [assistant_message("Anything else?")],
            ]
        ),
        tools=[close_account],
    )
    name = await sync_to_async(scripted.install)(settings, agent)
    conversation = await sync_to_async(make_conversation)(owner=alice, agent_name=name)
    run = await sync_to_async(runs.start_run)(conversation, "close acme", alice)
    await runs.execute(run.pk)
    request = await ApprovalRequest.objects.aget(run=run)
    reviewer = await sync_to_async(make_reviewer)()
    await sync_to_async(runs.decide)(request.pk, reviewer, runs.Decision.approve())
    entered.clear()
    release.clear()
    resuming = asyncio.create_task(runs.resume(run.pk))
    assert await asyncio.to_thread(entered.wait, 5)

    assert await sync_to_async(runs.stop)(run.pk, alice) is True
    await asyncio.wait_for(resuming, 5)
    release.set()

    await run.arefresh_from_db()
    assert run.status == RunStatus.CANCELLED
    items = await sync_to_async(items_of)(conversation.pk)
    outputs = [i for i in items if i.get("type") == "function_call_output"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [
        ("call_close", runs.STOPPED_CALL_OUTPUT)
    ]
    again = await sync_to_async(runs.start_run)(conversation, "thanks", alice)
    await runs.execute(again.pk)
    await again.arefresh_from_db()
    assert again.status == RunStatus.COMPLETED, again.error


async def test_a_shell_command_stopped_while_it_runs_gets_a_shell_output(
    submitted: list, settings: Any, alice: Any
) -> None:
    """The same for a shell command: the output it gets is a shell call's (a function call's
    output does not answer it, and the next turn would be refused)."""
    from agents import ShellTool

    from tests.engine.test_calls import shell_call, streamed

    started, finish = asyncio.Event(), asyncio.Event()

    async def shell(request: Any) -> str:
        started.set()
        await finish.wait()
        return "done"

    agent: Agent[Any] = Agent(
        name="Ops",
        model=ScriptedModel(
            [
                streamed(shell_call(["make clean"])),
                [assistant_message("Cleaned.")],
                [assistant_message("Anything else?")],
            ]
        ),
        tools=[ShellTool(executor=shell, needs_approval=True)],
    )
    name = await sync_to_async(scripted.install)(settings, agent)
    conversation = await sync_to_async(make_conversation)(owner=alice, agent_name=name)
    run = await sync_to_async(runs.start_run)(conversation, "clean up", alice)
    await runs.execute(run.pk)
    request = await ApprovalRequest.objects.aget(run=run)
    reviewer = await sync_to_async(make_reviewer)()
    await sync_to_async(runs.decide)(request.pk, reviewer, runs.Decision.approve())
    resuming = asyncio.create_task(runs.resume(run.pk))
    await asyncio.wait_for(started.wait(), 5)

    assert await sync_to_async(runs.stop)(run.pk, alice) is True
    await asyncio.wait_for(resuming, 5)
    finish.set()

    await run.arefresh_from_db()
    assert run.status == RunStatus.CANCELLED
    items = await sync_to_async(items_of)(conversation.pk)
    answers = [i for i in items if str(i.get("type")).endswith("_output")]
    assert answers == [
        {
            "type": "shell_call_output",
            "call_id": "call_shell_1",
            "output": [
                {
                    "stdout": "",
                    "stderr": runs.STOPPED_CALL_OUTPUT,
                    "outcome": {"type": "exit", "exit_code": 1},
                }
            ],
        }
    ]
    again = await sync_to_async(runs.start_run)(conversation, "thanks", alice)
    await runs.execute(again.pk)
    await again.arefresh_from_db()
    assert again.status == RunStatus.COMPLETED, again.error
