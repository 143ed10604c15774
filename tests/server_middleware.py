"""Middleware of the browser tests' daphne server alone (tests/settings.py adds it there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.contenttypes.models import ContentType


def forget_content_types(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Each request reads content types anew. The server outlives the tests' databases: a
    transactional test's flush deletes the content types and post_migrate makes them again
    under new ids, so a cached id written by a later test (an admin history row) broke its
    foreign key ("FOREIGN KEY constraint failed" creating a policy after the admin was
    audited). A deployment never flushes; only this server needs it."""

    def middleware(request: Any) -> Any:
        ContentType.objects.clear_cache()
        return get_response(request)

    return middleware
