from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks

IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Run engine"

    def ready(self) -> None:
        checks.register(check_shared_channel_layer)
        # The composition root: the executor knows nothing of the engine; it is handed the
        # engine's job runner, the task enqueuer and the sweeper here, once.
        from engine import access, events, executor, runs, sweeper, tasks
        from tracing import exporter

        executor.configure(runner=runs.run_job, enqueue=tasks.enqueue, on_server_loop=sweeper.start)
        # The exporter knows nothing of the channel layer: the engine tells the pages.
        exporter.on_stored(events.traces_stored)
        # A user's open sockets hear of her logout and of changes to her permissions.
        access.connect_signals()


def check_shared_channel_layer(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The tasks executor runs turns in `db_worker` processes: their text, pauses and ends reach
    the open pages only through a channel layer that every process shares."""
    if settings.AGENTSITE_EXECUTOR != "tasks":
        return []
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    if backend != IN_MEMORY_LAYER:
        return []
    return [
        checks.Error(
            "AGENTSITE_EXECUTOR=tasks needs a channel layer that every process shares: with the "
            "in-memory layer, replies that workers stream never reach the open pages.",
            hint="Set REDIS_URL (redis://127.0.0.1:6379/0), or use AGENTSITE_EXECUTOR=inprocess.",
            id="engine.E001",
        )
    ]
