"""Short times for the inbox: "just now", "5 min ago", "expires in 23 h"."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone

register = template.Library()

SOON_SECONDS = 3600


def _span(seconds: int) -> str:
    if seconds < 3600:
        return f"{max(seconds // 60, 1)} min"
    if seconds < 86400:
        return f"{seconds // 3600} h"
    days = seconds // 86400
    return f"{days} day{'' if days == 1 else 's'}"


@register.filter
def ago(value: datetime | None) -> str:
    if value is None:
        return ""
    seconds = int((timezone.now() - value).total_seconds())
    return "just now" if seconds < 60 else f"{_span(seconds)} ago"


@register.filter
def expires(value: datetime | None) -> str:
    if value is None:
        return ""
    seconds = int((value - timezone.now()).total_seconds())
    return "expired" if seconds <= 0 else f"expires in {_span(seconds)}"


@register.filter
def expires_soon(value: datetime | None) -> bool:
    return value is not None and (value - timezone.now()).total_seconds() < SOON_SECONDS
