"""`manage.py expire_approvals` and `manage.py recover_runs`."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from conversations.session import DjangoSession
from demo.models import Order
from engine import executor, runs
from engine.models import AgentRun, RunStatus
from engine.runs import driving, rows
from tests.factories import cancellations, make_reviewer, start_run

# Tools run in worker threads with their own database connections: they must see committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def age(run: AgentRun, status: str, seconds: float) -> None:
    """Make the run look as if it has had `status` without progress for `seconds`."""
    AgentRun.objects.filter(pk=run.pk).update(
        status=status, updated=timezone.now() - timedelta(seconds=seconds)
    )


# --- expire_approvals -----------------------------------------------------------------------


def test_it_expires_an_overdue_request_and_the_agent_tells_the_user(
    paused_run: AgentRun, submitted: list
) -> None:
    run = paused_run
    request = run.approval_requests.get()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    assert command("expire_approvals") == "Expired 1 approval request(s).\n"

    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    decision = ApprovalDecision.objects.get(request=request)
    assert decision.reviewer is None
    assert decision.approved is False
    assert "expired" in decision.message
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert submitted[-1] == ("resume", run.pk)

    asyncio.run(runs.resume(run.pk))

    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert "not approved" in run.final_output
    assert "expired" in run.final_output
    assert cancellations() == 0
    assert Order.objects.get(number=42).status == Order.Status.PLACED
    items = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    outputs = [
        item
        for item in items
        if item.get("type") == "function_call_output" and item.get("call_id") == request.call_id
    ]
    assert len(outputs) == 1
    assert "expired" in str(outputs[0]["output"])
    assert items[-1]["role"] == "assistant"
    assert "expired" in str(items[-1]["content"])


def test_it_waits_for_the_runs_it_resumes_in_process(settings: Any) -> None:
    """In-process resumes run on a daemon thread: the command must not exit under them."""
    settings.AGENTSITE_EXECUTOR = "inprocess"
    run = start_run("cancel order 42")
    assert executor.inprocess().wait_idle(timeout=20)
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING, run.error
    ApprovalRequest.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert command("expire_approvals") == "Expired 1 approval request(s).\n"

    # Already finished when the command returns, with no waiting on our side.
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert "expired" in run.final_output
    assert cancellations() == 0


def test_it_expires_nothing_that_is_not_overdue(paused_run: AgentRun, submitted: list) -> None:
    run = paused_run

    assert command("expire_approvals") == "Expired 0 approval request(s).\n"

    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert run.approval_requests.get().status == ApprovalStatus.PENDING
    assert ApprovalDecision.objects.count() == 0
    assert [job for job, _ in submitted] == ["execute"]


def test_it_refuses_a_decision_on_an_expired_request(paused_run: AgentRun, submitted: list) -> None:
    run = paused_run
    request = run.approval_requests.get()
    reviewer = make_reviewer()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    # Overdue but not yet swept: already too late.
    with pytest.raises(runs.RequestExpired, match="expired at"):
        runs.decide(request, reviewer, runs.Decision.approve())
    command("expire_approvals")
    # Swept: still too late, and the expiry stays the only decision.
    with pytest.raises(runs.RequestExpired, match="expired at"):
        runs.decide(request, reviewer, runs.Decision.approve())

    assert ApprovalDecision.objects.filter(request=request).count() == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED


# --- recover_runs ---------------------------------------------------------------------------


def test_it_fails_a_stuck_run_and_executes_nothing(paused_run: AgentRun, submitted: list) -> None:
    run = paused_run
    request = run.approval_requests.get()
    age(run, RunStatus.RUNNING, seconds=3600)

    assert (
        command("recover_runs") == "Marked 1 stuck run(s) as failed; resubmitted 0 lost job(s).\n"
    )

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "interrupted by a restart" in run.error.lower()
    assert run.finished is not None
    request.refresh_from_db()
    assert request.status == ApprovalStatus.CANCELLED
    assert cancellations() == 0
    assert [job for job, _ in submitted] == ["execute"]


def test_it_resubmits_a_lost_resume_and_the_tool_runs_once(
    approved_run: AgentRun, submitted: list
) -> None:
    run = approved_run
    # The process that was to resume it died: the job is lost, the run says "resuming".
    age(run, RunStatus.RESUMING, seconds=3600)

    assert command("recover_runs") == (
        "Marked 0 stuck run(s) as failed; resubmitted 1 lost job(s).\n"
    )
    assert submitted[-1] == ("resume", run.pk)

    # The resubmitted job, and a late copy of the lost one: one of them resumes.
    async def both() -> None:
        await asyncio.gather(runs.resume(run.pk), runs.resume(run.pk))

    asyncio.run(both())
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    assert cancellations() == 1


def test_it_resubmits_a_run_that_never_started(submitted: list) -> None:
    run = start_run("where is order 7")
    age(run, RunStatus.QUEUED, seconds=3600)

    assert command("recover_runs") == (
        "Marked 0 stuck run(s) as failed; resubmitted 1 lost job(s).\n"
    )
    assert submitted[-1] == ("execute", run.pk)


def test_a_run_that_is_alive_is_never_failed(submitted: list) -> None:
    """Recovery lists quiet runs, then fails each only if it is still quiet."""
    run = start_run("where is order 7")
    age(run, RunStatus.RUNNING, seconds=3600)
    listed_cutoff = timezone.now() - timedelta(seconds=60)
    driving._heartbeat(run.pk)  # the run shows a sign of life after the listing

    assert not rows.fail_sync(
        run.pk, "stuck", from_statuses=(RunStatus.RUNNING,), quiet_since=listed_cutoff
    )
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


def test_it_leaves_waiting_and_fresh_runs_alone(paused_run: AgentRun, submitted: list) -> None:
    waiting = paused_run
    age(waiting, RunStatus.WAITING, seconds=3600)
    fresh = start_run("where is order 7")
    AgentRun.objects.filter(pk=fresh.pk).update(status=RunStatus.RUNNING)  # `updated` stays now

    assert (
        command("recover_runs") == "Marked 0 stuck run(s) as failed; resubmitted 0 lost job(s).\n"
    )

    waiting.refresh_from_db()
    fresh.refresh_from_db()
    assert waiting.status == RunStatus.WAITING
    assert waiting.approval_requests.get().status == ApprovalStatus.PENDING
    assert fresh.status == RunStatus.RUNNING
    assert fresh.error == ""


def test_it_takes_the_timeout_from_settings_or_the_option(submitted: list, settings: Any) -> None:
    run = start_run("where is order 7")
    age(run, RunStatus.RUNNING, seconds=120)
    settings.AGENTSITE_STUCK_RUN_TIMEOUT = 300

    assert (
        command("recover_runs") == "Marked 0 stuck run(s) as failed; resubmitted 0 lost job(s).\n"
    )
    assert (
        command("recover_runs", "--older-than", "60")
        == "Marked 1 stuck run(s) as failed; resubmitted 0 lost job(s).\n"
    )

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    with pytest.raises(CommandError, match="zero or more"):
        command("recover_runs", "--older-than", "-1")


# --- seed_demo ------------------------------------------------------------------------------
