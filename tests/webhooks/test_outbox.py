"""Signed webhooks. Deliveries are an outbox written in the engine's own
transactions and sent elsewhere; each test speaks to a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import Client
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
from tests.services import outbox_timer
from webhooks import delivery, outbox, signing
from webhooks.models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

ALL_EVENTS = [choice.value for choice in WebhookEvent]


# --- a receiver, as an operator's system would run one ---------------------------------------


class Receiver:
    """What a local HTTP server was sent, and what it answers: `codes` in turn (the last one
    repeats), each answer held until `gate` is set."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[dict[str, str], bytes, float]] = []
        self.codes = [200]
        self.gate = threading.Event()
        self.gate.set()
        self.arrived = threading.Event()
        self.server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def take(self, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            self.requests.append((headers, body, time.monotonic()))
            code = self.codes[min(len(self.requests), len(self.codes)) - 1]
        self.arrived.set()
        self.gate.wait(10)
        return code

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, body, _ in self.requests]

    def delivery_ids(self) -> list[str]:
        with self.lock:
            return [headers["Agentsite-Delivery"] for headers, _, _ in self.requests]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        code = self.server.receiver.take(dict(self.headers.items()), body)
        self.send_response(code)
        self.send_header("Content-Length", "7")
        self.end_headers()
        self.wfile.write(b"answer.")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def fresh_endpoints() -> Iterator[None]:
    """What a process remembers of the endpoints, forgotten: each test's database is new."""
    outbox.forget_subscribed()
    yield
    outbox.forget_subscribed()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    received = Receiver()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.receiver = received  # type: ignore[attr-defined]
    received.server = server
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received
    received.gate.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def timer() -> Iterator[asyncio.AbstractEventLoop]:
    """A server loop's delivery timer, as the "inprocess" mode's web server runs it."""
    with outbox_timer(delivery) as loop:
        yield loop


@pytest.fixture
def quick_retries(settings: Any) -> None:
    settings.AGENTSITE_WEBHOOK_BACKOFF_SECONDS = [0.05]
    settings.AGENTSITE_WEBHOOK_MAX_ATTEMPTS = 3
    settings.AGENTSITE_WEBHOOK_TIMEOUT = 5.0


def make_endpoint(url: str, events: list[str] | None = None, **kwargs: Any) -> WebhookEndpoint:
    kwargs.setdefault("name", f"receiver {WebhookEndpoint.objects.count() + 1}")
    return WebhookEndpoint.objects.create(url=url, events=events or ALL_EVENTS, **kwargs)


def verified(secret: str, body: bytes, header: str) -> bool:
    """The receiver's check, as docs/webhooks.md writes it (standard library only)."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    signed = parts["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(parts["t"])) <= 300
    return fresh and hmac.compare_digest(expected, parts["v1"])


def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    assert check()


def statuses() -> list[str]:
    return list(WebhookDelivery.objects.order_by("pk").values_list("status", flat=True))


# --- the Done-when line ----------------------------------------------------------------------


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
        assert verified(endpoint.secret, body, headers["Agentsite-Signature"])
        assert headers["Agentsite-Event"] == "approval.created"
        assert headers["Agentsite-Delivery"] == row.event_id
        assert headers["Content-Type"] == "application/json"
    assert not verified("whsec_another", receiver.requests[0][1], headers["Agentsite-Signature"])
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
def test_it_records_a_delivery_the_endpoint_took(receiver: Receiver, settings: Any) -> None:
    settings.AGENTSITE_WEBHOOK_SITE_URL = "https://agents.example.com/"
    make_endpoint(receiver.url, [WebhookEvent.APPROVAL_CREATED])
    run = pause_run("cancel order 42")
    assert receiver.requests == []  # no timer, no worker here: only queued
    assert delivery.deliver_all_due() == 1
    row = WebhookDelivery.objects.get()
    assert (row.status, row.attempts, row.last_response_code) == (DeliveryStatus.DELIVERED, 1, 200)
    assert row.delivered_at is not None and row.last_response_ms is not None
    request = run.approval_requests.get()
    assert receiver.bodies()[0]["data"]["request"]["url"] == (
        f"https://agents.example.com/inbox/{request.pk}/"
    )
    assert delivery.deliver_all_due() == 0  # delivered once


# --- the outbox -------------------------------------------------------------------------------


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


# --- replay, claims, secrets -----------------------------------------------------------------


@pytest.mark.usefixtures("submitted")
def test_replay_from_admin_sends_the_same_event_id_again(receiver: Receiver) -> None:
    make_endpoint(receiver.url, [WebhookEvent.APPROVAL_CREATED])
    pause_run("cancel order 42")
    delivery.deliver_all_due()
    row = WebhookDelivery.objects.get()
    assert row.status == DeliveryStatus.DELIVERED

    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    answer = client.post(
        "/admin/webhooks/webhookdelivery/",
        {"action": "replay", "_selected_action": [row.pk]},
        follow=True,
    )
    assert answer.status_code == 200
    assert "Replaying 1 delivery" in answer.content.decode()
    row.refresh_from_db()
    assert (row.status, row.replays) == (DeliveryStatus.PENDING, 1)

    assert delivery.deliver_all_due() == 1
    assert receiver.delivery_ids() == [row.event_id, row.event_id]
    assert receiver.bodies()[0] == receiver.bodies()[1]
    row.refresh_from_db()
    assert (row.status, row.attempts) == (DeliveryStatus.DELIVERED, 2)
    assert list(row.attempt_log.values_list("number", "replay")) == [(1, False), (2, True)]
    page = client.get(f"/admin/webhooks/webhookdelivery/{row.pk}/change/").content.decode()
    assert row.event_id in page and "cancel_order" in page  # the payload, shown
    assert 'name="status"' not in page  # read-only


def test_a_reviewer_without_the_permission_cannot_replay(receiver: Receiver) -> None:
    staff = make_user(perms=["webhooks.view_webhookdelivery"], username="sam", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = client.get("/admin/webhooks/webhookdelivery/")
    assert page.status_code == 200
    assert 'value="replay"' not in page.content.decode()


def queued(endpoints: list[WebhookEndpoint], each: int) -> list[WebhookDelivery]:
    rows = []
    for _ in range(each):
        with transaction.atomic():
            rows += outbox.queue(WebhookEvent.RUN_COMPLETED, lambda: {"run": {"id": 1}})
    assert len(rows) == len(endpoints) * each
    return rows


def test_concurrent_claims_never_take_one_attempt_twice(receiver: Receiver) -> None:
    endpoints = [make_endpoint(receiver.url) for _ in range(3)]
    rows = queued(endpoints, 6)
    start = threading.Barrier(4)
    won: list[list[int]] = [[] for _ in range(4)]

    def claim(index: int) -> None:
        try:
            start.wait(5)
            for _ in range(3):
                won[index] += [c.delivery_id for c in delivery.claim_due(limit=8)]
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    claimed = [pk for ids in won for pk in ids]
    assert sorted(claimed) == sorted(row.pk for row in rows)  # each once, none left
    assert set(WebhookDelivery.objects.values_list("attempts", flat=True)) == {1}


def test_processes_delivering_at_once_send_each_attempt_once(receiver: Receiver) -> None:
    endpoints = [make_endpoint(receiver.url) for _ in range(2)]
    rows = queued(endpoints, 5)
    start = threading.Barrier(3)

    def deliver() -> None:
        try:
            start.wait(5)
            delivery.deliver_all_due()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deliver) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(receiver.delivery_ids()) == sorted(row.event_id for row in rows)
    assert set(statuses()) == {DeliveryStatus.DELIVERED}
    assert WebhookAttempt.objects.count() == len(rows)


def test_a_dead_endpoint_does_not_hold_up_the_others(receiver: Receiver, settings: Any) -> None:
    settings.AGENTSITE_WEBHOOK_TIMEOUT = 0.5
    settings.AGENTSITE_WEBHOOK_CONCURRENCY = 2
    # A server that accepts connections and never answers.
    silent = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    silent.receiver = Receiver()  # type: ignore[attr-defined]
    silent.receiver.gate.clear()  # type: ignore[attr-defined]
    threading.Thread(target=silent.serve_forever, daemon=True).start()
    try:
        dead = make_endpoint(f"http://127.0.0.1:{silent.server_address[1]}/", name="dead")
        queued([dead], 10)  # due first, many of them
        alive = make_endpoint(receiver.url, name="alive")
        queued([dead, alive], 2)  # the live one's come last
        began = time.monotonic()
        assert delivery.deliver_due() == 2  # one thread each
        first_round = time.monotonic() - began
        assert len(receiver.requests) == 1  # the live one was not left behind the dead
        delivery.deliver_due()
        took = time.monotonic() - began
    finally:
        silent.receiver.gate.set()  # type: ignore[attr-defined]
        silent.shutdown()
        silent.server_close()
    assert len(receiver.requests) == 2  # the live one got both
    tried = WebhookDelivery.objects.filter(endpoint=dead, attempts=1)
    assert set(tried.values_list("status", flat=True)) == {DeliveryStatus.PENDING}
    assert {row.last_error for row in tried} == {"No answer within 0.5 s."}
    assert tried.count() == 2
    assert first_round < 1.5 and took < 2.5  # each round bounded by the timeout


def test_the_secret_is_never_logged(
    receiver: Receiver, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    settings.AGENTSITE_WEBHOOK_MAX_ATTEMPTS = 1
    caplog.set_level(logging.DEBUG)
    refused = make_endpoint("http://127.0.0.1:9/nothing-listens", name="refused")
    failing = make_endpoint(receiver.url, name="failing")
    receiver.codes = [500]
    queued([refused, failing], 1)
    delivery.deliver_all_due()
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    before = {e.pk: e.secret for e in WebhookEndpoint.objects.all()}
    client.post(
        "/admin/webhooks/webhookendpoint/",
        {"action": "rotate_secret", "_selected_action": list(before)},
    )
    after = {e.pk: e.secret for e in WebhookEndpoint.objects.all()}
    assert all(after[pk] != before[pk] and after[pk].startswith("whsec_") for pk in before)
    assert statuses() == [DeliveryStatus.FAILED, DeliveryStatus.FAILED]
    assert "failed for good" in caplog.text  # something was logged
    recorded = " ".join(WebhookAttempt.objects.values_list("error", flat=True))
    for secret in [*before.values(), *after.values()]:
        assert secret not in caplog.text
        assert secret not in recorded
    assert "whsec_" not in repr(failing) + str(failing)


# --- the parts -------------------------------------------------------------------------------


def test_the_signature_refuses_another_body_secret_or_an_old_timestamp() -> None:
    body = b'{"id":"evt_1"}'
    value = signing.header("whsec_s", body, timestamp=1_000_000)
    assert value.startswith("t=1000000,v1=")
    assert signing.verify("whsec_s", body, value, now=1_000_100)
    assert not signing.verify("whsec_s", body + b" ", value, now=1_000_100)
    assert not signing.verify("whsec_t", body, value, now=1_000_100)
    assert not signing.verify("whsec_s", body, value, now=1_000_000 + 301)
    assert not signing.verify("whsec_s", body, "v1=abc", now=1_000_000)
    assert verified("whsec_s", body, signing.header("whsec_s", body))


def test_an_endpoint_takes_only_http_or_https_and_gets_a_secret_of_its_own() -> None:
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    form = {"name": "ops", "events": ["approval.created", "run.failed"], "enabled": "on"}
    refused = client.post(
        "/admin/webhooks/webhookendpoint/add/", {**form, "url": "ftp://example.com/x"}
    )
    assert refused.status_code == 200 and WebhookEndpoint.objects.count() == 0
    client.post("/admin/webhooks/webhookendpoint/add/", {**form, "url": "https://example.com/x"})
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.events == ["approval.created", "run.failed"]
    assert endpoint.secret.startswith("whsec_") and len(endpoint.secret) > 40
    page = client.get(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/").content.decode()
    assert endpoint.secret in page  # shown to staff, read-only
    assert 'name="secret"' not in page


def test_in_tasks_mode_a_delivery_and_each_retry_are_tasks_committed_with_them(
    receiver: Receiver, settings: Any
) -> None:
    from django_tasks_db.models import DBTaskResult

    settings.AGENTSITE_EXECUTOR = "tasks"
    settings.AGENTSITE_WEBHOOK_BACKOFF_SECONDS = [30]
    receiver.codes = [500]
    make_endpoint(receiver.url)

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        outbox.queue(WebhookEvent.RUN_COMPLETED, lambda: {"run": {"id": 1}})
        assert DBTaskResult.objects.count() == 1  # in the delivery's transaction...
        raise Undo
    assert not DBTaskResult.objects.exists()  # ...so gone with it
    assert not WebhookDelivery.objects.exists()

    with transaction.atomic():
        outbox.queue(WebhookEvent.RUN_COMPLETED, lambda: {"run": {"id": 1}})
    (task,) = DBTaskResult.objects.all()
    assert task.task_path == "webhooks.tasks.deliver_webhooks"
    assert task.task.call() == 1  # what a worker does with it: one attempt, refused
    retry = DBTaskResult.objects.exclude(pk=task.pk).get()
    row = WebhookDelivery.objects.get()
    assert row.status == DeliveryStatus.PENDING and row.attempts == 1
    assert abs((retry.run_after - row.next_attempt_at).total_seconds()) < 0.01
    assert len(receiver.requests) == 1


def test_the_server_loop_starts_the_delivery_timer_in_inprocess_mode_only(settings: Any) -> None:
    from engine import signals, sweeper

    settings.AGENTSITE_SWEEP_SECONDS = 0
    heard: list[asyncio.AbstractEventLoop] = []

    def listen(sender: Any, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        heard.append(loop)

    async def bind() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        signals.server_loop_started.connect(listen)
        try:
            sweeper.start(loop)  # what `executor.bind_server_loop` calls
        finally:
            signals.server_loop_started.disconnect(listen)
        started = delivery.start_timer(loop) is None  # already delivering on this loop
        task = delivery.stop_timer(loop)
        assert task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await task
        settings.AGENTSITE_EXECUTOR = "tasks"
        sweeper.start(loop)
        idle = delivery.stop_timer(loop) is None  # the workers deliver instead
        return started, idle

    started, idle = asyncio.run(bind())
    assert len(heard) == 1
    assert started and idle
