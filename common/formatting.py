"""Times and text as the site writes them for people, each way written once.

The chat list, the inbox, the trace viewer, the admin and the run engine (the message an
expired request leaves for the model) all format here. Nothing here imports the project, so
any module may use it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.utils import timezone
from django.utils.timesince import timesince


def short_span(seconds: int) -> str:
    """A span of time in a few characters: 5 min, 23 h, 2 days (a minute at least)."""
    if seconds < 3600:
        return f"{max(seconds // 60, 1)} min"
    if seconds < 86400:
        return f"{seconds // 3600} h"
    days = seconds // 86400
    return f"{days} day{'' if days == 1 else 's'}"


def ago(when: datetime | None, *, detailed: bool = False) -> str:
    """Under a minute "just now", else "5 min ago"; `detailed`: Django's timesince,
    "2 hours, 5 minutes ago"."""
    if when is None:
        return ""
    seconds = int((timezone.now() - when).total_seconds())
    if seconds < 60:
        return "just now"
    return f"{timesince(when) if detailed else short_span(seconds)} ago"


def expires(when: datetime | None) -> str:
    """Before it: "expires in 23 h"; after: "expired"."""
    if when is None:
        return ""
    seconds = int((when - timezone.now()).total_seconds())
    return "expired" if seconds <= 0 else f"expires in {short_span(seconds)}"


def span_in_words(delta: timedelta) -> str:
    """A span of time in a sentence: 45 minutes, 2 hours, 1.5 hours (a minute at least)."""
    seconds = max(int(delta.total_seconds()), 0)
    if seconds >= 3600:
        hours = seconds / 3600
        return (
            f"{hours:g} hour{'s' if hours != 1 else ''}"
            if hours == int(hours)
            else f"{hours:.1f} hours"
        )
    minutes = max(seconds // 60, 1)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def duration(seconds: float | None) -> str:
    """A measured duration as people read it: 0.4 ms, 85 ms, 1.24 s, 2 min 05 s, 3 h 12 min."""
    if seconds is None:
        return "—"
    if seconds < 0:
        seconds = 0.0
    if seconds < 0.001:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        minutes, rest = divmod(int(round(seconds)), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(int(round(seconds)), 3600)
    if hours < 48:
        return f"{hours} h {rest // 60:02d} min"
    return f"{hours // 24} days"


def time_limit_ms(value: Any) -> str:
    """A time limit given in milliseconds (a shell call's timeout), as people read it: "60 s",
    "1,500 ms"; "" when there is none."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return ""
    if value % 1000 == 0:
        return f"{int(value) // 1000:,} s"
    return f"{value:,g} ms"


def exact_seconds(seconds: float | None) -> str:
    """A duration to the millisecond, for the admin: 1.234 s."""
    return "-" if seconds is None else f"{seconds:.3f} s"


def preview(text: str, limit: int) -> str:
    """The text on one line, cut to `limit` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


CURRENCY_SIGNS = {"USD": "$", "EUR": "€", "GBP": "£"}


def money(value: Any, currency: str) -> str | None:
    """`value` as an amount of `currency` ("$1,234.50"), or None when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        amount = Decimal(str(value))
    except ArithmeticError:
        return None
    if not amount.is_finite() or (isinstance(value, float) and not math.isfinite(value)):
        return None
    cents = amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
    sign = CURRENCY_SIGNS.get(currency)
    text = f"{abs(cents):,.2f}"
    minus = "-" if cents < 0 else ""
    return f"{minus}{sign}{text}" if sign else f"{minus}{text} {currency}"
