"""`agentsite.db.sql.Columns`: plain SQL that reads and writes rows exactly as the ORM does (on
SQLite and PostgreSQL: the suite runs on both)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentsite.db.sql import columns
from approvals.models import ApprovalRequest
from engine.models import AgentRun, RunStatus
from engine.runs import rows
from tests.factories import make_request, make_run, make_user

pytestmark = pytest.mark.django_db


def values(instance: models.Model) -> dict[str, Any]:
    return {
        field.attname: getattr(instance, field.attname) for field in instance._meta.concrete_fields
    }


def test_a_run_loads_in_plain_sql_as_the_orm_loads_it_with_its_conversation_and_requester() -> None:
    run = make_run(
        usage={"requests": 2, "input_tokens": 10},
        error_detail={"kind": "x", "nested": [1, None, "é"]},
        state={"$schemaVersion": "1.9", "items": [{"type": "message"}]},
        state_consumed=True,
        finished=timezone.now() - timedelta(minutes=3),
        streamed_text="half of it",
    )
    orm = AgentRun.objects.select_related("conversation", "requested_by").get(pk=run.pk)

    loaded = rows.load_run(run.pk)

    assert values(loaded) == values(orm)
    assert type(loaded.usage) is dict and loaded.finished.tzinfo is not None
    assert loaded.state_consumed is True
    assert not loaded._state.adding and loaded._state.db == "default"
    # Loaded with it: no query to reach either.
    with CaptureQueriesContext(connection) as queries:
        assert values(loaded.conversation) == values(orm.conversation)
        assert values(loaded.requested_by) == values(orm.requested_by)
    assert len(queries) == 0


def test_a_run_nobody_asked_for_loads_without_a_requester() -> None:
    run = make_run(requested_by=None)
    loaded = rows.load_run(run.pk)
    assert loaded.requested_by is None
    assert loaded.conversation.pk == run.conversation_id


def test_a_run_that_is_gone_is_does_not_exist() -> None:
    with pytest.raises(AgentRun.DoesNotExist):
        rows.load_run(10**9)


def test_an_insert_in_plain_sql_stores_what_the_orms_create_stores() -> None:
    user = make_user()
    orm = make_run(requested_by=user, status=RunStatus.QUEUED, pause_count=0)
    plain = AgentRun(
        conversation=orm.conversation,
        branch=orm.branch,
        agent_name=orm.agent_name,
        input=orm.input,
        requested_by=user,
        status=RunStatus.QUEUED,
        trace_id="trace_plain",
    )

    columns(AgentRun).insert(plain)

    assert plain.pk is not None and plain.pk != orm.pk
    assert not plain._state.adding
    stored, expected = (
        values(AgentRun.objects.get(pk=plain.pk)),
        values(AgentRun.objects.get(pk=orm.pk)),
    )
    # Made by the database or the clock: the key, the times; named here: the trace.
    for name in ("id", "created", "updated", "trace_id"):
        stored.pop(name), expected.pop(name)
    assert stored == expected
    assert AgentRun.objects.get(pk=plain.pk).created == plain.created


def test_an_update_in_plain_sql_writes_each_field_as_the_orms_update_does() -> None:
    run = make_run(status=RunStatus.RUNNING, state={"a": 1}, state_signature="s" * 64)
    twin = make_run(status=RunStatus.RUNNING, state={"a": 1}, state_signature="s" * 64)
    now = timezone.now()
    changes = {
        "status": RunStatus.COMPLETED,
        "final_output": "Done. ✓",
        "usage": {"requests": 1, "total_tokens": 7},
        "trace_id": "trace_x",
        "state": None,  # SQL NULL, as the ORM's update writes it
        "state_signature": "",
        "state_consumed": True,
        "pause_count": 3,
        "finished": now,
        "updated": now,
    }
    running = {"status": RunStatus.RUNNING}

    assert columns(AgentRun).update(run.pk, changes, where=running) == 1
    assert columns(AgentRun).update(run.pk, changes, where=running) == 0  # no longer running
    AgentRun.objects.filter(pk=twin.pk, **running).update(**changes)

    plain, orm = values(AgentRun.objects.get(pk=run.pk)), values(AgentRun.objects.get(pk=twin.pk))
    for name in ("id", "conversation_id", "requested_by_id", "created"):
        plain.pop(name), orm.pop(name)
    assert plain == orm
    assert AgentRun.objects.filter(pk=run.pk, state__isnull=True).exists()


def test_the_locked_read_of_a_run_says_its_status_and_pause() -> None:
    run = make_run(status=RunStatus.WAITING, pause_count=4)
    with transaction.atomic():
        assert rows.lock_run(run.pk) == (RunStatus.WAITING, 4)


def test_a_get_in_plain_sql_is_the_orms_get() -> None:
    request = make_request(arguments={"order": 42, "note": "é\u2028"}, verdict={"action": "ask"})
    loaded = columns(ApprovalRequest).get(request.pk)
    assert values(loaded) == values(ApprovalRequest.objects.get(pk=request.pk))
    with pytest.raises(ApprovalRequest.DoesNotExist):
        columns(ApprovalRequest).get(10**9)


def test_exists_in_plain_sql_is_the_orms_exists() -> None:
    request = make_request()
    waiting = {"run": request.run_id, "pause": request.pause, "status": request.status}
    assert columns(ApprovalRequest).exists(waiting) is True
    assert ApprovalRequest.objects.filter(**waiting).exists()
    assert columns(ApprovalRequest).exists({**waiting, "pause": request.pause + 1}) is False


def test_an_update_takes_related_instances_and_the_lookups_it_names() -> None:
    request = make_request()
    reviewer = make_user()
    now = timezone.now()
    changes = {"status": "approved", "decided_at": now, "decided_by": reviewer}
    open_then = {"status": "pending", "expires_at__gt": request.expires_at}
    assert columns(ApprovalRequest).update(request.pk, changes, where=open_then) == 0
    open_now = {"status": "pending", "expires_at__gt": now}
    assert columns(ApprovalRequest).update(request.pk, changes, where=open_now) == 1
    stored = ApprovalRequest.objects.get(pk=request.pk)
    assert (stored.status, stored.decided_by_id, stored.decided_at) == (
        "approved",
        reviewer.pk,
        now,
    )
    overdue = {"expires_at__lte": now}
    assert columns(ApprovalRequest).update(request.pk, {"status": "expired"}, where=overdue) == 0


def test_a_filter_in_plain_sql_is_the_orms_filter_and_an_empty_in_reads_nothing() -> None:
    first, second = make_request(pause=2), make_request(pause=1)
    keys = [second.pk, first.pk]
    found = columns(ApprovalRequest).filter({"pk__in": keys}, order_by=("pause", "id"))
    orm = ApprovalRequest.objects.filter(pk__in=keys).order_by("pause", "id")
    assert [values(each) for each in found] == [values(each) for each in orm]
    assert [each.pk for each in found] == [second.pk, first.pk]
    with CaptureQueriesContext(connection) as queries:
        assert columns(ApprovalRequest).filter({"pk__in": []}) == []
        assert columns(ApprovalRequest).exists({"pk__in": []}) is False
    assert len(queries) == 0
