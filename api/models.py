"""Per-user API tokens: a random secret shown once, stored only as its SHA-256.

A token reads `agt_<43 url-safe characters>` (32 random bytes). Its first 12 characters are
kept in clear as its visible prefix (to tell tokens apart, and to find the row); the whole
token only as a hash, compared in constant time. A random 256-bit secret needs no slow
password hash: nobody can guess one from its SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "agt_"
TOKEN_PATTERN = re.compile(r"agt_[A-Za-z0-9_-]{43}")
VISIBLE_CHARS = 12
# How often a token's `last_used` is written at most: a busy client does not write per call.
LAST_USED_EVERY = timedelta(minutes=1)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Scope(models.TextChoices):
    READ = "read", "Read"
    DECIDE = "decide", "Read and decide"


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def usable(self, now: datetime | None = None) -> ApiTokenQuerySet:
        """Not revoked, not expired, of an active user."""
        now = now or timezone.now()
        return self.filter(revoked_at__isnull=True, user__is_active=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )

    def find(self, token: str) -> ApiToken | None:
        """The usable token `token` is, or None (unknown, malformed, revoked, expired, or its
        user deactivated)."""
        if not TOKEN_PATTERN.fullmatch(token):
            return None
        wanted = token_hash(token)
        candidates = self.usable().select_related("user").filter(prefix=token[:VISIBLE_CHARS])
        for candidate in candidates:
            if hmac.compare_digest(candidate.token_hash, wanted):
                return candidate
        return None


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text="What the token is for, for its owner.")
    scope = models.CharField(
        max_length=10,
        choices=Scope.choices,
        default=Scope.READ,
        help_text="Read: GET only. Read and decide: also decisions and new runs.",
    )
    prefix = models.CharField(max_length=VISIBLE_CHARS, db_index=True, editable=False)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        verbose_name = "API token"
        ordering = ["-created", "-pk"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def issue(cls, user: Any, name: str, scope: str, **kwargs: Any) -> tuple[ApiToken, str]:
        """A new token of `user` and its secret, which is not stored: show it once."""
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user,
            name=name,
            scope=scope,
            prefix=secret[:VISIBLE_CHARS],
            token_hash=token_hash(secret),
            **kwargs,
        )
        return token, secret

    @property
    def scopes(self) -> list[str]:
        return [Scope.READ, Scope.DECIDE] if self.scope == Scope.DECIDE else [Scope.READ]

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    def revoke(self) -> None:
        """Revoked once, at the first time asked."""
        now = timezone.now()
        ApiToken.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=now)
        self.revoked_at = self.revoked_at or now

    def touch(self) -> None:
        """Note a use, at most once per LAST_USED_EVERY."""
        now = timezone.now()
        if self.last_used is not None and now - self.last_used < LAST_USED_EVERY:
            return
        ApiToken.objects.filter(pk=self.pk).filter(
            models.Q(last_used__isnull=True) | models.Q(last_used__lt=now - LAST_USED_EVERY)
        ).update(last_used=now)
        self.last_used = now
