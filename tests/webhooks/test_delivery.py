"""Sending what the outbox queued (`webhooks/delivery.py`): each attempt claimed by exactly one
sender, however many threads and processes deliver at once; a dead endpoint holds up no other;
the secret is never logged; in "tasks" mode each delivery and retry is a task committed with
it, in "inprocess" mode the server loop's timer sends. Each test speaks to a real HTTP server
on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import threading
import time
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import Client

from tests.factories import (
    make_user,
    pause_run,
)
from tests.webhooks import Handler, Receiver, make_endpoint, queued, statuses
from webhooks import delivery, outbox
from webhooks.models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


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
    silent = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
