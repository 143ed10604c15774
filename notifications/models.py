"""What each reviewer wants to be mailed (`NotificationPreference`), and the mails queued for
them (`Notification`): an outbox written in the engine's own transactions
(`notifications/outbox.py`), sent by `sending.py`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class EmailMode(models.TextChoices):
    OFF = "off", "Off: no email"
    IMMEDIATELY = "immediately", "Immediately: one email per request"
    DIGEST = "digest", "A digest: the new requests of every few minutes in one email"


DIGEST_MINUTES = [(5, "every 5 minutes"), (15, "every 15 minutes"), (60, "every hour")]


def holding(permission: str, prefix: str = "") -> Q:
    """Users who hold `permission` ("app_label.codename") as Django's ModelBackend grants it:
    superusers, through their own permissions or a group's (active users only: the backend
    grants an inactive user nothing). `prefix` reaches the user from another model."""
    app_label, codename = permission.split(".", 1)
    own = f"{prefix}user_permissions__"
    grouped = f"{prefix}groups__permissions__"
    return Q(**{f"{prefix}is_active": True}) & (
        Q(**{f"{prefix}is_superuser": True})
        | Q(**{f"{own}codename": codename, f"{own}content_type__app_label": app_label})
        | Q(**{f"{grouped}codename": codename, f"{grouped}content_type__app_label": app_label})
    )


class NotificationPreferenceQuerySet(models.QuerySet["NotificationPreference"]):
    def opted_in(self, permission: str) -> NotificationPreferenceQuerySet:
        """Preferences of users who want email, have an address and hold `permission` (one
        query, with the user)."""
        return (
            self.exclude(mode=EmailMode.OFF)
            .exclude(user__email="")
            .filter(holding(permission, "user__"))
            .select_related("user")
            .distinct()
        )


class NotificationPreference(models.Model):
    """One reviewer's email settings, made the first time she opens them (none: off)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    mode = models.CharField(max_length=20, choices=EmailMode.choices, default=EmailMode.OFF)
    digest_minutes = models.PositiveSmallIntegerField(
        choices=DIGEST_MINUTES, default=15, help_text="How often a digest is sent."
    )
    agents = models.JSONField(
        default=list,
        blank=True,
        help_text="Only requests of these agents (as the inbox names them); empty: every agent.",
    )
    tools = models.JSONField(
        default=list, blank=True, help_text="Only requests of these tools; empty: every tool."
    )
    updated = models.DateTimeField(auto_now=True)

    objects = NotificationPreferenceQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.user}: {self.get_mode_display()}"

    def wants(self, agent_name: str, tool_name: str) -> bool:
        """Whether a request of `agent_name`'s `tool_name` is one she asked to be mailed."""
        if self.mode == EmailMode.OFF:
            return False
        return (not self.agents or agent_name in self.agents) and (
            not self.tools or tool_name in self.tools
        )

    def digest_due(self, now: datetime) -> datetime:
        """When the digest that takes a request arriving at `now` goes out: the next whole
        multiple of `digest_minutes` (since the epoch, in UTC), so every request of one window
        shares one time and one email, with no query to find the window."""
        step = timedelta(minutes=self.digest_minutes or 15).total_seconds()
        seconds = now.timestamp()
        return datetime.fromtimestamp((seconds // step + 1) * step, tz=UTC)


class NotificationKind(models.TextChoices):
    CREATED = "created", "a new request"
    ESCALATED = "escalated", "escalated to a group"
    REMINDER = "reminder", "a reminder before the deadline"


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    # Not sent: the request was decided first, or the recipient may no longer decide.
    SKIPPED = "skipped"


class NotificationQuerySet(models.QuerySet["Notification"]):
    def due(self, now: datetime | None = None) -> NotificationQuerySet:
        """To send now: pending and due, or claimed by a process whose lease ran out (it died
        while sending)."""
        return self.filter(
            status__in=(NotificationStatus.PENDING, NotificationStatus.SENDING),
            due_at__lte=now or timezone.now(),
        )


class Notification(models.Model):
    """One request to tell one person about, by email; several due together of one person
    in digest mode go out as one email."""

    # No constraints in the database: rows are written in the engine's transaction, and a
    # user (or run) deleted meanwhile by another process must not fail the engine's commit
    # (a deferred foreign key check would). Deleted through Django, their rows go with them.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="notifications",
        db_constraint=False,
    )
    request = models.ForeignKey(
        "approvals.ApprovalRequest",
        on_delete=models.CASCADE,
        related_name="notifications",
        db_constraint=False,
    )
    kind = models.CharField(max_length=20, choices=NotificationKind.choices)
    digest = models.BooleanField(default=False, help_text="Sent in the user's digest.")
    group_name = models.CharField(
        max_length=150, blank=True, help_text="For an escalation: the group it went to."
    )
    status = models.CharField(
        max_length=20, choices=NotificationStatus.choices, default=NotificationStatus.PENDING
    )
    due_at = models.DateTimeField(
        default=timezone.now, help_text="When it is sent next (a claim's lease while sending)."
    )
    claim = models.CharField(max_length=32, blank=True, editable=False)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    objects = NotificationQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["status", "due_at"], name="notification_due")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} for {self.user_id}: request {self.request_id}"
