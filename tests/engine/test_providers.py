"""Which model serves the agents, chosen from settings, with no network call."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from agents import Runner
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.models.openai_responses import OpenAIResponsesModel
from django.core.exceptions import ImproperlyConfigured

from demo.agents import researcher
from demo.model import OfflineDemoModel
from engine import providers

SECRET = "sk-test-0123456789abcdefSECRET"


def test_it_serves_the_offline_demo_model_without_configuration() -> None:
    info = providers.provider_info()

    assert info.kind == "offline-demo"
    assert info.offline
    assert info.base_url is None
    assert isinstance(providers.get_model_provider().get_model("gpt-4.1"), OfflineDemoModel)
    assert isinstance(providers.get_model_provider().get_model(None), OfflineDemoModel)


def test_it_serves_openai_when_an_api_key_is_set(settings: Any) -> None:
    settings.OPENAI_API_KEY = SECRET
    settings.AGENTSITE_MODEL = "gpt-4.1-mini"

    info = providers.provider_info()
    config = providers.run_config()

    assert info.kind == "openai"
    assert info.api == "responses"
    assert not info.offline
    # The default model comes from the provider, so an agent's own model name still wins.
    assert config.model is None
    model = config.model_provider.get_model(None)
    assert isinstance(model, OpenAIResponsesModel)
    assert model.model == "gpt-4.1-mini"
    named = config.model_provider.get_model("gpt-4.1")
    assert isinstance(named, OpenAIResponsesModel) and named.model == "gpt-4.1"


def test_it_serves_an_openai_compatible_server_when_a_base_url_is_set(settings: Any) -> None:
    settings.OPENAI_BASE_URL = "http://localhost:11434/v1"
    settings.AGENTSITE_MODEL = "llama3.1"

    info = providers.provider_info()
    config = providers.run_config()
    model = config.model_provider.get_model(info.model)

    assert info.kind == "openai-compatible"
    assert info.api == "chat_completions"
    assert info.base_url == "http://localhost:11434/v1"
    assert config.model is None
    default = config.model_provider.get_model(None)
    assert isinstance(default, OpenAIChatCompletionsModel) and default.model == "llama3.1"
    assert isinstance(model, OpenAIChatCompletionsModel)
    # Compatible servers send usage in a stream's last chunk only when asked.
    assert config.model_settings is not None and config.model_settings.include_usage is True
    assert str(model._client.base_url).startswith("http://localhost:11434/v1")
    # Local servers need no key; the client still needs one to start.
    assert model._client.api_key == providers.PLACEHOLDER_API_KEY


def test_it_sends_the_api_key_to_a_compatible_server_when_set(settings: Any) -> None:
    settings.OPENAI_BASE_URL = "https://llm.internal.example/v1"
    settings.OPENAI_API_KEY = SECRET

    model = providers.get_model_provider().get_model("served-model")

    assert providers.provider_info().kind == "openai-compatible"
    assert isinstance(model, OpenAIChatCompletionsModel)
    assert model._client.api_key == SECRET


def test_it_passes_extra_run_config_options_through() -> None:
    config = providers.run_config(workflow_name="support chat", group_id="conversation-1")

    assert config.workflow_name == "support chat"
    assert config.group_id == "conversation-1"
    assert config.model is None
    assert isinstance(config.model_provider, providers.OfflineDemoProvider)


def test_it_reads_settings_on_every_call(settings: Any) -> None:
    assert providers.provider_info().kind == "offline-demo"
    settings.OPENAI_API_KEY = SECRET
    assert providers.provider_info().kind == "openai"


@pytest.mark.parametrize(
    ("configure", "kind"),
    [
        ({}, "offline-demo"),
        ({"OPENAI_API_KEY": SECRET}, "openai"),
        (
            {
                "OPENAI_BASE_URL": "https://user:hunter2@llm.example/v1?key=abc",
                "OPENAI_API_KEY": SECRET,
            },
            "openai-compatible",
        ),
    ],
)
def test_it_logs_the_provider_and_never_a_secret(
    settings: Any, caplog: pytest.LogCaptureFixture, configure: dict[str, str], kind: str
) -> None:
    for name, value in configure.items():
        setattr(settings, name, value)

    with caplog.at_level(logging.INFO, logger="engine.providers"):
        info = providers.log_active_provider()

    assert info.kind == kind
    [record] = caplog.records
    assert record.name == "engine.providers"
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert kind in message
    for secret in (SECRET, "hunter2", "key=abc"):
        assert secret not in message


def test_it_describes_each_provider_in_one_line(settings: Any) -> None:
    assert "offline demo model" in providers.provider_info().describe()
    settings.OPENAI_BASE_URL = "http://localhost:8000/v1"
    settings.AGENTSITE_MODEL = "qwen2.5"
    line = providers.provider_info().describe()
    assert "http://localhost:8000/v1" in line
    assert "qwen2.5" in line
    assert "\n" not in line


async def test_it_runs_agents_that_name_no_model_on_the_offline_model() -> None:
    result = await Runner.run(researcher, "shipping times", run_config=providers.run_config())

    [interruption] = result.interruptions
    assert interruption.tool_name == "search_knowledge_base"


def test_it_says_what_to_set_when_no_offline_model_imports(settings: Any) -> None:
    settings.AGENTSITE_OFFLINE_MODEL = "not_installed.model.Model"
    with pytest.raises(ImproperlyConfigured, match="set OPENAI_API_KEY or OPENAI_BASE_URL"):
        providers.run_config().model_provider.get_model(None)


def test_the_responses_api_can_be_chosen_for_a_compatible_server(settings: Any) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.AGENTSITE_MODEL_API = "responses"

    info = providers.provider_info()
    config = providers.run_config()

    assert info.api == "responses"
    assert isinstance(config.model_provider.get_model(None), OpenAIResponsesModel)
    assert config.model_settings is None
    assert "Responses API" in info.describe()


def test_the_client_retries_and_times_out_as_configured(settings: Any) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    settings.AGENTSITE_MODEL_RETRIES = 5
    settings.AGENTSITE_MODEL_TIMEOUT = 3.5

    client = providers.openai_client()

    assert client.max_retries == 5
    assert client.timeout.read == 3.5
    assert client.timeout.connect == 3.5
    settings.AGENTSITE_MODEL_TIMEOUT = 120.0
    assert providers.openai_client().timeout.connect == providers.CONNECT_TIMEOUT


async def test_the_test_guard_refuses_a_model_that_is_not_on_this_machine(settings: Any) -> None:
    from tests.conftest import RealModelCalled

    settings.OPENAI_API_KEY = SECRET
    model = providers.get_model_provider().get_model(None)

    with pytest.raises(RealModelCalled):
        await model.get_response()  # type: ignore[call-arg]
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    local = providers.get_model_provider().get_model(None)
    with pytest.raises(TypeError):  # past the guard: the real method, called without arguments
        await local.get_response()  # type: ignore[call-arg]


async def test_a_loop_keeps_its_client_while_the_settings_hold(settings: Any) -> None:
    """Building a client costs more than a whole turn (bench `http`): runs of one loop share it."""
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    first = providers.openai_client()

    assert providers.openai_client() is first
    assert providers.get_model_provider().get_model(None)._client is first  # type: ignore[attr-defined]
    settings.AGENTSITE_MODEL_TIMEOUT = 7.0
    changed = providers.openai_client()
    assert changed is not first and changed.timeout.read == 7.0
    settings.OPENAI_API_KEY = SECRET
    assert providers.openai_client().api_key == SECRET


def test_a_client_is_not_kept_outside_a_loop_nor_shared_between_loops(settings: Any) -> None:
    import asyncio

    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"

    async def client() -> Any:
        return providers.openai_client()

    assert providers.openai_client() is not providers.openai_client()
    with asyncio.Runner() as one, asyncio.Runner() as other:
        assert one.run(client()) is one.run(client())
        assert one.run(client()) is not other.run(client())
