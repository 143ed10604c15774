"""Template helpers of the cost page."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def thousands(value: Any) -> str:
    """A count with thousands separators: 12,345."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)
