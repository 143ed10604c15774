"""Short times for the inbox: "just now", "5 min ago", "expires in 23 h"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from common import formatting
from engine import facts

register = template.Library()

SOON_SECONDS = 3600


@register.filter
def ago(value: datetime | None) -> str:
    return formatting.ago(value)


@register.filter
def expires(value: datetime | None) -> str:
    return formatting.expires(value)


@register.filter
def expires_soon(value: datetime | None) -> bool:
    return value is not None and (value - timezone.now()).total_seconds() < SOON_SECONDS


@register.filter
def call_facts(approval: Any) -> list[tuple[str, str]]:
    """What the request's call would touch, for the user it runs for (`engine/facts.py`)."""
    return facts.for_request(approval)
