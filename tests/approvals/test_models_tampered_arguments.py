"""What a reviewer sees is what runs: arguments edited in the database (their hash kept) are
neither shown nor approvable, and never execute."""

from __future__ import annotations

import asyncio

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import ARGUMENTS_TAMPERED, ApprovalRequest, arguments_hash
from demo.models import OrderEvent
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_reviewer, pause_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "submitted"),
]


def tampered() -> ApprovalRequest:
    run = pause_run("cancel order 42")
    request = run.approval_requests.get()
    ApprovalRequest.objects.filter(pk=request.pk).update(arguments={"order_id": 7})
    return ApprovalRequest.objects.get(pk=request.pk)


def test_edited_arguments_are_not_shown_to_the_reviewer() -> None:
    request = tampered()
    rita = make_reviewer()
    client = Client()
    client.force_login(rita)
    for url in (reverse("inbox"), reverse("inbox_request", args=[request.pk])):
        page = client.get(url).content.decode()
        assert "order_id=7" not in page and '"order_id": 7' not in page
        assert ARGUMENTS_TAMPERED in page


def test_edited_arguments_cannot_be_approved_and_nothing_runs() -> None:
    request = tampered()
    rita = make_reviewer()
    with pytest.raises(runs.DecisionRefused, match="changed outside agentsite"):
        runs.decide(request, rita, runs.Decision.approve())
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending
    runs.decide(request, rita, runs.Decision.reject("looks wrong"))  # rejecting is safe
    assert not OrderEvent.objects.filter(kind="cancelled").exists()


def test_arguments_edited_after_the_approval_fail_the_resume(approved_run: AgentRun) -> None:
    run = approved_run
    request = run.approval_requests.get()
    ApprovalRequest.objects.filter(pk=request.pk).update(arguments={"order_id": 7})
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "not the ones the reviewer saw" in run.error
    assert not OrderEvent.objects.filter(kind="cancelled").exists()


def test_blank_arguments_hash_as_the_empty_object_they_are_stored_as() -> None:
    assert arguments_hash("") == arguments_hash("  ") == arguments_hash({}) == arguments_hash("{}")
