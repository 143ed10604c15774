from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Run engine"

    def ready(self) -> None:
        checks.register(check_shared_channel_layer)
        checks.register(check_agents)
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
    """The tasks executor runs turns in task worker processes (`run_worker`): their text,
    pauses and ends reach the open pages only through a channel layer that every process
    shares."""
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


def check_agents(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every registered agent imports, and it and every agent reachable from it (handoffs,
    agents used as tools) name a model and model settings a model service accepts, whether
    their code declares them or AGENTSITE_AGENTS does: refused at start, not at a user's turn."""
    from engine import registry

    try:
        names = registry.agent_names()
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="engine.E002")]
    errors: list[checks.CheckMessage] = [
        checks.Error(problem, id="engine.E002")
        for problem in (registry.entry_problem(name) for name in names)
        if problem
    ]
    if errors:
        # Every agent waits for every entry's settings: nothing more to learn from them.
        return errors
    for name in names:
        try:
            agent = registry.get_agent(name)
        except ImproperlyConfigured as error:
            # One entry failing to import fails every agent: say it once.
            if all(str(error) != said.msg for said in errors):
                errors.append(checks.Error(str(error), id="engine.E002"))
            continue
        errors.extend(
            checks.Error(
                f"AGENTSITE_AGENTS[{name!r}]: {problem}.",
                hint=(
                    "temperature takes 0..2, top_p 0..1, frequency_penalty and presence_penalty "
                    "-2..2, max_tokens a whole number above 0, parallel_tool_calls true or "
                    "false; a model is a non-empty name."
                ),
                id="engine.E003",
            )
            for problem in registry.agent_problems(agent)
        )
    return errors
