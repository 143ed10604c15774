"""The engine's system checks (`engine/apps.py`): the executor's channel layer, and every
registered agent, its entry and what its code declares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from agents import Agent, ModelSettings
from agents.testing import ScriptedModel
from django.core import checks

from engine.apps import check_agents, check_shared_channel_layer
from tests import scripted

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


# --- the agents, their entries and their model settings -------------------------------------


@pytest.fixture
def registered(settings: Any, fresh_registry: None) -> Callable[[Agent[Any]], None]:
    """Register an agent (with its graph) as the only one."""
    return lambda agent: scripted.install(settings, agent) and None


def test_the_default_agents_pass() -> None:
    assert check_agents() == []


def test_it_names_what_is_wrong_with_an_entry(settings: Any, fresh_registry: None) -> None:
    settings.AGENTSITE_AGENTS = {
        "support": {
            "agent": "demo.agents.support_desk",
            "model": "",
            "model_settings": {"temperature": 2.5, "top_p": 1.5, "max_tokens": 0, "seed": 1},
            "modle": "gpt-4.1",
        }
    }

    [error] = check_agents()

    assert error.id == "engine.E002"
    for said in (
        "AGENTSITE_AGENTS['support']",
        "unknown key 'modle'",
        '"model": the model name is empty',
        "temperature: 2.5 is outside 0..2",
        "top_p: 1.5 is outside 0..1",
        "max_tokens: 0 is not a positive whole number",
        "unknown model setting 'seed'",
    ):
        assert said in error.msg


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"temperature": "warm"}, "temperature: 'warm' is not a number"),
        ({"max_tokens": 10.5}, "max_tokens: 10.5 is not a positive whole number"),
        ({"max_tokens": True}, "max_tokens: True is not a positive whole number"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls: 'no' is not true or false"),
        ({"presence_penalty": -3}, "presence_penalty: -3 is outside -2..2"),
    ],
)
def test_it_refuses_settings_of_the_wrong_type_or_range(
    settings: Any, fresh_registry: None, given: dict[str, Any], said: str
) -> None:
    settings.AGENTSITE_AGENTS = {"b": {"agent": "demo.agents.billing", "model_settings": given}}
    [error] = check_agents()
    assert error.id == "engine.E002" and said in error.msg


def test_it_refuses_an_entry_whose_settings_are_not_an_object_or_whose_path_is_missing(
    settings: Any, fresh_registry: None
) -> None:
    settings.AGENTSITE_AGENTS = {
        "a": {"model": "gpt-4.1"},
        "b": {"agent": "demo.agents.billing", "model_settings": [0.2]},
        "c": "demo.agents.billing",
    }
    messages = [error.msg for error in check_agents()]
    assert len(messages) == 2
    assert '"agent" must be the dotted path of an agents.Agent' in messages[0]
    assert '"model_settings" must be an object, not [0.2]' in messages[1]


def test_it_says_once_that_an_entry_does_not_import(settings: Any, fresh_registry: None) -> None:
    settings.AGENTSITE_AGENTS = {
        "support": "demo.agents.support_desk",
        "gone": {"agent": "demo.agents.no_such_agent", "model": "gpt-4.1"},
        "billing": "demo.agents.billing",
    }
    [error] = check_agents()
    assert error.id == "engine.E002"
    assert "AGENTSITE_AGENTS['gone'] = 'demo.agents.no_such_agent' does not import" in error.msg

    settings.AGENTSITE_AGENTS = {"support": "demo.agents.support_desk", "lost": "demo.agents.lost"}
    [error] = check_agents()
    assert "AGENTSITE_AGENTS['lost'] = 'demo.agents.lost' does not import" in error.msg


def test_it_refuses_one_agent_registered_twice_with_different_settings(
    settings: Any, fresh_registry: None
) -> None:
    settings.AGENTSITE_AGENTS = {
        "a": {"agent": "demo.agents.billing", "model": "gpt-4.1"},
        "b": {"agent": "demo.agents.billing", "model": "gpt-4o"},
    }
    errors = check_agents()
    assert {error.id for error in errors} == {"engine.E002"}
    assert "register the same agent ('Billing')" in errors[0].msg


def test_it_checks_what_code_declares_for_every_agent_of_the_graph(
    registered: Callable[[Agent[Any]], None],
) -> None:
    helper = Agent(name="Helper", model_settings=ModelSettings(max_tokens=-1))
    target = Agent(name="Target", model=" ", model_settings=ModelSettings(temperature=3.0))
    front = Agent(
        name="Front",
        handoffs=[target],
        tools=[helper.as_tool(tool_name="helper", tool_description="Helps.")],
    )
    registered(front)

    errors = check_agents()

    assert {error.id for error in errors} == {"engine.E003"}
    assert [error.msg for error in errors] == [
        "AGENTSITE_AGENTS['scripted']: agent 'Helper': max_tokens: -1 is not a positive whole "
        "number.",
        "AGENTSITE_AGENTS['scripted']: agent 'Target': model the model name is empty.",
        "AGENTSITE_AGENTS['scripted']: agent 'Target': temperature: 3.0 is outside 0..2.",
    ]
    assert "temperature takes 0..2" in (errors[0].hint or "")


def test_it_accepts_a_model_object_and_valid_code_settings(
    registered: Callable[[Agent[Any]], None],
) -> None:
    settings_in_code = ModelSettings(temperature=0, top_p=1, max_tokens=1, parallel_tool_calls=True)
    registered(Agent(name="Scripted", model=ScriptedModel([]), model_settings=settings_in_code))
    assert check_agents() == []


@pytest.mark.django_db
def test_it_is_registered_with_django(settings: Any, fresh_registry: None) -> None:
    settings.AGENTSITE_AGENTS = {"b": {"agent": "demo.agents.billing", "model": ""}}
    assert "engine.E002" in {error.id for error in checks.run_checks()}


def test_a_server_whose_agents_the_checks_refuse_does_not_start(tmp_path: Any) -> None:
    import json
    import os
    import subprocess
    import sys

    from tests.live import ROOT, free_port

    bad = {"support": {"agent": "demo.agents.support_desk", "model_settings": {"temperature": 9}}}
    env = {
        **os.environ,
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "agentsite.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "AGENTSITE_AGENTS": json.dumps(bad),
    }
    port = str(free_port())
    command = [sys.executable, "-m", "agentsite.serve", "-b", "127.0.0.1", "-p", port]
    server = subprocess.run(
        [*command, "agentsite.asgi:application"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert server.returncode != 0
    assert "system checks refuse" in server.stderr
    assert "engine.E002" in server.stderr and "temperature" in server.stderr
