"""The inbox's filters: short times ("5 min ago", "expires in 23 h"), what a call is for
people (`explained`), and who may not approve it (`needs_another_reviewer`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

from approvals import explain
from common import formatting
from engine import facts, runs

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
def call_facts(approval: Any) -> list[facts.Fact] | None:
    """What the request's call would touch, for the user it runs for (`engine/facts.py`)."""
    return facts.for_request(approval)


@register.filter
def explained(approval: Any) -> explain.Explanation:
    """The request's call for people: description, risk, arguments, facts (`explain.py`)."""
    return explain.for_request(approval)


@register.filter
def needs_another_reviewer(approval: Any, user: Any) -> bool:
    """Whether `user` started the request's conversation and so may not approve it."""
    return runs.needs_another_reviewer(approval, user if getattr(user, "pk", None) else None)
