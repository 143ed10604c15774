from __future__ import annotations

from django.http import HttpRequest, HttpResponse


def inbox(request: HttpRequest) -> HttpResponse:
    return HttpResponse("The inbox is being built.")
