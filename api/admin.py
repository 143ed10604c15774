"""Staff see every user's API tokens and revoke them; nobody sees a secret here (none is
stored), and tokens are created by their users on /account/tokens/."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from api.models import ApiToken
from common.admin import NoEditAdminMixin


@admin.register(ApiToken)
class ApiTokenAdmin(NoEditAdminMixin, admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "scope", "created", "last_used", "state")
    list_filter = ("scope", "revoked_at")
    search_fields = ("name", "prefix", "user__username")
    fields = ("user", "name", "scope", "prefix", "created", "last_used", "expires_at", "revoked_at")
    readonly_fields = fields
    actions = ["revoke"]

    @admin.display(description="state")
    def state(self, token: ApiToken) -> str:
        if token.is_revoked:
            return "revoked"
        if token.is_expired():
            return "expired"
        return "active" if token.user.is_active else "user deactivated"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiToken]:
        return super().get_queryset(request).select_related("user")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).", messages.SUCCESS)

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        # Revoking is a change of the row; NoEditAdminMixin keeps the change form away.
        return request.user.has_perm("api.change_apitoken")
