"""Restoring a paused run (`engine/runs/restoring.py`): a saved state that was edited in the
database, holds arguments the reviewer did not see or an approval nobody gave, belongs to an
agent that changed, or cannot be read fails the run closed and executes nothing; states
signed before the engine moved still verify. (A state runs at most once:
tests/engine/runs/test_restoring_replay.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from demo.models import Order
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import cancellations, make_reviewer, outputs_for, pause_and_approve, pause_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def assert_failed_without_executing(run: AgentRun, reason: str) -> None:
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert reason in run.error
    assert cancellations() == 0
    assert Order.objects.get(number=42).status == "placed"
    assert outputs_for(run, run.approval_requests.get().call_id) == []


def test_a_state_edited_in_the_database_executes_nothing(submitted: list) -> None:
    run = pause_and_approve()
    AgentRun.objects.filter(pk=run.pk).update(state={**run.state, "current_turn": 99})
    assert_failed_without_executing(run, "changed outside agentsite")


def test_changed_arguments_execute_nothing_even_with_a_valid_signature(submitted: list) -> None:
    run = pause_and_approve()
    state = _replace_in(run.state, '{"order_id":42}', '{"order_id":7}')
    AgentRun.objects.filter(pk=run.pk).update(state=state, state_signature=runs.sign_state(state))
    assert_failed_without_executing(run, "not the ones the reviewer saw")


def test_an_approval_injected_into_the_state_executes_nothing(submitted: list) -> None:
    run = pause_run("cancel order 42")
    request = run.approval_requests.get()
    state = run.state
    state["context"]["approvals"] = {
        "cancel_order": {"approved": [request.call_id], "rejected": []}
    }
    AgentRun.objects.filter(pk=run.pk).update(state=state, state_signature=runs.sign_state(state))
    # A reviewer rejects; the injected approval must not win.
    runs.decide(request.pk, make_reviewer(), runs.Decision.reject())
    assert_failed_without_executing(AgentRun.objects.get(pk=run.pk), "tampered with")


def test_a_changed_agent_fails_the_run_clearly(submitted: list, settings: Any) -> None:
    run = pause_and_approve()
    AgentRun.objects.filter(pk=run.pk).update(agent_fingerprint="0" * 64)
    assert_failed_without_executing(run, "The agent changed since this run paused")


def test_an_unsupported_schema_version_fails_the_run_clearly(submitted: list) -> None:
    run = pause_and_approve()
    state = {**run.state, "$schemaVersion": "0.1"}
    AgentRun.objects.filter(pk=run.pk).update(state=state, state_signature=runs.sign_state(state))
    assert_failed_without_executing(run, "schema version 0.1")


def test_a_missing_or_corrupt_state_fails_the_run_clearly(submitted: list) -> None:
    run = pause_and_approve()
    AgentRun.objects.filter(pk=run.pk).update(state=None)
    assert_failed_without_executing(run, "missing")

    other = pause_and_approve()
    corrupt = {"$schemaVersion": other.state["$schemaVersion"], "garbage": True}
    AgentRun.objects.filter(pk=other.pk).update(
        state=corrupt, state_signature=runs.sign_state(corrupt)
    )
    asyncio.run(runs.resume(other.pk))
    other.refresh_from_db()
    assert other.status == RunStatus.FAILED
    assert "could not be read" in other.error


def _replace_in(value: Any, old: str, new: str) -> Any:
    """Replace text inside every string of a JSON value."""
    if isinstance(value, dict):
        return {k: _replace_in(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_in(v, old, new) for v in value]
    if isinstance(value, str):
        return value.replace(old, new)
    return value


def test_it_still_verifies_states_signed_before_the_engine_moved() -> None:
    # Runs that wait for a reviewer were signed by `agentsite/runs.py` with this salt; renaming
    # it would fail every one of them on resume.
    from django.utils.crypto import salted_hmac

    state = {"$schemaVersion": "1.0", "b": [1, 2], "a": "ü"}
    canonical = '{"$schemaVersion":"1.0","a":"ü","b":[1,2]}'
    signed_before = salted_hmac("agentsite.runs.state", canonical, algorithm="sha256").hexdigest()
    assert runs.sign_state(state) == signed_before
