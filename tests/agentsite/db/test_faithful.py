"""Text PostgreSQL's jsonb cannot hold (`\\u0000`, a lone surrogate) is stored
faithfully on both databases — session items, a paused run's saved state, an approval's
arguments — and reads back as the SDK's SQLiteSession returns it; NaN / Infinity are refused
with a clear error naming the item, never a lost turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import Agent, SQLiteSession, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from conversations.models import SessionItem
from conversations.session import DjangoSession
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_conversation, make_reviewer, make_user

pytestmark = pytest.mark.django_db(transaction=True)

# A NUL, a lone low surrogate, a lone high surrogate, and an emoji (a valid pair) beside them.
ODD = "a\x00b\udc80c\ud83dd 😀"
NUL = "order\x0042"


def items() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"say {ODD}"},
        {"type": "function_call_output", "call_id": "call_1", "output": ODD},
        {"role": "assistant", "content": [{"type": "output_text", "text": ODD, ODD: ODD}]},
    ]


def test_items_with_nul_and_lone_surrogates_read_back_as_sqlite_session_returns_them(
    tmp_path: Any,
) -> None:
    reference = SQLiteSession("ref", str(tmp_path / "ref.sqlite3"))
    ours = DjangoSession("odd")

    async def both() -> tuple[Any, Any, Any, Any]:
        for session in (reference, ours):
            await session.add_items(items())
        got = await reference.get_items(), await ours.get_items()
        popped = await reference.pop_item(), await ours.pop_item()
        return (*got, *popped)

    want, got, want_popped, popped = asyncio.run(both())
    assert got == want == items()
    assert popped == want_popped == items()[-1]
    reference.close()


@function_tool(needs_approval=True)
def odd_lookup(query: str) -> str:
    """Look something up."""
    return f"found {ODD} for {query}"


def test_a_run_whose_tool_output_and_arguments_hold_them_pauses_resumes_and_completes(
    settings: Any, submitted: list
) -> None:
    agent = Agent(
        name="Odd",
        model=ScriptedModel(
            [
                # NUL in the arguments (a lone surrogate there stops the SDK itself: it hashes
                # the arguments as UTF-8 when it dedupes calls).
                [function_call("odd_lookup", {"query": NUL}, call_id="call_odd")],
                [assistant_message("Done.", item_id="msg_done")],
            ]
        ),
        tools=[odd_lookup],
    )
    name = scripted.install(settings, agent)
    alice = make_user()
    conversation = make_conversation(owner=alice, agent_name=name)
    # What a person types reaches the site through a form, which refuses U+0000 (Django's
    # CharField) and cannot carry a lone surrogate (UTF-8): the odd text comes from the model
    # (the call's arguments) and the tool (its output).
    run = runs.start_run(conversation, "look it up", alice)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.error
    request = run.approval_requests.get()
    assert request.arguments == {"query": NUL}
    runs.decide(request.pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run = AgentRun.objects.get(pk=run.pk)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.final_output == "Done."
    stored = asyncio.run(DjangoSession(conversation.session_id).get_items())
    outputs = [item.get("output") for item in stored if item.get("type") == "function_call_output"]
    assert outputs == [f"found {ODD} for {NUL}"]
    assert SessionItem.objects.filter(conversation=conversation).count() == len(stored)


def test_nan_in_an_item_is_refused_naming_the_item_and_nothing_is_lost() -> None:
    session = DjangoSession("nan")
    asyncio.run(session.add_items([{"role": "user", "content": "keep me"}]))
    with pytest.raises(ValueError, match=r"item 2 of 2 .*NaN"):
        asyncio.run(
            session.add_items(
                [{"role": "user", "content": "fine"}, {"role": "user", "content": float("nan")}]
            )
        )
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "keep me"}]
