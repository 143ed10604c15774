"""Email notifications with one-click review. Rows are an outbox written in
the engine's own transactions and sent elsewhere through Django's email framework (the
locmem backend in tests, a real SMTP connection where a failure is tested); each email's
signed link only opens the request's page."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import Group, Permission
from django.core import mail, signing
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from engine import signals
from engine.models import AgentRun, RunStatus
from notifications import links, sending
from notifications.models import (
    EmailMode,
    Notification,
    NotificationKind,
    NotificationPreference,
    NotificationStatus,
)
from tests.agentsite.test_csp import inline_code
from tests.factories import (
    PASSWORD,
    make_request,
    make_reviewer,
    make_run,
    make_user,
    pause_run,
)
from tests.services import outbox_timer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

LINK = re.compile(r"https?://\S+/notifications/open/\?t=[\w%:.\-]+")


def opted_in(username: str = "rita", mode: str = EmailMode.IMMEDIATELY, **kwargs: Any) -> Any:
    """A reviewer with an address and these email settings."""
    reviewer = make_reviewer(username)
    reviewer.email = f"{username}@example.com"
    reviewer.save()
    NotificationPreference.objects.create(user=reviewer, mode=mode, **kwargs)
    return reviewer


def announce(request: ApprovalRequest) -> None:
    """What the engine's pause does for a request that waits, in its transaction."""
    with transaction.atomic():
        signals.approval_created.send(sender=ApprovalRequest, request=request)


def link_of(message: Any) -> str:
    found = LINK.findall(message.body)
    assert found, message.body
    return found[0]


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def html_of(message: Any) -> str:
    ((html, kind),) = message.alternatives
    assert kind == "text/html"
    return str(html)


def unchanged(request: ApprovalRequest) -> None:
    request.refresh_from_db()
    assert request.status == "pending"
    assert not ApprovalDecision.objects.filter(request=request).exists()
    assert AgentRun.objects.get(pk=request.run_id).status == RunStatus.WAITING


# --- the Done-when line ----------------------------------------------------------------------


@pytest.mark.usefixtures("submitted")
def test_an_opted_in_reviewer_is_emailed_and_its_link_opens_the_page_after_login_deciding_nothing(
    client: Client, settings: Any
) -> None:
    settings.AGENTSITE_EMAIL_SITE_URL = "https://agents.example.com"
    rita = opted_in()
    run = pause_run("cancel order 42")  # alice asks; a real pause, the engine's signal
    request = run.approval_requests.get()
    (row,) = Notification.objects.all()
    assert (row.user_id, row.request_id, row.kind, row.digest) == (
        rita.pk,
        request.pk,
        NotificationKind.CREATED,
        False,
    )
    assert mail.outbox == []  # queued with the pause, sent elsewhere
    assert sending.send_all_due() == 1

    (message,) = mail.outbox
    assert message.to == ["rita@example.com"]
    assert "cancel_order" in message.subject
    shown = ("cancel_order", request.agent_name, "risk: irreversible", "Asked by: alice")
    for text in (*shown, "Expires:", "Order Id: 42", "Status: Placed", "Burr coffee grinder"):
        assert text in message.body, message.body  # as the inbox explains it, facts too
    url = link_of(message)
    assert url.startswith("https://agents.example.com/notifications/open/?t=")
    assert url in html_of(message).replace("&amp;", "&")
    row.refresh_from_db()
    assert row.status == NotificationStatus.SENT and row.sent_at is not None

    # Followed before logging in (a mail scanner, or a reviewer on a new device).
    anonymous = client.get(path_of(url))
    assert anonymous.status_code == 302
    assert anonymous["Location"].startswith("/accounts/login/?next=")
    unchanged(request)
    # The login page sends her back through the link, which opens the request's page.
    logged_in = client.post(
        anonymous["Location"], {"username": "rita", "password": PASSWORD}, follow=True
    )
    assert logged_in.redirect_chain[-1][0] == f"/inbox/{request.pk}/"
    assert logged_in.status_code == 200
    page = logged_in.content.decode()
    assert "cancel_order" in page and 'value="approve"' in page  # she decides here, by POST
    unchanged(request)
    # Followed again, logged in: straight to the page; a HEAD too (scanners use it).
    again = client.get(path_of(url))
    assert (again.status_code, again["Location"]) == (302, f"/inbox/{request.pk}/")
    assert client.head(path_of(url)).status_code == 302
    assert client.post(path_of(url)).status_code == 405  # nothing to post here
    unchanged(request)


# --- who is told, and how -------------------------------------------------------------------


def test_a_digest_groups_the_due_requests_of_one_reviewer_in_one_email() -> None:
    opted_in("rita", EmailMode.DIGEST, digest_minutes=5)
    opted_in("ines", EmailMode.IMMEDIATELY)
    first = make_request(tool_name="cancel_order")
    second = make_request(tool_name="issue_refund", arguments={"order_id": 44, "amount": 5})
    announce(first)
    announce(second)

    digest = Notification.objects.filter(user__username="rita")
    assert {row.digest for row in digest} == {True}
    (due,) = {row.due_at for row in digest}  # one window, one time
    assert timezone.now() < due <= timezone.now() + timedelta(minutes=5)
    assert due.timestamp() % 300 == 0
    sending.send_all_due()
    assert [m.to for m in mail.outbox] == [["ines@example.com"], ["ines@example.com"]]

    digest.update(due_at=timezone.now() - timedelta(seconds=1))  # the window ended
    mail.outbox.clear()
    sending.send_all_due()
    (message,) = mail.outbox
    assert message.to == ["rita@example.com"]
    assert message.subject == "[agentsite] 2 tool calls wait for your review"
    assert "cancel_order" in message.body and "issue_refund" in message.body
    assert len(LINK.findall(message.body)) == 2  # a link per request
    assert set(digest.values_list("status", flat=True)) == {NotificationStatus.SENT}


def test_only_the_chosen_agents_and_tools_are_emailed_and_off_means_nothing() -> None:
    opted_in("rita", tools=["issue_refund"])
    opted_in("ines", agents=["Billing"])
    opted_in("omar", EmailMode.OFF)
    make_reviewer("nadia")  # never opened her settings: off
    opted_in("tess", tools=["cancel_order"], agents=["Support desk"])
    announce(make_request(tool_name="cancel_order", agent_name="Support desk"))
    announce(make_request(tool_name="issue_refund", agent_name="Billing"))
    told = sorted(Notification.objects.values_list("user__username", "request__tool_name"))
    assert told == [
        ("ines", "issue_refund"),
        ("rita", "issue_refund"),
        ("tess", "cancel_order"),
    ]
    sending.send_all_due()
    assert sorted(m.to[0] for m in mail.outbox) == [
        "ines@example.com",
        "rita@example.com",
        "tess@example.com",
    ]


def test_people_who_may_not_decide_or_have_no_address_are_not_emailed() -> None:
    alice = make_user(username="alice_customer", email="alice@example.com")
    NotificationPreference.objects.create(user=alice, mode=EmailMode.IMMEDIATELY)
    nobody = make_reviewer("noaddress")
    NotificationPreference.objects.create(user=nobody, mode=EmailMode.IMMEDIATELY)
    gone = opted_in("gone")
    gone.is_active = False
    gone.save()
    opted_in("rita")
    announce(make_request())
    assert list(Notification.objects.values_list("user__username", flat=True)) == ["rita"]


def test_a_rolled_back_pause_emails_nobody() -> None:
    opted_in()
    request = make_request()

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        signals.approval_created.send(sender=ApprovalRequest, request=request)
        assert Notification.objects.count() == 1  # written with the pause...
        raise Undo
    assert Notification.objects.count() == 0  # ...and gone with it
    assert sending.send_all_due() == 0
    assert mail.outbox == []


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


def test_the_asker_who_is_a_reviewer_is_told_it_is_her_own_conversation() -> None:
    rita = opted_in()
    request = make_request(run=make_run(owner=rita))
    announce(request)
    sending.send_all_due()
    (message,) = mail.outbox
    assert "Your own conversation: another reviewer must approve it" in message.body
    assert "Your own conversation" in html_of(message)


def test_the_html_part_escapes_what_the_model_and_the_user_wrote() -> None:
    opted_in()
    asker = make_user(username="<b>mallory</b>")
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    request = make_request(
        run=make_run(owner=asker),
        agent_name="<i>Agent</i>",
        tool_name="cancel_order",
        arguments={"order_id": 42, "reason": evil},
    )
    announce(request)
    sending.send_all_due()
    (message,) = mail.outbox
    html = html_of(message)
    assert "<script>" not in html and "<img" not in html and "<b>mallory" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&lt;b&gt;mallory&lt;/b&gt;" in html and "&lt;i&gt;Agent&lt;/i&gt;" in html
    assert inline_code(html) == []
    assert evil in message.body  # the plain text part is text: as written
    assert "\n" not in message.subject


def test_emails_name_an_mcp_tools_server_and_show_commands_and_patches() -> None:
    from approvals.models import ToolKind

    opted_in()
    mcp = make_request(tool_name="restock", kind=ToolKind.MCP, server="warehouse")
    announce(mcp)
    sending.send_all_due()
    (message,) = mail.outbox
    assert message.subject == (
        "[agentsite] restock · MCP server warehouse (Support desk) waits for your review"
    )
    assert "<h2>restock · MCP server warehouse <small>" in html_of(message)

    mail.outbox.clear()
    shell = make_request(
        tool_name="shell",
        kind=ToolKind.SHELL,
        arguments={"commands": ["ls -la", "echo <b>hi</b>"], "timeout_ms": 60000},
    )
    announce(shell)
    sending.send_all_due()
    (message,) = mail.outbox
    assert "Commands:\n  $ ls -la\n  $ echo <b>hi</b>\nTimeout: 60 s" in message.body
    html = html_of(message)
    assert "<pre>$ ls -la\n$ echo &lt;b&gt;hi&lt;/b&gt;\n</pre>" in html
    assert "Shell command" in html and inline_code(html) == []

    mail.outbox.clear()
    patch = make_request(
        tool_name="apply_patch",
        kind=ToolKind.APPLY_PATCH,
        arguments={"type": "update_file", "path": "src/<app>.py", "diff": "@@\n-a\n+b\n+c\n"},
    )
    announce(patch)
    sending.send_all_due()
    (message,) = mail.outbox
    assert "Update the file src/<app>.py (+2 −1 lines): open the request" in message.body
    assert "Update the file <code>src/&lt;app&gt;.py</code> (+2 −1 lines)" in html_of(message)


def test_an_escalation_emails_every_member_of_the_group_who_may_decide_at_once() -> None:
    leads = Group.objects.create(name="leads")
    leads.permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    lena = make_user(username="lena", email="lena@example.com")  # a reviewer through the group
    lena.groups.add(leads)
    digest = opted_in("dora", EmailMode.DIGEST, digest_minutes=60)  # a digest: still at once
    digest.groups.add(leads)
    off = opted_in("otto", EmailMode.OFF)  # off: the policy chose the group
    off.groups.add(leads)
    make_user(username="nemo").groups.add(leads)  # no address
    viewer = Group.objects.create(name="viewers")
    make_user(username="vera", email="vera@example.com").groups.add(viewer)
    opted_in("rita")  # a reviewer outside the group: not told of the escalation

    request = make_request()
    with transaction.atomic():
        signals.approval_escalated.send(sender=ApprovalRequest, request=request, group_name="leads")
    rows = Notification.objects.all()
    assert sorted(rows.values_list("user__username", flat=True)) == ["dora", "lena", "otto"]
    assert {(row.kind, row.digest, row.group_name) for row in rows} == {
        (NotificationKind.ESCALATED, False, "leads")
    }
    sending.send_all_due()
    assert sorted(m.to[0] for m in mail.outbox) == [
        "dora@example.com",
        "lena@example.com",
        "otto@example.com",
    ]
    message = mail.outbox[0]
    assert message.subject.startswith("[agentsite] Escalated to leads: cancel_order")
    assert "This request was escalated to you (group leads)" in message.body
    assert "escalated to you" in html_of(message)


def test_a_reminder_reaches_the_reviewers_who_opted_in_at_once() -> None:
    opted_in("rita", EmailMode.DIGEST, digest_minutes=60)
    opted_in("omar", EmailMode.OFF)
    opted_in("tess", tools=["issue_refund"])
    request = make_request(expires_at=timezone.now() + timedelta(minutes=10))
    with transaction.atomic():
        signals.approval_reminder.send(sender=ApprovalRequest, request=request)
    (row,) = Notification.objects.all()
    assert (row.user.username, row.kind, row.digest) == ("rita", NotificationKind.REMINDER, False)
    sending.send_all_due()
    (message,) = mail.outbox
    assert message.subject.startswith("[agentsite] Reminder: cancel_order")
    assert "expires in" in message.subject
    assert "Reminder: this request expires in" in message.body


def test_a_notification_that_cannot_be_queued_never_fails_the_pause(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    opted_in()
    request = make_request()

    def broken(*args: Any) -> Any:
        raise ValueError("a bug")

    monkeypatch.setattr(NotificationPreference, "digest_due", broken)
    monkeypatch.setattr(NotificationPreference, "wants", broken)
    with transaction.atomic():
        signals.approval_created.send(sender=ApprovalRequest, request=request)
        ApprovalRequest.objects.filter(pk=request.pk).update(tool_name="still_written")
    assert ApprovalRequest.objects.get(pk=request.pk).tool_name == "still_written"
    assert not Notification.objects.exists()
    assert "[non-fatal] Notifications: could not queue the created emails" in caplog.text


# --- links ----------------------------------------------------------------------------------


def test_a_tampered_expired_or_another_persons_link_is_refused_and_changes_nothing(
    client: Client, settings: Any
) -> None:
    rita = make_reviewer("rita")
    ines = make_reviewer("ines")
    request = make_request()
    client.force_login(rita)

    good = links.token(request.pk, rita.pk)
    assert client.get("/notifications/open/", {"t": good})["Location"] == f"/inbox/{request.pk}/"

    tampered = good[:-3] + ("aaa" if not good.endswith("aaa") else "bbb")
    other_request = links.token(request.pk + 1, rita.pk).split(":")[0] + good[good.index(":") :]
    for bad in (tampered, other_request, "", "not-a-token", good + "x"):
        answer = client.get("/notifications/open/", {"t": bad})
        assert answer.status_code == 400, bad
        assert "This link is not valid" in answer.content.decode()
        assert inline_code(answer.content.decode()) == []

    # Another reviewer's link: refused for rita, whatever she is allowed to see.
    answer = client.get("/notifications/open/", {"t": links.token(request.pk, ines.pk)})
    assert answer.status_code == 403
    assert "sent to another person" in answer.content.decode()

    # Made with another salt (another signed thing of the site) is not a link.
    other = signing.TimestampSigner(salt="another").sign_object({"r": request.pk, "u": rita.pk})
    assert client.get("/notifications/open/", {"t": other}).status_code == 400

    settings.AGENTSITE_EMAIL_LINK_SECONDS = 60
    signer = signing.TimestampSigner(salt=links.SALT)
    old = signer.sign_object({"r": request.pk, "u": rita.pk}, compress=True)
    original_time = time.time
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: original_time() + 61)
        answer = client.get("/notifications/open/", {"t": old})
    assert answer.status_code == 410
    assert "This link has expired" in answer.content.decode()
    client.logout()
    assert client.get("/notifications/open/", {"t": tampered}).status_code == 400
    unchanged(request)


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


# --- sending: failures, tasks, the timer ------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.usefixtures("submitted")
def test_an_smtp_failure_is_retried_then_recorded_failed_and_the_run_goes_on(
    settings: Any,
) -> None:
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            # Nothing listens there: a real SMTP connection, refused.
            "OPTIONS": {"host": "127.0.0.1", "port": closed_port(), "timeout": 2.0},
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


def eventually(check: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    assert check()


@pytest.fixture
def timer() -> Iterator[asyncio.AbstractEventLoop]:
    """A server loop's sending timer, as the "inprocess" mode's web server runs it."""
    with outbox_timer(sending) as loop:
        yield loop


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


# --- the settings page ----------------------------------------------------------------------


def test_a_reviewer_chooses_her_email_settings_on_her_page(client: Client) -> None:
    rita = make_reviewer("rita")
    client.force_login(rita)
    inbox = client.get("/inbox/").content.decode()
    assert 'href="/account/notifications/"' in inbox  # linked from the inbox's header

    page = client.get("/account/notifications/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "no email address" in html  # she has none yet
    assert inline_code(html) == []
    assert NotificationPreference.objects.get(user=rita).mode == EmailMode.OFF  # made, off

    saved = client.post(
        "/account/notifications/",
        {
            "mode": "digest",
            "digest_minutes": "60",
            "agents": "Support desk, Billing,",
            "tools": "",
        },
    )
    assert saved.status_code == 302
    preference = NotificationPreference.objects.get(user=rita)
    assert (preference.mode, preference.digest_minutes) == (EmailMode.DIGEST, 60)
    assert (preference.agents, preference.tools) == (["Support desk", "Billing"], [])
    again = client.get("/account/notifications/").content.decode()
    assert 'value="Support desk, Billing"' in again

    refused = client.post("/account/notifications/", {"mode": "digest", "digest_minutes": "7"})
    assert refused.status_code == 400
    assert NotificationPreference.objects.get(user=rita).digest_minutes == 60


def test_only_reviewers_have_email_settings(client: Client) -> None:
    assert client.get("/account/notifications/")["Location"].startswith("/accounts/login/")
    client.force_login(make_user(username="alice"))
    assert client.get("/account/notifications/").status_code == 403
    assert not NotificationPreference.objects.exists()


def test_admin_lists_preferences_and_notifications() -> None:
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    opted_in()
    announce(make_request())
    client = Client()
    client.force_login(admin)
    assert client.get("/admin/notifications/notificationpreference/").status_code == 200
    page = client.get("/admin/notifications/notification/")
    assert page.status_code == 200 and "a new request" in page.content.decode()


# --- a real SMTP server on 127.0.0.1 ---------------------------------------------------------


class SmtpServer:
    """A minimal SMTP server: what it was sent, and how it answers DATA (`codes` in turn, the
    last repeats: 451 is a temporary refusal)."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.codes = [250]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                with conn, conn.makefile("rb") as lines:
                    self.session(conn, lines)

    def session(self, conn: socket.socket, lines: Any) -> None:
        conn.sendall(b"220 test ESMTP\r\n")
        while line := lines.readline():
            verb = line[:4].upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 test\r\n")
            elif verb == b"DATA":
                conn.sendall(b"354 go on\r\n")
                body = b""
                while (chunk := lines.readline()) not in (b".\r\n", b""):
                    body += chunk
                code = self.codes[min(len(self.messages), len(self.codes) - 1)]
                self.messages.append(body)
                conn.sendall(b"250 queued\r\n" if code == 250 else b"451 try later\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            else:
                conn.sendall(b"250 ok\r\n")

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def smtp(settings: Any) -> Iterator[SmtpServer]:
    server = SmtpServer()
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "127.0.0.1", "port": server.port, "timeout": 5.0},
        }
    }
    yield server
    server.close()


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
