"""Values every page needs: which model serves, so the offline demo is never mistaken for AI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest

from engine import providers
from engine.permissions import can_manage_policies, can_view_traces, is_reviewer


class Lazy:
    """A yes or no asked of `check(user)` only when a template tests it, then kept: a
    fragment that shows no menu (the chat composer a POST answers with) asks no permission
    query, and a page that tests it twice asks once."""

    __slots__ = ("_answer", "_check", "_user")

    def __init__(self, check: Callable[[Any], bool], user: Any) -> None:
        self._check, self._user = check, user
        self._answer: bool | None = None

    def __bool__(self) -> bool:
        if self._answer is None:
            self._answer = bool(self._check(self._user))
        return self._answer

    def __eq__(self, other: object) -> bool:
        return bool(self) == other

    def __hash__(self) -> int:
        return hash(bool(self))

    def __repr__(self) -> str:
        return repr(bool(self))


def agentsite(request: HttpRequest) -> dict[str, Any]:
    info = providers.provider_info()
    user = getattr(request, "user", None)
    return {
        "model_provider": info,
        "offline_demo_model": info.offline,
        "is_reviewer": Lazy(is_reviewer, user),
        "can_view_traces": Lazy(can_view_traces, user),
        "can_manage_policies": Lazy(can_manage_policies, user),
    }
