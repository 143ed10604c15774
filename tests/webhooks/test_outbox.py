"""Signed webhooks announced (`webhooks/outbox.py`): a delivery row per subscribed endpoint,
written in the engine's own transaction (a rolled-back decision announces nothing, a failure to
queue one never fails what it announces), with the event's data (`webhooks/payloads.py`); the
whole path from a pause to a receiver on 127.0.0.1 first."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import (
    make_request,
    make_reviewer,
    make_run,
    make_user,
    pause_run,
    start_run,
)
from tests.services import eventually
from tests.webhooks import Receiver, make_endpoint, statuses, verified
from webhooks import delivery, outbox
from webhooks.models import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    new_secret,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


@pytest.mark.usefixtures("submitted", "quick_retries")
def test_it_announces_a_pause_signed_retries_a_500_and_records_it_failed_without_delaying_the_run(
    receiver: Receiver, timer: asyncio.AbstractEventLoop
) -> None:
    endpoint = make_endpoint(receiver.url, [WebhookEvent.APPROVAL_CREATED])
    receiver.codes = [500]
    receiver.gate.clear()  # the endpoint holds its first answer until the run was checked

    began = time.monotonic()
    run = pause_run("cancel order 42")  # asserts the run waits with its request
    paused_in = time.monotonic() - began

    # The POST came while the run was already paused, committed, and it is still unanswered.
    assert receiver.arrived.wait(5)
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.WAITING
    assert statuses() == [DeliveryStatus.DELIVERING]
    assert paused_in < 5  # never waited on the endpoint, which still holds its answer
    receiver.gate.set()

    eventually(lambda: statuses() == [DeliveryStatus.FAILED])
    row = WebhookDelivery.objects.get()
    assert row.attempts == 3
    assert row.last_response_code == 500
    assert row.last_error.startswith("HTTP 500")
    assert row.delivered_at is None
    assert list(row.attempt_log.values_list("number", "response_code")) == [
        (1, 500),
        (2, 500),
        (3, 500),
    ]
    # The same event, signed each time (a fresh timestamp per attempt), the same id.
    assert len(receiver.requests) == 3
    request = run.approval_requests.get()
    for headers, body, _ in receiver.requests:
        # Standard Webhooks, checked by its own library as published.
        assert verified(endpoint.secret, body, headers)
        assert headers["webhook-id"] == headers["Agentsite-Delivery"] == row.event_id
        assert headers["Agentsite-Event"] == "approval.created"
        assert headers["Content-Type"] == "application/json"
        assert "Agentsite-Signature" not in headers  # only for older secrets
    assert not verified(new_secret(), receiver.requests[0][1], headers)
    gaps = [b[2] - a[2] for a, b in zip(receiver.requests, receiver.requests[1:], strict=False)]
    assert all(gap >= 0.03 for gap in gaps), gaps  # backed off (0.05 s ±20 % in this test)

    event = receiver.bodies()[0]
    assert event["id"] == row.event_id
    assert event["type"] == "approval.created"
    assert event["data"]["request"] == {
        "id": request.pk,
        "run_id": run.pk,
        "agent": request.agent_name,
        "tool": "cancel_order",
        "kind": "function",
        "server": "",
        "arguments": request.arguments,
        "asked_by": "alice",
        "status": "pending",
        "created": request.created.isoformat(),
        "expires_at": request.expires_at.isoformat(),
        "url": f"/inbox/{request.pk}/",
    }


@pytest.mark.usefixtures("submitted")
def test_a_rolled_back_decision_announces_nothing_and_a_committed_one_is_announced(
    receiver: Receiver,
) -> None:
    make_endpoint(receiver.url, [WebhookEvent.APPROVAL_DECIDED])
    request = make_request()
    rita = make_reviewer()

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        runs.decide(request, rita, runs.Decision.approve())
        assert WebhookDelivery.objects.count() == 1  # written with the decision...
        raise Undo
    assert WebhookDelivery.objects.count() == 0  # ...and gone with it

    runs.decide(request, rita, runs.Decision.reject("Not this one.", note="reviewers only: odd"))
    delivery.deliver_all_due()
    (event,) = receiver.bodies()
    assert event["type"] == "approval.decided"
    assert event["data"]["decision"] == {
        "kind": "rejected",
        "approved": False,
        "decided_by": "rita",
        "message": "Not this one.",
        "decided_at": event["data"]["decision"]["decided_at"],
    }
    assert event["data"]["request"]["id"] == request.pk
    assert event["data"]["request"]["status"] == "rejected"
    assert "reviewers only" not in json.dumps(event)  # the note never leaves the site


@pytest.mark.usefixtures("submitted")
def test_a_webhook_that_cannot_be_queued_never_fails_the_decision(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    make_endpoint(receiver.url, [WebhookEvent.APPROVAL_DECIDED])
    request = make_request()

    def broken(*args: Any) -> dict[str, Any]:
        raise ValueError("a bug in a payload")

    monkeypatch.setattr("webhooks.payloads.decision_data", broken)
    runs.decide(request, make_reviewer(), runs.Decision.approve())
    request.refresh_from_db()
    assert request.status == "approved"  # decided, and the run claimed for resume
    assert AgentRun.objects.get(pk=request.run_id).status == RunStatus.RESUMING
    assert not WebhookDelivery.objects.exists()
    assert "[non-fatal] Webhooks: could not queue approval.decided" in caplog.text


@pytest.mark.usefixtures("submitted")
def test_an_endpoint_deleted_as_its_delivery_is_written_never_fails_the_decision(
    receiver: Receiver,
) -> None:
    endpoint = make_endpoint(receiver.url, [WebhookEvent.APPROVAL_DECIDED])
    request = make_request()
    with transaction.atomic():
        runs.decide(request, make_reviewer(), runs.Decision.approve())
        # As another process's delete would land: no cascade, no signal.
        WebhookEndpoint.objects.filter(pk=endpoint.pk)._raw_delete("default")
    request.refresh_from_db()
    assert request.status == "approved"  # committed
    assert WebhookDelivery.objects.count() == 1  # an orphan...
    assert delivery.deliver_all_due() == 0  # ...never sent
    assert receiver.requests == []


def test_an_endpoint_added_by_another_process_is_heard_of_within_seconds(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox.forget_subscribed()
    assert outbox.queue(WebhookEvent.RUN_FAILED, dict) == []  # none: remembered
    # Another process's insert: no signal here.
    WebhookEndpoint.objects.bulk_create(
        [WebhookEndpoint(name="new", url=receiver.url, events=[WebhookEvent.RUN_FAILED])]
    )
    assert outbox.queue(WebhookEvent.RUN_FAILED, dict) == []
    monkeypatch.setattr(outbox, "SUBSCRIBED_SECONDS", 0.0)  # as once the seconds went by
    assert len(outbox.queue(WebhookEvent.RUN_FAILED, dict)) == 1


@pytest.mark.usefixtures("submitted")
def test_an_expired_request_is_announced_as_decided_by_nobody(receiver: Receiver) -> None:
    make_endpoint(receiver.url, [WebhookEvent.APPROVAL_DECIDED])
    make_request(expires_at=timezone.now() - timedelta(seconds=1))
    assert runs.expire_overdue() == 1
    delivery.deliver_all_due()
    (event,) = receiver.bodies()
    assert event["data"]["decision"]["kind"] == "expired"
    assert event["data"]["decision"]["decided_by"] is None


@pytest.mark.usefixtures("submitted")
def test_a_completed_run_is_announced_with_its_answer(receiver: Receiver) -> None:
    make_endpoint(receiver.url, [WebhookEvent.RUN_COMPLETED, WebhookEvent.RUN_FAILED])
    run = start_run("hello")
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    delivery.deliver_all_due()
    (event,) = receiver.bodies()
    assert event["type"] == "run.completed"
    data = event["data"]["run"]
    assert data["id"] == run.pk
    assert data["status"] == "completed"
    assert data["final_output"] == run.final_output != ""
    assert data["error"] == ""
    assert data["conversation"] == run.conversation.session_id
    assert data["asked_by"] == run.requested_by.username


@pytest.mark.usefixtures("submitted")
def test_runs_that_end_without_an_answer_are_announced_as_failed(receiver: Receiver) -> None:
    make_endpoint(receiver.url, [WebhookEvent.RUN_FAILED])
    alice = make_user(username="alice")
    stopped = make_run(owner=alice, status=RunStatus.QUEUED, pause_count=0)
    assert runs.stop(stopped, alice)
    crashed = make_run(status=RunStatus.RUNNING, pause_count=0)
    assert runs.interrupt([crashed.pk]) == 1
    delivery.deliver_all_due()
    by_run = {event["data"]["run"]["id"]: event for event in receiver.bodies()}
    assert set(by_run) == {stopped.pk, crashed.pk}
    assert by_run[stopped.pk]["type"] == "run.failed"
    assert by_run[stopped.pk]["data"]["run"]["status"] == "cancelled"
    assert by_run[stopped.pk]["data"]["run"]["error"] == "Stopped by alice."
    assert by_run[crashed.pk]["data"]["run"]["status"] == "failed"
    assert by_run[crashed.pk]["data"]["run"]["error"] == runs.SHUTDOWN_REASON
    assert "final_output" not in by_run[crashed.pk]["data"]["run"]


@pytest.mark.usefixtures("submitted")
def test_a_disabled_endpoint_gets_nothing(receiver: Receiver) -> None:
    make_endpoint(receiver.url, enabled=False)
    later_off = make_endpoint(receiver.url, [WebhookEvent.APPROVAL_CREATED])
    pause_run("cancel order 42")
    assert WebhookDelivery.objects.get().endpoint == later_off  # none queued for the first
    later_off.enabled = False
    later_off.save()
    assert delivery.deliver_all_due() == 0  # what was queued waits while it is off
    assert receiver.requests == []
    assert statuses() == [DeliveryStatus.PENDING]
