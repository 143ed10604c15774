"""The rules on runs (`engine/models.py`): which runs are busy, active, finished or stuck, each
written once; each test here fails if its rule changes. The rules on requests and traces are
held beside their models' tests (tests/approvals/test_models.py, tests/tracing/test_models.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation

pytestmark = pytest.mark.django_db


def _run(status: str = RunStatus.WAITING, **kwargs: Any) -> AgentRun:
    kwargs.setdefault("conversation", make_conversation())
    return AgentRun.objects.create(agent_name="support", input="hi", status=status, **kwargs)


def _quiet(run: AgentRun, since: Any) -> AgentRun:
    AgentRun.objects.filter(pk=run.pk).update(updated=since)
    return run


# --- runs -------------------------------------------------------------------------------------


def test_it_counts_a_run_that_works_or_waits_as_busy_and_no_other() -> None:
    busy = {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.WAITING}
    made = {status: _run(status) for status in RunStatus.values}
    assert {run.status for run in AgentRun.objects.busy()} == busy
    assert {status for status, run in made.items() if run.is_busy} == busy
    active = busy - {RunStatus.WAITING}
    assert {status for status, run in made.items() if run.is_active} == active
    finished = set(RunStatus.values) - busy
    assert {status for status, run in made.items() if run.is_finished} == finished


def test_a_stuck_run_is_an_active_one_quiet_since_the_cutoff() -> None:
    cutoff = timezone.now() - timedelta(minutes=5)
    before = cutoff - timedelta(seconds=1)
    stuck = {
        status: _quiet(_run(status), before)
        for status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING)
    }
    _quiet(_run(RunStatus.WAITING), before)  # waits for a person, however long
    _quiet(_run(RunStatus.COMPLETED), before)
    _quiet(_run(RunStatus.RUNNING), cutoff)  # moved at the cutoff: alive
    _run(RunStatus.RUNNING)
    assert set(AgentRun.objects.stuck(cutoff)) == set(stuck.values())


# --- approval requests ----------------------------------------------------------------------


# --- the status of a trace --------------------------------------------------------------------
