"""Each signed-in user's API tokens: create one (its secret shown once, on the answer to
the POST that made it), list them, revoke one. The API itself is `endpoints.py`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from api.forms import MAX_TOKENS, TokenForm
from api.models import ApiToken


def _owner(request: HttpRequest) -> Any:
    """The signed-in user (the views are `login_required`)."""
    return request.user


def _get_token_for_user(request: HttpRequest, pk: int) -> ApiToken:
    """The user's own token; another's is a 404, as one that does not exist."""
    return get_object_or_404(ApiToken.objects.filter(user=_owner(request)), pk=pk)


@never_cache  # the answer to a creation holds the secret
@require_http_methods(["GET", "POST"])
@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    secret = None
    status = 200
    if request.method == "POST":
        if ApiToken.objects.filter(user=_owner(request), revoked_at__isnull=True).count() >= (
            MAX_TOKENS
        ):
            form.add_error(None, f"You have {MAX_TOKENS} tokens: revoke one first.")
        if form.is_valid():
            days = form.cleaned_data["expires_in_days"]
            token, secret = ApiToken.issue(
                request.user,
                form.cleaned_data["name"],
                form.cleaned_data["scope"],
                expires_at=timezone.now() + timedelta(days=days) if days else None,
            )
            form = TokenForm()
            status = 201
        else:
            status = 400
    context = {
        "form": form,
        "secret": secret,
        "tokens": ApiToken.objects.filter(user=_owner(request)),
        "now": timezone.now(),
        "tab": "tokens",
    }
    return render(request, "api/tokens.html", context, status=status)


@require_POST
@login_required
def revoke_token(request: HttpRequest, pk: int) -> HttpResponse:
    token = _get_token_for_user(request, pk)
    token.revoke()
    messages.success(request, f"Revoked the token {token.name} ({token.prefix}…).")
    return HttpResponseRedirect(reverse("api_tokens"))
