"""Webhook endpoints the operator registers, and the deliveries queued for them: an outbox,
written in the engine's own transactions (`webhooks/outbox.py`), sent by `delivery.py`."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.validators import URLValidator
from django.db import models
from django.utils import timezone

from common import signatures


class WebhookEvent(models.TextChoices):
    APPROVAL_CREATED = "approval.created", "approval.created: a call waits for a person"
    APPROVAL_DECIDED = "approval.decided", "approval.decided: a request was decided"
    APPROVAL_ESCALATED = (
        "approval.escalated",
        "approval.escalated: nobody decided in time; a second group is asked",
    )
    RUN_COMPLETED = "run.completed", "run.completed: a run finished with its answer"
    RUN_FAILED = "run.failed", "run.failed: a run ended without an answer"


def new_secret() -> str:
    """A signing secret, made by the site (never chosen by a person): `signatures.new_secret`."""
    return signatures.new_secret()


def new_event_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


class WebhookEndpoint(models.Model):
    name = models.CharField(max_length=100)
    url = models.URLField(
        "URL",
        max_length=500,
        validators=[URLValidator(schemes=["http", "https"])],
        help_text="Where each event is POSTed, http or https.",
    )
    events = models.JSONField(
        default=list, blank=True, help_text="The events this endpoint receives."
    )
    secret = models.CharField(
        max_length=100,
        default=new_secret,
        editable=False,
        help_text=(
            "Signs every delivery (Standard Webhooks: the webhook-signature header); rotate it "
            "in the list."
        ),
    )
    # A rotation's previous secret, which signs too until `previous_secret_until`.
    previous_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(
        default=True,
        help_text="Off: no event is queued for it, and what was queued waits until it is on.",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "pk"]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        # Never the secret: a repr ends up in logs and tracebacks.
        return f"<WebhookEndpoint {self.pk}: {self.name}>"

    def wants(self, event_type: str) -> bool:
        return self.enabled and event_type in (self.events or [])

    def rotate_secret(self, now: datetime | None = None) -> None:
        """A new secret; deliveries sent from now on are signed with it, and with the one it
        replaces until AGENTSITE_WEBHOOK_ROTATION_OVERLAP seconds have passed."""
        overlap = settings.AGENTSITE_WEBHOOK_ROTATION_OVERLAP
        self.previous_secret = self.secret if overlap > 0 else ""
        at = timezone.now() if now is None else now
        self.previous_secret_until = at + timedelta(seconds=overlap) if overlap > 0 else None
        self.secret = new_secret()
        self.save(update_fields=["secret", "previous_secret", "previous_secret_until", "updated"])

    def signing_secrets(self, now: datetime | None = None) -> tuple[str, ...]:
        """The secrets a delivery sent `now` is signed with: the current one first."""
        at = timezone.now() if now is None else now
        until = self.previous_secret_until
        if self.previous_secret and until is not None and at < until:
            return (self.secret, self.previous_secret)
        return (self.secret,)

    @property
    def signs_the_older_way(self) -> bool:
        """Whether the secret predates Standard Webhooks (docs/webhooks.md)."""
        return not signatures.is_standard(self.secret)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERING = "delivering"
    DELIVERED = "delivered"
    FAILED = "failed"


class WebhookDeliveryQuerySet(models.QuerySet["WebhookDelivery"]):
    def due(self, now: datetime | None = None) -> WebhookDeliveryQuerySet:
        """Deliveries to attempt now: pending and due, or claimed by a process whose lease
        ran out (it died mid-attempt), of an endpoint that is on."""
        return self.filter(
            status__in=(DeliveryStatus.PENDING, DeliveryStatus.DELIVERING),
            next_attempt_at__lte=now or timezone.now(),
            endpoint__enabled=True,
        )


class WebhookDelivery(models.Model):
    # No constraint in the database: the row is written in the engine's transaction, and an
    # endpoint deleted meanwhile by another process must not fail the engine's commit (a
    # deferred foreign key check would). Deleted through Django, its deliveries go with it;
    # an orphan is never claimed (the claim joins the endpoint).
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries", db_constraint=False
    )
    event_type = models.CharField(max_length=40, choices=WebhookEvent.choices)
    event_id = models.CharField(
        max_length=64,
        unique=True,
        default=new_event_id,
        help_text="Sent as Agentsite-Delivery and in the body; the same on every retry and "
        "replay, so receivers can drop what they already had.",
    )
    payload = models.JSONField()
    status = models.CharField(
        max_length=20, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0, help_text="Every attempt, replays too.")
    replays = models.PositiveIntegerField(default=0)
    replay_from = models.PositiveIntegerField(
        default=0, help_text="Attempts made before the last replay (retries count from there)."
    )
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_response_ms = models.PositiveIntegerField("last response time (ms)", null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = WebhookDeliveryQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-pk"]
        verbose_name_plural = "webhook deliveries"
        permissions = [("replay_webhookdelivery", "Can replay a webhook delivery")]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="webhook_due")]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_id}"

    def body(self) -> bytes:
        """What is POSTed, the same bytes on every attempt (keys sorted: PostgreSQL's jsonb
        keeps no order of its own)."""
        return encode(self.payload)

    @property
    def retries_used(self) -> int:
        return self.attempts - self.replay_from


def encode(payload: Any) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class WebhookAttempt(models.Model):
    """One attempt of a delivery, as it went (append-only)."""

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    replay = models.BooleanField(default=False, help_text="The first attempt after a replay.")
    started = models.DateTimeField()
    response_code = models.PositiveSmallIntegerField(null=True, blank=True)
    response_ms = models.PositiveIntegerField("response time (ms)", null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number}"
