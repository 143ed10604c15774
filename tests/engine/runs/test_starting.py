"""Starting a turn (`engine/runs/starting.py`): a queued run handed to the executor after
commit, and a message refused whole when it is empty or too long. (Who answers next:
tests/engine/runs/test_starting_next_agent.py.)"""

from __future__ import annotations

import asyncio

import pytest

from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, start_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def test_it_queues_a_run_and_hands_it_to_the_executor_after_commit(submitted: list) -> None:
    run = start_run("where is order 7")
    assert run.status == RunStatus.QUEUED
    assert run.trace_id.startswith("trace_")
    assert submitted == [("execute", run.pk)]

    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert "shipped" in run.final_output
    assert run.usage["requests"] >= 2
    assert run.state is None


def test_it_refuses_an_empty_or_huge_message_and_stores_nothing(submitted: list) -> None:
    conversation = make_conversation()
    with pytest.raises(ValueError, match="empty"):
        runs.start_run(conversation, "   ")
    with pytest.raises(ValueError, match="too long"):
        runs.start_run(conversation, "x" * (runs.MAX_INPUT_CHARS + 1))
    assert AgentRun.objects.count() == 0
    assert submitted == []
