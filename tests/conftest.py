"""Shared fixtures. The autouse guard makes any attempt to reach a real model fail the test."""

from __future__ import annotations

from typing import Any

import pytest


class RealModelCalled(AssertionError):
    pass


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise RealModelCalled("a test tried to reach a real model; use ScriptedModel or the demo model")


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Agents in tests run on ScriptedModel or the offline demo model, never on a network."""
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    for cls in (OpenAIResponsesModel, OpenAIChatCompletionsModel):
        monkeypatch.setattr(cls, "get_response", _refuse)
        monkeypatch.setattr(cls, "stream_response", _refuse)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = ""
    # The SDK's default exporter would try to upload traces to OpenAI.
    from agents import set_tracing_export_api_key

    set_tracing_export_api_key("")


@pytest.fixture(autouse=True, scope="session")
def no_trace_upload() -> None:
    """Nothing in a test run is uploaded to OpenAI's trace dashboard."""
    from agents import set_trace_processors

    set_trace_processors([])


@pytest.fixture(autouse=True)
def plain_static_storage(settings: Any) -> None:
    """Pages render without `collectstatic` having built a manifest."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


from tests.live import browser, live_site, page  # noqa: E402,F401  (fixtures)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Any:
    """On PostgreSQL, end the worker threads' connections so the test database can drop."""
    yield
    from django.db import connection

    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
