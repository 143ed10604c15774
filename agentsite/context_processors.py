"""Values every page needs: which model serves, so the offline demo is never mistaken for AI."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from engine import providers
from engine.permissions import can_view_traces, is_reviewer


def agentsite(request: HttpRequest) -> dict[str, Any]:
    info = providers.provider_info()
    user = getattr(request, "user", None)
    return {
        "model_provider": info,
        "offline_demo_model": info.offline,
        "is_reviewer": is_reviewer(user),
        "can_view_traces": can_view_traces(user),
    }
