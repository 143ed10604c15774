"""Which model serves the agents.

- `OPENAI_BASE_URL` set: an OpenAI-compatible server (Ollama, vLLM, llama.cpp's server, ...),
  spoken to through Chat Completions, the API they all implement. `OPENAI_API_KEY` is sent when
  set; most local servers need none, and a placeholder stands in.
- otherwise `OPENAI_API_KEY` set: OpenAI itself, through the Responses API.
- neither: the offline model named by `AGENTSITE_OFFLINE_MODEL` (the demo's scripted model by
  default), so the site works on a machine with no network. Named by a dotted path, so that
  nothing here imports the demo: a deployment without it sets a key or a base URL.

The model name is `AGENTSITE_MODEL` in both online cases. Settings are read on every call, so
`override_settings` and the pytest `settings` fixture take effect immediately.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agents import RunConfig
from agents.models.interface import Model, ModelProvider
from agents.models.openai_provider import OpenAIProvider
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

logger = logging.getLogger("engine.providers")

# Sent as the bearer token to servers that want none; the OpenAI client refuses to start without.
PLACEHOLDER_API_KEY = "not-needed"


@dataclass(frozen=True)
class ProviderInfo:
    kind: str  # "openai" | "openai-compatible" | "offline-demo"
    model: str
    base_url: str | None

    @property
    def offline(self) -> bool:
        return self.kind == "offline-demo"

    def describe(self) -> str:
        """One line for people: what answers, where, and with which model. Never a secret."""
        if self.kind == "openai":
            return f"OpenAI (Responses API), model {self.model}"
        if self.kind == "openai-compatible":
            return (
                f"an OpenAI-compatible server at {display_url(self.base_url or '')} "
                f"(Chat Completions), model {self.model}"
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


class OfflineDemoProvider(ModelProvider):
    """Serves the offline model whatever model name an agent or run asks for."""

    def get_model(self, model_name: str | None) -> Model:
        return offline_model_class()()


def provider_info() -> ProviderInfo:
    """Which provider the current settings select. Cheap: no network, no client."""
    base_url = settings.OPENAI_BASE_URL.strip()
    api_key = settings.OPENAI_API_KEY.strip()
    model = settings.AGENTSITE_MODEL.strip()
    if base_url:
        return ProviderInfo(kind="openai-compatible", model=model, base_url=base_url)
    if api_key:
        return ProviderInfo(kind="openai", model=model, base_url=None)
    return ProviderInfo(kind="offline-demo", model=OFFLINE_MODEL_NAME, base_url=None)


def get_model_provider() -> ModelProvider:
    """The SDK model provider for the current settings."""
    info = provider_info()
    api_key = settings.OPENAI_API_KEY.strip()
    if info.kind == "openai-compatible":
        return OpenAIProvider(
            api_key=api_key or PLACEHOLDER_API_KEY,
            base_url=info.base_url,
            use_responses=False,
            # Local servers' streamed tool-call chunks are not all reliable; text still streams.
            buffer_streamed_tool_calls=True,
        )
    if info.kind == "openai":
        return OpenAIProvider(api_key=api_key, use_responses=True)
    return OfflineDemoProvider()


def run_config(**kwargs: Any) -> RunConfig:
    """The `RunConfig` for every run: the selected provider and, online, the configured model.

    Keyword arguments are passed to `RunConfig` and win over these defaults.
    """
    info = provider_info()
    options: dict[str, Any] = {"model_provider": get_model_provider()}
    if not info.offline:
        options["model"] = info.model
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
