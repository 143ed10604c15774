"""The engine's system checks."""

from __future__ import annotations

from typing import Any

from engine.apps import check_shared_channel_layer

REDIS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer"}}
IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def test_it_refuses_the_tasks_executor_without_a_shared_channel_layer(settings: Any) -> None:
    settings.AGENTSITE_EXECUTOR = "tasks"
    settings.CHANNEL_LAYERS = IN_MEMORY
    [error] = check_shared_channel_layer()
    assert error.id == "engine.E001"
    assert "REDIS_URL" in (error.hint or "")


def test_it_accepts_the_tasks_executor_on_redis(settings: Any) -> None:
    settings.AGENTSITE_EXECUTOR = "tasks"
    settings.CHANNEL_LAYERS = REDIS
    assert check_shared_channel_layer() == []


def test_the_inprocess_executor_needs_no_shared_layer(settings: Any) -> None:
    settings.AGENTSITE_EXECUTOR = "inprocess"
    settings.CHANNEL_LAYERS = IN_MEMORY
    assert check_shared_channel_layer() == []
