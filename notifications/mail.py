"""What one email says: each request as the inbox shows it (tool, agent, risk, description,
labelled arguments, facts with their warnings, who asked, when it expires; `approvals.explain`)
and its signed link (`links.py`), as plain text and as HTML. Every model or user text is
escaped in the HTML part (Django's templates escape it)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import reverse

from approvals import explain
from approvals.models import ApprovalRequest
from common import formatting
from engine import runs
from notifications import links
from notifications.models import Notification, NotificationKind

SUBJECT_PREFIX = "[agentsite] "


@dataclass(frozen=True)
class Item:
    """One request of an email, for its templates."""

    notification: Notification
    request: ApprovalRequest
    call: explain.Explanation
    link: str
    asked_by: str
    expires: str
    # The recipient's own conversation (she asked, or owns it).
    own: bool
    # ...and therefore another reviewer must approve it (AGENTSITE_SELF_APPROVAL off).
    needs_another: bool


def site_url(path: str) -> str:
    return f"{settings.AGENTSITE_EMAIL_SITE_URL.rstrip('/')}{path}"


def item(notification: Notification, user: Any) -> Item:
    request = notification.request
    run = request.run
    own = user.pk in (run.requested_by_id, run.conversation.owner_id)
    return Item(
        notification=notification,
        request=request,
        call=explain.for_request(request),
        link=links.url(request.pk, user.pk),
        asked_by=run.requested_by.get_username() if run.requested_by else "nobody signed in",
        expires=formatting.expires(request.expires_at),
        own=own,
        needs_another=runs.needs_another_reviewer(request, user),
    )


def subject(items: list[Item]) -> str:
    first = items[0]
    tool, agent = first.request.tool_display(), first.request.agent_name
    kind = first.notification.kind
    if len(items) > 1:
        text = f"{len(items)} tool calls wait for your review"
    elif kind == NotificationKind.ESCALATED:
        group = first.notification.group_name
        text = f"Escalated to {group}: {tool} ({agent}) waits for a decision"
    elif kind == NotificationKind.REMINDER:
        text = f"Reminder: {tool} ({agent}) {first.expires}"
    else:
        text = f"{tool} ({agent}) waits for your review"
    # A header is one line: a tool or agent name never breaks it.
    return SUBJECT_PREFIX + " ".join(text.split())


def message(user: Any, items: list[Item]) -> EmailMultiAlternatives:
    """The email for `user` about `items` (one, or a digest's several)."""
    context = {
        "user": user,
        "items": items,
        "digest": len(items) > 1 or items[0].notification.digest,
        "inbox_url": site_url(reverse("inbox")),
        "settings_url": site_url(reverse("notification_settings")),
        "link_valid": formatting.span_in_words(
            timedelta(seconds=settings.AGENTSITE_EMAIL_LINK_SECONDS)
        ),
    }
    text = render_to_string("notifications/email.txt", context)
    html = render_to_string("notifications/email.html", context)
    mail = EmailMultiAlternatives(
        subject(items),
        text,
        settings.DEFAULT_FROM_EMAIL,
        [user.email],
        headers={"Auto-Submitted": "auto-generated", "X-Auto-Response-Suppress": "All"},
    )
    mail.attach_alternative(html, "text/html")
    return mail
