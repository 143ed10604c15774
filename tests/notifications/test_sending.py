"""Sending what the outbox queued (`notifications/sending.py`): never in a run's path; a request
decided meanwhile is not mailed; SMTP failures are retried, then recorded failed; rounds
sending at once send each email once; in "tasks" mode the emails are a task committed with
them, in "inprocess" mode the server loop's timer sends; `manage.py send_notifications`; no
link or address in the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import mail
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest
from engine import signals
from notifications import sending
from notifications.models import (
    EmailMode,
    Notification,
    NotificationPreference,
    NotificationStatus,
)
from tests.factories import (
    make_request,
    pause_run,
)
from tests.notifications import SmtpServer, announce, link_of, opted_in, unchanged
from tests.services import eventually, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


def test_a_request_decided_before_its_email_goes_is_not_sent() -> None:
    from engine import runs

    opted_in("rita")
    ines = opted_in("ines")
    request = make_request()
    announce(request)
    runs.decide(request, ines, runs.Decision.reject("No."))
    sending.send_all_due()
    assert mail.outbox == []
    assert set(Notification.objects.values_list("status", flat=True)) == {
        NotificationStatus.SKIPPED
    }


def test_no_link_or_address_reaches_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    opted_in()
    request = make_request()
    announce(request)
    sending.send_all_due()
    (message,) = mail.outbox
    token = parse_qs(urlsplit(link_of(message)).query)["t"][0]
    assert "Sent the email to user" in caplog.text  # something was logged
    assert token not in caplog.text
    assert "rita@example.com" not in caplog.text


@pytest.mark.usefixtures("submitted")
def test_an_smtp_failure_is_retried_then_recorded_failed_and_the_run_goes_on(
    settings: Any,
) -> None:
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            # Nothing listens there: a real SMTP connection, refused.
            "OPTIONS": {"host": "127.0.0.1", "port": free_port(), "timeout": 2.0},
        }
    }
    settings.AGENTSITE_EMAIL_MAX_ATTEMPTS = 3
    settings.AGENTSITE_EMAIL_BACKOFF_SECONDS = [0.05]
    opted_in()

    began = time.monotonic()
    run = pause_run("cancel order 42")  # never waited on the mail server
    assert time.monotonic() - began < 5
    request = run.approval_requests.get()

    assert sending.send_due() == 1  # the first attempt: refused
    row = Notification.objects.get()
    assert (row.status, row.attempts) == (NotificationStatus.PENDING, 1)
    assert "ConnectionRefusedError" in row.last_error
    assert row.due_at > timezone.now() - timedelta(seconds=1)
    deadline = time.monotonic() + 5
    while row.status != NotificationStatus.FAILED and time.monotonic() < deadline:
        time.sleep(0.06)  # the backoff
        sending.send_all_due()
        row.refresh_from_db()
    assert (row.status, row.attempts) == (NotificationStatus.FAILED, 3)
    assert sending.send_all_due() == 0  # failed for good: not tried again
    unchanged(request)


def test_in_tasks_mode_the_emails_are_a_task_committed_with_them(settings: Any) -> None:
    from django_tasks_db.models import DBTaskResult

    settings.AGENTSITE_EXECUTOR = "tasks"
    opted_in("rita")
    opted_in("dora", EmailMode.DIGEST, digest_minutes=15)
    request = make_request()

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        signals.approval_created.send(sender=ApprovalRequest, request=request)
        assert DBTaskResult.objects.count() == 1  # in the rows' transaction...
        raise Undo
    assert not DBTaskResult.objects.exists()  # ...so gone with them

    announce(request)
    (task,) = DBTaskResult.objects.all()
    assert task.task_path == "notifications.tasks.send_notifications"
    assert task.task.call() == 1  # what a worker does: rita's email (dora's waits)
    assert [m.to for m in mail.outbox] == [["rita@example.com"]]

    # Only a digest to send: the task runs when the digest is due.
    NotificationPreference.objects.filter(user__username="rita").update(mode=EmailMode.OFF)
    later = make_request()
    announce(later)
    digest = Notification.objects.get(request=later)
    queued = DBTaskResult.objects.exclude(pk=task.pk).get()
    assert queued.run_after == digest.due_at > timezone.now()


def test_the_server_loops_timer_sends_a_committed_notification(
    timer: asyncio.AbstractEventLoop,
) -> None:
    opted_in()
    announce(make_request())
    eventually(lambda: len(mail.outbox) == 1)
    eventually(lambda: Notification.objects.get().status == NotificationStatus.SENT)


def test_the_command_sends_what_is_due(capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management import call_command

    opted_in()
    announce(make_request())
    call_command("send_notifications")
    assert "Handled 1 email notification(s)." in capsys.readouterr().out
    assert len(mail.outbox) == 1


def test_an_email_goes_over_smtp_and_a_temporary_refusal_is_retried(
    smtp: SmtpServer, settings: Any
) -> None:
    settings.AGENTSITE_EMAIL_BACKOFF_SECONDS = [0]
    smtp.codes = [451, 250]
    opted_in()
    announce(make_request())
    sending.send_all_due()  # refused, then at once (a wait of 0) sent
    row = Notification.objects.get()
    assert (row.status, row.attempts) == (NotificationStatus.SENT, 2)
    assert len(smtp.messages) == 2
    sent = smtp.messages[-1].decode()
    assert "To: rita@example.com" in sent
    assert "multipart/alternative" in sent and "text/html" in sent
    assert "Auto-Submitted: auto-generated" in sent


def test_rounds_sending_at_once_send_each_notification_once() -> None:
    from django.db import connections

    reviewers = [opted_in(f"r{n}") for n in range(4)]
    for _ in range(3):
        announce(make_request())
    assert Notification.objects.count() == 3 * len(reviewers)
    start = threading.Barrier(3)

    def send() -> None:
        try:
            start.wait(5)
            sending.send_all_due()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(mail.outbox) == 12  # each row once, whichever round won it
    assert set(Notification.objects.values_list("status", flat=True)) == {NotificationStatus.SENT}
    assert set(Notification.objects.values_list("attempts", flat=True)) == {1}


def test_the_server_loop_starts_the_sending_timer_in_inprocess_mode_only(settings: Any) -> None:
    from engine import sweeper
    from webhooks import delivery

    settings.AGENTSITE_SWEEP_SECONDS = 0

    async def bind() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        sweeper.start(loop)  # what `executor.bind_server_loop` calls: server_loop_started
        started = sending.start_timer(loop) is None  # already sending on this loop
        for stop in (sending.stop_timer, delivery.stop_timer):
            task = stop(loop)
            assert task is not None
            with contextlib.suppress(asyncio.CancelledError):
                await task
        settings.AGENTSITE_EXECUTOR = "tasks"
        sweeper.start(loop)
        idle = sending.stop_timer(loop) is None  # the workers send instead
        return started, idle

    assert asyncio.run(bind()) == (True, True)


def test_a_row_whose_request_is_gone_is_skipped_not_claimed_forever() -> None:
    opted_in()
    request = make_request()
    announce(request)
    row = Notification.objects.get()
    Notification.objects.filter(pk=row.pk).update(request_id=request.pk + 1000)  # an orphan
    sending.send_all_due()
    row.refresh_from_db()
    assert (row.status, row.attempts) == (NotificationStatus.SKIPPED, 1)
    assert sending.send_all_due() == 0
    assert mail.outbox == []
