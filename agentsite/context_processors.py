"""Values every page needs: which model serves, so the offline demo is never mistaken for AI."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from agentsite import providers


def agentsite(request: HttpRequest) -> dict[str, Any]:
    info = providers.provider_info()
    return {"model_provider": info, "offline_demo_model": info.offline}
