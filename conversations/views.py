from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agentsite import agents


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    conversations = []
    if request.user.is_authenticated:
        conversations = list(request.user.conversations.order_by("-updated")[:10])
    return render(
        request,
        "conversations/home.html",
        {"conversations": conversations, "agent_names": agents.agent_names()},
    )


def chats(request: HttpRequest) -> HttpResponse:
    return HttpResponse("The chats are being built.")
