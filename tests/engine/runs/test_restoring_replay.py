"""A saved state runs at most once: not after its run ended unfinished, not from a copy written
back after it was consumed, not in another run or pause than its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import Client

from demo.models import Order
from engine import runs
from engine.models import AgentRun, ConsumedState, RunStatus
from engine.runs import rows
from tests.factories import cancellations, make_reviewer, outputs_for, pause_and_approve, pause_run
from tests.migrations import latest, migrate

CONSUMED = "/admin/engine/consumedstate/"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]


def test_a_failed_run_keeps_no_state_to_resume(submitted: list) -> None:
    run = pause_and_approve()
    # Every path that ends a run unfinished goes through `_fail_sync` (a crash, recovery, a
    # reused call id, a state that cannot be restored).
    assert rows.fail_sync(run.pk, "Interrupted by a restart.")
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.state is None
    assert run.state_signature == ""

    # Set back to resuming in the database, the flag unconsumed: nothing may run.
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RESUMING, state_consumed=False)
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    # The state is gone, and the failure took its pause's state for good.
    assert "ended with its run" in run.error
    assert "nothing was executed" in run.error
    assert cancellations() == 0
    assert Order.objects.get(number=42).status == Order.Status.PLACED
    assert outputs_for(run, run.approval_requests.get().call_id) == []


def saved_copy(run: AgentRun) -> dict[str, Any]:
    """What someone with a backup or database access keeps of a paused run."""
    return {"state": run.state, "state_signature": run.state_signature}


def write_back(run: AgentRun, copy: dict[str, Any]) -> None:
    """The copy restored, and the run set to resume it: consumed flag and status as before."""
    AgentRun.objects.filter(pk=run.pk).update(
        **copy, state_consumed=False, status=RunStatus.RESUMING, finished=None
    )


def resume_once_then_replay(run: AgentRun, copy: dict[str, Any]) -> AgentRun:
    runs.decide(run.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    call_id = run.approval_requests.get().call_id
    assert len(outputs_for(run, call_id)) == 1
    assert cancellations() == 1

    write_back(run, copy)
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    return run


def assert_replay_refused(run: AgentRun) -> None:
    assert run.status == RunStatus.FAILED
    assert "already resumed once" in run.error
    assert "nothing was executed" in run.error
    assert len(outputs_for(run, run.approval_requests.get().call_id)) == 1
    assert cancellations() == 1
    assert Order.objects.get(number=42).status == Order.Status.CANCELLED


def test_a_consumed_state_written_back_is_not_resumed_again(
    paused_run: AgentRun, submitted: list
) -> None:
    run = paused_run
    binding = run.state[runs.STATE_BINDING]
    assert binding["run"] == run.pk
    assert binding["pause"] == run.pause_count == 1
    assert len(binding["nonce"]) == 32

    run = resume_once_then_replay(run, saved_copy(run))

    assert_replay_refused(run)
    assert ConsumedState.objects.filter(run=run).count() == 1


def test_a_state_saved_before_pauses_were_bound_resumes_once_only(
    paused_run: AgentRun, submitted: list
) -> None:
    run = paused_run
    # As a run paused before states were bound saved it: no binding inside the signed state.
    legacy = {k: v for k, v in run.state.items() if k != runs.STATE_BINDING}
    AgentRun.objects.filter(pk=run.pk).update(state=legacy, state_signature=runs.sign_state(legacy))
    copy = {"state": legacy, "state_signature": runs.sign_state(legacy)}

    run = resume_once_then_replay(run, copy)

    assert_replay_refused(run)
    consumed = ConsumedState.objects.get(run=run)
    assert (consumed.pause, consumed.nonce) == (1, "")


def test_a_state_bound_to_another_run_or_pause_executes_nothing(submitted: list) -> None:
    first = pause_run("cancel order 42")
    second = pause_run("cancel order 42")
    # The first run's state, validly signed, in the second run's row.
    AgentRun.objects.filter(pk=second.pk).update(**saved_copy(first))
    runs.decide(second.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(second.pk))
    second.refresh_from_db()
    assert second.status == RunStatus.FAILED
    assert "belongs to another run or pause" in second.error
    assert cancellations() == 0

    # Its own state, presented as the state of a later pause.
    AgentRun.objects.filter(pk=first.pk).update(pause_count=2)
    first.approval_requests.update(pause=2)
    runs.decide(first.approval_requests.get().pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(first.pk))
    first.refresh_from_db()
    assert first.status == RunStatus.FAILED
    assert "belongs to another run or pause" in first.error
    assert cancellations() == 0


def test_a_copy_of_a_failed_runs_state_written_back_executes_nothing(submitted: list) -> None:
    run = pause_and_approve()
    copy = saved_copy(run)
    assert rows.fail_sync(run.pk, "Interrupted by a restart.")

    write_back(run, copy)
    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "already resumed once or ended" in run.error
    assert cancellations() == 0
    assert outputs_for(run, run.approval_requests.get().call_id) == []


def test_staff_see_consumed_states_read_only(admin_client: Client, submitted: list) -> None:
    run = pause_and_approve()
    asyncio.run(runs.resume(run.pk))
    consumed = ConsumedState.objects.get(run=run)

    page = admin_client.get(CONSUMED).content.decode()
    assert f"{CONSUMED}{consumed.pk}/change/" in page
    assert consumed.nonce in page
    assert f"{CONSUMED}add/" not in page
    detail = admin_client.get(f"{CONSUMED}{consumed.pk}/change/").content.decode()
    assert 'name="_save"' not in detail
    assert 'name="nonce"' not in detail
    assert admin_client.post(f"{CONSUMED}{consumed.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ConsumedState.objects.filter(pk=consumed.pk).exists()


def test_pauses_consumed_before_the_migration_get_their_rows() -> None:
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("approvals", "0003_history_indexes")], [("approvals", "0004_consumedstate")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        _check_the_consumed_states_migration(connection, executor, before, after)
    finally:
        latest()


def _check_the_consumed_states_migration(
    connection: Any, executor: Any, before: list[tuple[str, str]], after: list[tuple[str, str]]
) -> None:
    from django.db.migrations.executor import MigrationExecutor

    old = executor.loader.project_state(before).apps
    # The conversation as the database has it now: migrations of other apps that depend on a
    # later one of this app (conversations' branches) were undone with it, the others not.
    applied = MigrationExecutor(connection).loader.applied_migrations
    now = executor.loader.project_state(sorted(applied)).apps
    conversation = now.get_model("conversations", "Conversation").objects.create(
        session_id="conv_before_consumed_states", agent_name="support"
    )
    Run = old.get_model("approvals", "AgentRun")

    def run(status: str, pause_count: int, consumed: bool) -> int:
        made = Run.objects.create(
            conversation_id=conversation.pk,
            agent_name="support",
            input="cancel order 42",
            status=status,
            pause_count=pause_count,
            state_consumed=consumed,
        )
        return int(made.pk)

    completed = run(RunStatus.COMPLETED, 2, True)
    waiting = run(RunStatus.WAITING, 2, False)
    resuming = run(RunStatus.RESUMING, 1, False)
    failed_waiting = run(RunStatus.FAILED, 1, False)
    never_paused = run(RunStatus.COMPLETED, 0, False)

    migrate(after)

    rows = set(ConsumedState.objects.values_list("run_id", "pause"))
    latest()  # for the tests that come after this one
    assert rows == {(completed, 1), (completed, 2), (waiting, 1), (failed_waiting, 1)}
    assert not any(run_id in (resuming, never_paused) for run_id, _ in rows)
