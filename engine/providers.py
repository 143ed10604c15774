"""Which model serves the agents.

- `OPENAI_BASE_URL` set: an OpenAI-compatible server (Ollama, vLLM, llama.cpp's server, ...),
  spoken to through Chat Completions, the API they all implement (or the Responses API, with
  `AGENTSITE_MODEL_API=responses`, for a server or proxy that speaks it). `OPENAI_API_KEY` is
  sent when set; most local servers need none, and a placeholder stands in.
- otherwise `OPENAI_API_KEY` set: OpenAI itself, through the Responses API.
- neither: the offline model named by `AGENTSITE_OFFLINE_MODEL` (the demo's scripted model by
  default), so the site works on a machine with no network. Named by a dotted path, so that
  nothing here imports the demo: a deployment without it sets a key or a base URL.

Online, an agent that names a model of its own (`Agent(model=...)`) gets it; every other agent
gets `AGENTSITE_MODEL`. The openai client retries a request that failed before its answer began
`AGENTSITE_MODEL_RETRIES` times (429 with its retry-after, 5xx, a dropped connection, a
timeout) and gives up on a model silent for `AGENTSITE_MODEL_TIMEOUT` seconds, before its
answer or in the middle of a stream. Settings are read on every call, so `override_settings`
and the pytest `settings` fixture take effect immediately.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
from agents import Agent, ModelSettings, RunConfig, handoff
from agents.models.interface import Model, ModelProvider
from agents.models.openai_provider import OpenAIProvider
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from openai import AsyncOpenAI

logger = logging.getLogger("engine.providers")

# Sent as the bearer token to servers that want none; the OpenAI client refuses to start without.
PLACEHOLDER_API_KEY = "not-needed"


# Seconds a connection to the model service may take, at most.
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class ProviderInfo:
    kind: str  # "openai" | "openai-compatible" | "offline-demo"
    model: str
    base_url: str | None
    api: str = "responses"  # "responses" | "chat_completions"; offline: unused

    @property
    def offline(self) -> bool:
        return self.kind == "offline-demo"

    def describe(self) -> str:
        """One line for people: what answers, where, and with which model. Never a secret."""
        api = "Responses API" if self.api == "responses" else "Chat Completions"
        if self.kind == "openai":
            return f"OpenAI ({api}), model {self.model}"
        if self.kind == "openai-compatible":
            return (
                f"an OpenAI-compatible server at {display_url(self.base_url or '')} "
                f"({api}), model {self.model}"
            )
        return (
            "the offline demo model (scripted, no network; set OPENAI_API_KEY or "
            "OPENAI_BASE_URL for a real model)"
        )


OFFLINE_MODEL_NAME = "offline-demo"


def offline_model_class() -> type[Model]:
    """The class `AGENTSITE_OFFLINE_MODEL` names.

    Raises:
        ImproperlyConfigured: it does not import, or is not an SDK `Model`.
    """
    path = settings.AGENTSITE_OFFLINE_MODEL
    try:
        model = import_string(path)
    except ImportError as error:
        raise ImproperlyConfigured(
            f"No model is configured: set OPENAI_API_KEY or OPENAI_BASE_URL, or point "
            f"AGENTSITE_OFFLINE_MODEL at an offline model ({path!r} does not import: {error})."
        ) from error
    if not (isinstance(model, type) and issubclass(model, Model)):
        raise ImproperlyConfigured(f"AGENTSITE_OFFLINE_MODEL = {path!r} is not an agents Model.")
    return model


def offline_examples(agent: Any, limit: int = 6) -> list[str]:
    """What a person can type to see `agent` act on the offline model (its optional
    `examples(tools, handoffs)`); none when a real model serves, or it offers none."""
    if not provider_info().offline:
        return []
    examples = getattr(offline_model_class(), "examples", None)
    if not callable(examples):
        return []
    tools = [tool for tool in getattr(agent, "tools", []) if getattr(tool, "name", "")]
    handoffs = [handoff(each) if isinstance(each, Agent) else each for each in agent.handoffs]
    return [str(example) for example in examples(tools, handoffs)][:limit]


class OfflineDemoProvider(ModelProvider):
    """Serves the offline model whatever model name an agent or run asks for."""

    def get_model(self, model_name: str | None) -> Model:
        return offline_model_class()()


def provider_info() -> ProviderInfo:
    """Which provider the current settings select. Cheap: no network, no client."""
    base_url = settings.OPENAI_BASE_URL.strip()
    api_key = settings.OPENAI_API_KEY.strip()
    model = settings.AGENTSITE_MODEL.strip()
    api = settings.AGENTSITE_MODEL_API
    if base_url:
        chosen = "chat_completions" if api == "auto" else api
        return ProviderInfo(kind="openai-compatible", model=model, base_url=base_url, api=chosen)
    if api_key:
        chosen = "responses" if api == "auto" else api
        return ProviderInfo(kind="openai", model=model, base_url=None, api=chosen)
    return ProviderInfo(kind="offline-demo", model=OFFLINE_MODEL_NAME, base_url=None)


def openai_client(info: ProviderInfo | None = None) -> AsyncOpenAI:
    """The openai client for the current settings: its key, base URL, retries and timeouts.

    Building one costs some 40 ms (its HTTP client, TLS context included), more than a whole
    turn of ours: on an event loop the client is kept and shared by the runs of that loop
    (its connections belong to it), as long as the settings it was built from hold."""
    info = info or provider_info()
    key = (
        settings.OPENAI_API_KEY.strip(),
        info.base_url or "",
        settings.AGENTSITE_MODEL_RETRIES,
        settings.AGENTSITE_MODEL_TIMEOUT,
    )
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return _new_client(*key)
    clients = _clients.setdefault(loop, {})
    client = clients.get(key)
    if client is None:
        clients.clear()  # the settings changed: the old client is not asked again
        client = clients[key] = _new_client(*key)
    return client


# The clients of each running loop, by the settings they were built from.
_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], AsyncOpenAI]
] = weakref.WeakKeyDictionary()


def _new_client(api_key: str, base_url: str, retries: int, timeout: float) -> AsyncOpenAI:
    return AsyncOpenAI(
        api_key=api_key or PLACEHOLDER_API_KEY,
        base_url=base_url or None,
        max_retries=retries,
        # `read` bounds the silence before the answer and between two pieces of a stream: a
        # stalled stream is cut, a long one that keeps coming is not.
        timeout=httpx2.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
    )


class DefaultModelProvider(ModelProvider):
    """The online provider: an agent's own model name, or `AGENTSITE_MODEL` for one that
    names none (`RunConfig.model` would override every agent's choice)."""

    def __init__(self, inner: ModelProvider, default_model: str) -> None:
        self.inner = inner
        self.default_model = default_model

    def get_model(self, model_name: str | None) -> Model:
        return self.inner.get_model(model_name or self.default_model)


def get_model_provider() -> ModelProvider:
    """The SDK model provider for the current settings."""
    info = provider_info()
    if info.offline:
        return OfflineDemoProvider()
    inner = OpenAIProvider(
        openai_client=openai_client(info),
        use_responses=info.api == "responses",
        # Local servers' streamed tool-call chunks are not all reliable; text still streams.
        buffer_streamed_tool_calls=info.kind == "openai-compatible",
    )
    return DefaultModelProvider(inner, info.model)


def run_config(**kwargs: Any) -> RunConfig:
    """The `RunConfig` for every run: the selected provider and, online, its model settings.

    Keyword arguments are passed to `RunConfig` and win over these defaults.
    """
    info = provider_info()
    options: dict[str, Any] = {"model_provider": get_model_provider()}
    if info.api == "chat_completions" and settings.AGENTSITE_MODEL_STREAM_USAGE:
        # OpenAI's own Chat Completions sends usage unasked; other servers only when asked.
        options["model_settings"] = ModelSettings(include_usage=True)
    options.update(kwargs)
    return RunConfig(**options)


def log_active_provider() -> ProviderInfo:
    """Log, once at startup or on demand, which model serves the agents."""
    info = provider_info()
    logger.info("Agents are served by %s [provider: %s]", info.describe(), info.kind)
    return info


def display_url(url: str) -> str:
    """`url` without credentials or query string, which may carry keys."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparseable URL)"
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
