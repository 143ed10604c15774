from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from agentsite import agents
from agentsite.permissions import is_reviewer


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Reviewers go to their inbox, everyone else to their chats; visitors see what this is."""
    if request.user.is_authenticated:
        return redirect("inbox" if is_reviewer(request.user) else "chats")
    return render(request, "conversations/home.html", {"agent_names": agents.agent_names()})


def chats(request: HttpRequest) -> HttpResponse:
    return HttpResponse("The chats are being built.")
