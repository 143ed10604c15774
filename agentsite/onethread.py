"""`one_thread`: the last middleware, so that Django runs a request's whole middleware chain in
one thread under ASGI.

Django builds an ASGI handler's chain from the view outwards and keeps each middleware async
while it can. Its own middlewares are `MiddlewareMixin`s, which in async mode run each
`process_request` and `process_response` through `sync_to_async`: two thread hops per
middleware, each copying every context variable of the request back and forth (asgiref's
`_restore_context`, about forty of them with Django's `Local`s). Measured through
`ASGIHandler` with this site's middleware, an empty view cost 5.3–5.7 ms of CPU a request,
most of it those hops (issue 28, `docs/benchmarks.md`).

A middleware that cannot run async, last in `MIDDLEWARE`, turns the chain sync from the view
outwards: Django enters it once (one hop to a thread) and runs every middleware and the view
there, as under WSGI. The same empty view then costs 2.4–2.8 ms. No view of the site is
async; one that were would still be awaited (Django adapts it once, below this middleware).
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse


def one_thread(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[[HttpRequest], HttpResponse]:
    def middleware(request: HttpRequest) -> HttpResponse:
        return get_response(request)

    return middleware


one_thread.sync_capable = True  # type: ignore[attr-defined]
one_thread.async_capable = False  # type: ignore[attr-defined]
