"""Logging in: the page a throttled login gets, and the answer an htmx request gets when its
session has ended."""

from __future__ import annotations

from typing import Any

from axes.helpers import get_cool_off
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any
) -> HttpResponse:
    """django-axes' AXES_LOCKOUT_CALLABLE: the lockout page, in the site's layout, saying how
    long logging in is paused. 429, like axes' own response."""
    cool_off = get_cool_off(request)
    minutes = max(1, round(cool_off.total_seconds() / 60)) if cool_off else None
    return render(request, "registration/lockout.html", {"minutes": minutes}, status=429)
