"""A reviewer's email settings, and where an email's link lands.

The landing page only checks the link and sends its reader on to the request's page (through
the login page first, when she is not logged in): a GET never decides anything, whoever
follows it (a mail scanner does); the reviewer decides there, with the page's own POST."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_safe

from approvals.models import ApprovalRequest
from engine.permissions import allowed_only, is_reviewer
from notifications import links
from notifications.forms import PreferenceForm
from notifications.models import NotificationPreference

reviewer_required = allowed_only(is_reviewer, "Only reviewers can be emailed about requests.")


def _owner(request: HttpRequest) -> Any:
    """The signed-in user (the views are `login_required`)."""
    return request.user


def _get_preference_for_user(request: HttpRequest) -> NotificationPreference:
    """The signed-in reviewer's settings, made (off) the first time she opens them (the view
    is `login_required`)."""
    preference, _ = NotificationPreference.objects.get_or_create(user=_owner(request))
    return preference


@require_http_methods(["GET", "POST"])
@login_required
@reviewer_required
def notification_settings(request: HttpRequest) -> HttpResponse:
    preference = _get_preference_for_user(request)
    form = PreferenceForm(request.POST or None, instance=preference)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, "Saved your email settings.")
        return HttpResponseRedirect(reverse("notification_settings"))
    pairs = set(ApprovalRequest.objects.order_by().values_list("agent_name", "tool_name")[:500])
    context = {
        "form": form,
        "preference": preference,
        "no_address": not preference.user.email,
        "known_agents": sorted({agent for agent, _ in pairs}),
        "known_tools": sorted({tool for _, tool in pairs}),
        "tab": "notifications",
    }
    status = 400 if request.method == "POST" else 200
    return render(request, "notifications/settings.html", context, status=status)


def _refused(request: HttpRequest, status: int, message: str) -> HttpResponse:
    return render(request, "notifications/link_refused.html", {"message": message}, status=status)


@never_cache
@require_safe
def open_link(request: HttpRequest) -> HttpResponse:
    """An email's link: checked, then on to its request's page. Writes nothing.

    Someone signed in who may not decide is told so first, whatever the link: every link
    leads to a reviewer's page, which she cannot open (an email forwarded to her, or sent
    while she was a reviewer)."""
    if request.user.is_authenticated and not is_reviewer(request.user):
        return _refused(
            request,
            403,
            "This request is for reviewers, and your account may not decide tool calls. "
            "Ask an administrator if it should.",
        )
    try:
        link = links.read(request.GET.get("t", ""))
    except links.LinkRefused as refusal:
        return _refused(request, refusal.status, str(refusal))
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if request.user.pk != link.user_id:
        return _refused(
            request,
            403,
            "This link was sent to another person. Log out and in as them, or open the inbox.",
        )
    return HttpResponseRedirect(reverse("inbox_request", args=[link.request_id]))
