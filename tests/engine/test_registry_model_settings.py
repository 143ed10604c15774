"""An agent's own model and model settings (`engine/registry.py`), from its code or
AGENTSITE_AGENTS.

An entry `{"agent": "dotted.path", "model": ..., "model_settings": {...}}` applies to the agent
object itself, so the agent answers with them wherever it answers: registered, as a handoff
target, and in a conversation that went on with it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from agents import Agent, ModelSettings, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from django.core.exceptions import ImproperlyConfigured

from agentsite.settings import env_agents
from conversations.models import Conversation
from demo.agents import billing, support_desk
from engine import registry, runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_user
from tests.provider import TEST_MODEL, LocalProvider, text, tool_call, use_local_provider

pytestmark = pytest.mark.usefixtures("fresh_registry")

SETTINGS = {"temperature": 0.2, "max_tokens": 500, "parallel_tool_calls": False}

# Registered by dotted path in the tests below.
FRONT: Agent[Any] | None = None
BACK: Agent[Any] | None = None
CODED: Agent[Any] | None = None


# --- the setting ----------------------------------------------------------------------------


def test_it_reads_entries_with_settings_from_the_json_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AGENTSITE_AGENTS",
        '{"support": "demo.agents.support_desk", "billing": {"agent": "demo.agents.billing", '
        '"model": "llama3.1", "model_settings": {"temperature": 0.2}}}',
    )

    assert env_agents("AGENTSITE_AGENTS", {}) == {
        "support": "demo.agents.support_desk",
        "billing": {
            "agent": "demo.agents.billing",
            "model": "llama3.1",
            "model_settings": {"temperature": 0.2},
        },
    }


def test_it_keeps_the_plain_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSITE_AGENTS", "support=demo.agents.support_desk,b=demo.agents.billing")
    assert env_agents("AGENTSITE_AGENTS", {}) == {
        "support": "demo.agents.support_desk",
        "b": "demo.agents.billing",
    }
    monkeypatch.delenv("AGENTSITE_AGENTS")
    assert env_agents("AGENTSITE_AGENTS", {"x": "y.z"}) == {"x": "y.z"}


def test_it_refuses_an_entry_that_is_neither_a_path_nor_an_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTSITE_AGENTS", '{"support": ["demo.agents.support_desk"]}')
    with pytest.raises(ImproperlyConfigured, match=r"AGENTSITE_AGENTS\['support'\] is neither"):
        env_agents("AGENTSITE_AGENTS", {})


# --- applied to the agent -------------------------------------------------------------------


def test_an_entry_gives_the_agent_its_model_and_settings_over_its_code(settings: Any) -> None:
    code_settings = support_desk.model_settings
    settings.AGENTSITE_AGENTS = {
        "support": {
            "agent": "demo.agents.support_desk",
            "model": "gpt-4.1",
            "model_settings": SETTINGS,
        }
    }

    agent = registry.get_agent("support")

    assert agent is support_desk
    assert agent.model == "gpt-4.1"
    assert agent.model_settings.temperature == 0.2
    assert agent.model_settings.max_tokens == 500
    assert agent.model_settings.parallel_tool_calls is False

    registry.reset()
    assert support_desk.model is None
    assert support_desk.model_settings is code_settings


def test_what_the_entry_leaves_out_stays_as_the_code_declares(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = ModelSettings(top_p=0.5, temperature=1)
    back = Agent(name="Back", model="gpt-4o", model_settings=code)
    monkeypatch.setattr(f"{__name__}.BACK", back)
    settings.AGENTSITE_AGENTS = {
        "back": {"agent": f"{__name__}.BACK", "model_settings": {"temperature": 0.3}}
    }

    agent = registry.get_agent("back")

    assert (agent.model, agent.model_settings.temperature, agent.model_settings.top_p) == (
        "gpt-4o",
        0.3,
        0.5,
    )
    registry.reset()
    assert (back.model, back.model_settings.temperature) == ("gpt-4o", 1)


def test_a_handoff_target_answers_with_its_entry_wherever_it_is_reached(settings: Any) -> None:
    # support_desk hands off to billing; billing's entry applies when support reaches it too,
    # and to "support/Billing", the name a conversation that went on with it keeps.
    settings.AGENTSITE_AGENTS = {
        "support": "demo.agents.support_desk",
        "billing": {"agent": "demo.agents.billing", "model": "gpt-4.1", "model_settings": SETTINGS},
    }

    support = registry.get_agent("support")
    [reached] = [agent for agent in registry.walk(support) if agent.name == billing.name]

    assert reached is billing is registry.get_agent("support/Billing")
    assert reached.model == "gpt-4.1" and reached.model_settings.max_tokens == 500


def test_it_refuses_one_agent_registered_twice_with_different_settings(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {
        "cheap": {"agent": "demo.agents.billing", "model": "gpt-4.1-mini"},
        "smart": {"agent": "demo.agents.billing", "model": "gpt-4.1"},
    }
    with pytest.raises(ImproperlyConfigured, match=r"\['cheap'\] and .*\['smart'\] register the"):
        registry.get_agent("cheap")

    settings.AGENTSITE_AGENTS = {
        "plain": "demo.agents.billing",
        "set": {"agent": "demo.agents.billing", "model": "gpt-4.1"},
    }
    with pytest.raises(ImproperlyConfigured, match="same agent .'Billing'."):
        registry.get_agent("plain")


def test_one_agent_may_be_registered_twice_with_the_same_settings(settings: Any) -> None:
    entry = {"agent": "demo.agents.billing", "model_settings": {"temperature": 0.5}}
    settings.AGENTSITE_AGENTS = {"one": entry, "two": dict(entry)}

    assert registry.get_agent("one") is registry.get_agent("two") is billing
    assert billing.model_settings.temperature == 0.5


def test_a_changed_entry_replaces_the_one_applied_before(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {"b": {"agent": "demo.agents.billing", "model": "gpt-4.1"}}
    assert registry.get_agent("b").model == "gpt-4.1"

    settings.AGENTSITE_AGENTS = {"b": {"agent": "demo.agents.billing", "model_settings": SETTINGS}}
    registry.get_agent("b")
    assert (billing.model, billing.model_settings.max_tokens) == (None, 500)

    settings.AGENTSITE_AGENTS = {"b": "demo.agents.billing"}
    assert registry.get_agent("b").model_settings.max_tokens is None


def test_it_refuses_an_entry_it_does_not_understand(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {
        "support": "demo.agents.support_desk",
        "billing": {"agent": "demo.agents.billing", "model_settings": {"temprature": 0.2}},
    }
    # Any agent may reach billing by a handoff: none is handed out with its entry unapplied.
    with pytest.raises(ImproperlyConfigured, match="unknown model setting 'temprature'"):
        registry.get_agent("support")


# --- through a run --------------------------------------------------------------------------


def say(text: str) -> list[Any]:
    return [assistant_message(text, item_id=f"msg_{uuid.uuid4().hex}")]


def turn(conversation: Conversation, text: str) -> AgentRun:
    run = runs.start_run(conversation, text, conversation.owner)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    conversation.refresh_from_db()
    return run


@pytest.mark.django_db(transaction=True)
def test_the_handoff_target_and_the_conversation_continued_with_it_use_its_settings(
    settings: Any, submitted: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    back_model = ScriptedModel([say("Back here."), say("Still back.")])
    front_model = ScriptedModel(
        [[function_call("transfer_to_back", {}, call_id=f"call_{uuid.uuid4().hex}")]]
    )
    back: Agent[Any] = Agent(name="Back", model=back_model)
    monkeypatch.setattr(f"{__name__}.BACK", back)
    front: Agent[Any] = Agent(name="Front", model=front_model, handoffs=[back])
    monkeypatch.setattr(f"{__name__}.FRONT", front)
    settings.AGENTSITE_AGENTS = {
        "front": f"{__name__}.FRONT",
        "back": {"agent": f"{__name__}.BACK", "model_settings": SETTINGS},
    }
    conversation = make_conversation(owner=make_user(username="alice"), agent_name="front")

    first = turn(conversation, "I was charged twice.")
    assert first.status == RunStatus.COMPLETED
    assert conversation.current_agent == "front/Back"
    second = turn(conversation, "And?")
    assert second.status == RunStatus.COMPLETED

    assert front_model.first_call is not None
    assert front_model.first_call.model_settings.temperature is None
    used = [(c.model_settings.temperature, c.model_settings.max_tokens) for c in back_model.calls]
    assert used == [(0.2, 500), (0.2, 500)]
    assert all(c.model_settings.parallel_tool_calls is False for c in back_model.calls)


# --- over HTTP: what the model service receives ---------------------------------------------


@function_tool
def spell(word: str) -> str:
    """Spell a word out."""
    return "-".join(word)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_the_model_service_receives_the_agents_model_and_settings(
    settings: Any,
    submitted: list,
    monkeypatch: pytest.MonkeyPatch,
    local_provider: LocalProvider,
    api: str,
) -> None:
    use_local_provider(settings, local_provider, api)
    monkeypatch.setattr(f"{__name__}.FRONT", Agent(name="Front", tools=[spell]))
    monkeypatch.setattr(f"{__name__}.BACK", Agent(name="Back", tools=[spell]))
    coded = Agent(name="Coded", model="coded-model", model_settings=ModelSettings(temperature=1.5))
    monkeypatch.setattr(f"{__name__}.CODED", coded)
    settings.AGENTSITE_AGENTS = {
        "front": {"agent": f"{__name__}.FRONT", "model": "agent-model", "model_settings": SETTINGS},
        "back": f"{__name__}.BACK",
        "coded": f"{__name__}.CODED",
    }
    alice = make_user(username="alice")
    local_provider.script(
        tool_call("spell", {"word": "hi"}), text("It is h-i."), text("Hello."), text("Hi.")
    )

    assert turn(make_conversation(owner=alice, agent_name="front"), "Spell hi").status == (
        RunStatus.COMPLETED
    )
    assert turn(make_conversation(owner=alice, agent_name="back"), "Hi").status == (
        RunStatus.COMPLETED
    )
    assert turn(make_conversation(owner=alice, agent_name="coded"), "Hi").status == (
        RunStatus.COMPLETED
    )

    first, second, plain, in_code = (request.body for request in local_provider.requests)
    max_tokens = "max_tokens" if api == "chat_completions" else "max_output_tokens"
    for body in (first, second):  # the turn's two requests: the tool call, then the reply
        assert body["model"] == "agent-model"
        assert body["temperature"] == 0.2
        assert body[max_tokens] == 500
        assert body["parallel_tool_calls"] is False
    assert plain["model"] == TEST_MODEL  # AGENTSITE_MODEL, for an agent that names none
    assert "temperature" not in plain and max_tokens not in plain
    assert (in_code["model"], in_code["temperature"]) == ("coded-model", 1.5)  # Agent(model=...)
    assert {request.path for request in local_provider.requests} == {
        "/v1/chat/completions" if api == "chat_completions" else "/v1/responses"
    }
