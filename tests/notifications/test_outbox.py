"""Email notifications queued (`notifications/outbox.py`): one row per reviewer to mail, in the
engine's own transaction (a rolled-back pause mails nobody, a failure to queue one never fails
the pause), for the agents and tools each chose, at once or in a digest; escalations and
reminders reach who they must; the whole path from a pause to a one-click link first."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from django.core import mail
from django.db import transaction
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest
from engine import signals
from notifications import sending
from notifications.models import (
    EmailMode,
    Notification,
    NotificationKind,
    NotificationPreference,
    NotificationStatus,
)
from tests.factories import (
    PASSWORD,
    make_request,
    make_reviewer,
    make_user,
    pause_run,
)
from tests.notifications import LINK, announce, html_of, link_of, opted_in, path_of, unchanged

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]


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


def test_with_nobody_opted_in_a_request_costs_no_query_until_someone_opts_in(
    django_assert_num_queries: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from notifications import outbox

    make_reviewer("rita")
    NotificationPreference.objects.create(user=make_reviewer("otto"), mode=EmailMode.OFF)
    first, second = make_request(), make_request()
    announce(first)  # reads that nobody wants email
    with django_assert_num_queries(2):  # the pause's savepoint, begun and released
        announce(second)
    assert Notification.objects.count() == 0

    # Opting in here is seen at once...
    opted_in("rita")
    announce(make_request())
    assert Notification.objects.count() == 1
    # ...and one made elsewhere (no signal reaches this process) once the seconds went by.
    NotificationPreference.objects.filter(user__username="rita").update(mode=EmailMode.OFF)
    outbox.forget_opted_in()
    announce(make_request())  # nobody again, remembered
    NotificationPreference.objects.filter(user__username="rita").update(mode=EmailMode.IMMEDIATELY)
    announce(make_request())
    assert Notification.objects.count() == 1
    monkeypatch.setattr(outbox, "OPTED_IN_SECONDS", 0.0)
    announce(make_request())
    assert Notification.objects.count() == 2
