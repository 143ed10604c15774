"""Endpoints are the operator's (editable; their secret read-only and rotated by an action);
deliveries and their attempts are the site's record (read-only), replayed by an action."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import F, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString

from common import destinations, formatting
from common.admin import ReadOnlyAdminMixin, pretty_json
from webhooks import delivery
from webhooks.models import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)


class WebhookEndpointForm(forms.ModelForm):
    events = forms.MultipleChoiceField(
        choices=WebhookEvent.choices, widget=forms.CheckboxSelectMultiple, required=False
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "events", "enabled"]

    def clean_url(self) -> str:
        # Advice at once; each send checks the address it connects to again.
        url: str = self.cleaned_data["url"]
        refused = destinations.refusal_for_url(url)
        if refused:
            raise forms.ValidationError(refused)
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ["name", "url", "event_list", "enabled", "updated"]
    list_filter = ["enabled"]
    search_fields = ["name", "url"]
    readonly_fields = ["secret", "signing", "created", "updated"]
    actions = ["rotate_secret"]

    @admin.display(description="signing")
    def signing(self, endpoint: WebhookEndpoint) -> str:
        if endpoint.pk is None:
            return "Standard Webhooks"
        if endpoint.signs_the_older_way:
            scheme = (
                "An older secret: deliveries carry Agentsite-Signature as well. Rotate it to "
                "verify with a Standard Webhooks library (docs/webhooks.md)."
            )
        else:
            scheme = "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)."
        if len(endpoint.signing_secrets()) > 1:
            assert endpoint.previous_secret_until is not None
            until = timezone.localtime(endpoint.previous_secret_until)
            scheme += f" The previous secret signs too until {until:%Y-%m-%d %H:%M %Z}."
        return scheme

    @admin.display(description="events")
    def event_list(self, endpoint: WebhookEndpoint) -> str:
        return ", ".join(endpoint.events or []) or "-"

    @admin.action(description="Rotate the secret of the selected endpoints", permissions=["change"])
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            endpoint.rotate_secret()
            self.log_change(request, endpoint, "Rotated the signing secret.")
        overlap = settings.AGENTSITE_WEBHOOK_ROTATION_OVERLAP
        lasting = formatting.span_in_words(timedelta(seconds=overlap))
        also = (
            f", and with the previous one for {lasting}"
            if overlap > 0
            else " (and no longer with the previous one)"
        )
        self.message_user(
            request,
            f"New secret for {queryset.count()} endpoint(s): deliveries are signed with it from "
            f"now on{also}. Give it to the receiver.",
            messages.SUCCESS,
        )


class WebhookAttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    fields = readonly_fields = (
        "number",
        "replay",
        "started",
        "response_code",
        "response_ms",
        "error",
    )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = [
        "event_id",
        "event_type",
        "endpoint",
        "status",
        "attempts",
        "last_response_code",
        "next_attempt_at",
        "created",
    ]
    list_filter = ["status", "event_type", "endpoint"]
    search_fields = ["event_id"]
    date_hierarchy = "created"
    list_select_related = ["endpoint"]
    fields = readonly_fields = (
        "endpoint",
        "event_type",
        "event_id",
        "status",
        "attempts",
        "replays",
        "next_attempt_at",
        "last_attempt_at",
        "last_response_code",
        "last_response_ms",
        "last_error",
        "created",
        "delivered_at",
        "shown_payload",
    )
    inlines = [WebhookAttemptInline]
    actions = ["replay"]

    @admin.display(description="payload")
    def shown_payload(self, row: WebhookDelivery) -> SafeString | str:
        return pretty_json(row.payload)

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("webhooks.replay_webhookdelivery")

    @admin.action(description="Replay the selected deliveries", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        """Another attempt of the same payload and event id, now, with a fresh round of
        retries; one being sent is left alone."""
        now = timezone.now()
        with transaction.atomic():
            chosen = queryset.exclude(status=DeliveryStatus.DELIVERING)
            replayed = list(chosen.values_list("pk", flat=True))
            WebhookDelivery.objects.filter(pk__in=replayed).update(
                status=DeliveryStatus.PENDING,
                next_attempt_at=now,
                replay_from=F("attempts"),
                replays=F("replays") + 1,
            )
            for row in WebhookDelivery.objects.filter(pk__in=replayed):
                self.log_change(request, row, "Replayed.")
            delivery.announce()
        skipped = queryset.count() - len(replayed)
        self.message_user(
            request,
            f"Replaying {len(replayed)} delivery(ies) with their event ids."
            + (f" {skipped} being sent now were left alone." if skipped else ""),
            messages.SUCCESS,
        )
