"""Each reviewer's email settings (editable), and the notifications queued for them (the
site's record, read-only)."""

from __future__ import annotations

from django.contrib import admin

from common.admin import ReadOnlyAdminMixin
from notifications.models import Notification, NotificationPreference


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(admin.ModelAdmin):
    list_display = ["user", "mode", "digest_minutes", "agents", "tools", "updated"]
    list_filter = ["mode", "digest_minutes"]
    search_fields = ["user__username", "user__email"]
    raw_id_fields = ["user"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["pk", "kind", "user", "request", "digest", "status", "attempts", "due_at"]
    list_filter = ["status", "kind", "digest"]
    search_fields = ["user__username"]
    list_select_related = ["user", "request"]
    fields = readonly_fields = (
        "kind",
        "user",
        "request",
        "group_name",
        "digest",
        "status",
        "attempts",
        "due_at",
        "last_error",
        "created",
        "sent_at",
    )
