"""Logging in: the page a throttled login gets, and the answer an htmx request gets when its
session has ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django_htmx.http import HttpResponseClientRedirect


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: Any
) -> HttpResponse:
    """django-axes' AXES_LOCKOUT_CALLABLE: the lockout page, in the site's layout, saying how
    long logging in is paused. 429, like axes' own response."""
    cool_off = get_cool_off(request)
    minutes = max(1, round(cool_off.total_seconds() / 60)) if cool_off else None
    return render(request, "registration/lockout.html", {"minutes": minutes}, status=429)


def htmx_login_redirect(get_response: Callable[[HttpRequest], Any]) -> Callable[..., Any]:
    """Middleware: an htmx request that `login_required` sends to the login page (its session
    ended, say by a logout in another tab) gets `HX-Redirect` instead of a 302, which htmx
    would follow and swap the whole login page into the element that made the request. The
    browser goes to the login page, whose `next` is the page the request came from."""
    login_path = urlsplit(resolve_url(settings.LOGIN_URL)).path

    def client_redirect(request: HttpRequest, response: HttpResponse) -> HttpResponse:
        htmx = getattr(request, "htmx", None)
        if not htmx or response.status_code != 302:
            return response
        if urlsplit(response["Location"]).path != login_path:
            return response
        # django-htmx gives the current URL only when it is on this same site.
        next_url = htmx.current_url_abs_path or request.get_full_path()
        return HttpResponseClientRedirect(redirect_to_login(next_url)["Location"])

    if iscoroutinefunction(get_response):

        async def amiddleware(request: HttpRequest) -> HttpResponse:
            return client_redirect(request, await get_response(request))

        return markcoroutinefunction(amiddleware)

    def middleware(request: HttpRequest) -> HttpResponse:
        return client_redirect(request, get_response(request))

    return middleware


htmx_login_redirect.sync_capable = True  # type: ignore[attr-defined]
htmx_login_redirect.async_capable = True  # type: ignore[attr-defined]
