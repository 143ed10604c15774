"""The run's rows moved from approvals to the engine, and a run's branch became a column of
the run (engine 0001-0002, conversations 0005, tracing 0007, approvals 0017): a run that
waited for a reviewer on an edited version across the upgrade resumes after it, once, on that
version; the permissions people had on runs follow them; the tables are the same tables."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from conversations.session import DjangoSession
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import cancellations, make_conversation, make_reviewer, make_user
from tests.migrations import latest, migrate

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]

# The schema as it was before the engine owned its rows.
BEFORE = [
    ("approvals", "0016_filter_choices_index"),
    ("conversations", "0004_branches"),
    ("tracing", "0006_backfill_usage"),
    ("engine", None),
]


@pytest.fixture
def migrator() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    yield executor
    # Back to the latest schema, for the tests after this one.
    latest()
    ContentType.objects.clear_cache()


def tables() -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.table_names(cursor))


def test_a_run_waiting_on_an_edited_version_across_the_upgrade_resumes_once_on_it(
    migrator: MigrationExecutor, submitted: list
) -> None:
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice)
    first = runs.start_run(conversation, "where is order 7", alice)
    asyncio.run(runs.execute(first.pk))
    asyncio.run(DjangoSession(conversation.session_id).create_branch_from_turn(1, "edit-1"))
    paused = runs.start_run(conversation, "cancel order 42", alice)
    asyncio.run(runs.execute(paused.pk))
    assert AgentRun.objects.get(pk=paused.pk).status == RunStatus.WAITING

    old = migrate(BEFORE)

    # As the tree before the move kept it: the run approvals', its branch a row beside it.
    assert "conversations_runbranch" in tables() and "approvals_agentrun" in tables()
    links = old.get_model("conversations", "RunBranch").objects
    assert list(links.values_list("run_id", "branch")) == [(paused.pk, "edit-1")]
    OldRun = old.get_model("approvals", "AgentRun")
    assert OldRun.objects.get(pk=paused.pk).status == RunStatus.WAITING
    assert OldRun.objects.get(pk=first.pk).pause_count == 0

    latest()

    assert "conversations_runbranch" not in tables()
    run = AgentRun.objects.get(pk=paused.pk)
    assert (run.branch, run.status) == ("edit-1", RunStatus.WAITING)
    assert AgentRun.objects.get(pk=first.pk).branch == "main"
    request = run.approval_requests.get()
    runs.decide(request.pk, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    asyncio.run(runs.resume(run.pk))  # a second job for it finds nothing to do

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert cancellations() == 1

    def outputs(branch: str) -> list[Any]:
        items = asyncio.run(DjangoSession(conversation.session_id).get_items(branch_id=branch))
        return [
            item["output"]
            for item in items
            if item.get("type") == "function_call_output" and item["call_id"] == request.call_id
        ]

    assert len(outputs("edit-1")) == 1 and "cancelled" in str(outputs("edit-1")[0]).lower()
    assert outputs("main") == []


def test_the_permissions_given_on_runs_follow_them_into_the_engine(
    migrator: MigrationExecutor,
) -> None:
    operator = make_user(username="olga")
    operator.user_permissions.add(Permission.objects.get(codename="view_agentrun"))

    migrate(BEFORE)
    types = ContentType.objects.filter(model="agentrun")
    assert set(types.values_list("app_label", flat=True)) == {"approvals"}

    latest()

    assert set(
        Permission.objects.filter(codename="view_agentrun").values_list(
            "content_type__app_label", flat=True
        )
    ) == {"engine"}
    operator = type(operator).objects.get(pk=operator.pk)  # permissions are cached per object
    assert operator.has_perm("engine.view_agentrun")
    assert not operator.has_perm("approvals.view_agentrun")
