"""Bodies beyond the upload limit (`DATA_UPLOAD_MAX_MEMORY_SIZE`) get the API's own answer, a
JSON 413 that says the limit, on every operation and method, before anything reads them:
Django would refuse reading one with `RequestDataTooBig`, which the API's framework does not
turn into an answer of its own (a 500), and an operation without a body would not read it
at all. A body sent without its length is refused the same way when read
(`endpoints._too_large`)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

PREFIX = "/api/"


def too_large(limit: int, size: int | None = None) -> JsonResponse:
    sent = f" is {size:,} bytes;" if size is not None else " is too large:"
    return JsonResponse(
        {
            "detail": f"The request body{sent} the API takes at most {limit:,} bytes.",
            "code": "too_large",
            "limit": limit,
        },
        status=413,
    )


def body_limit(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[[HttpRequest], HttpResponse]:
    def middleware(request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and request.path.startswith(PREFIX):
            length = request.META.get("CONTENT_LENGTH") or ""
            if length.isdigit() and int(length) > limit:
                return too_large(limit, int(length))
        return get_response(request)

    return middleware


# Sync, as every middleware of the chain (agentsite/onethread.py).
body_limit.sync_capable = True  # type: ignore[attr-defined]
body_limit.async_capable = False  # type: ignore[attr-defined]
