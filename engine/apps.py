from __future__ import annotations

from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Run engine"

    def ready(self) -> None:
        # The composition root: the executor knows nothing of the engine; it is handed the
        # engine's job runner, the task enqueuer and the sweeper here, once.
        from engine import access, events, executor, runs, sweeper, tasks
        from tracing import exporter

        executor.configure(runner=runs.run_job, enqueue=tasks.enqueue, on_server_loop=sweeper.start)
        # The exporter knows nothing of the channel layer: the engine tells the pages.
        exporter.on_stored(events.traces_stored)
        # A user's open sockets hear of her logout and of changes to her permissions.
        access.connect_signals()
