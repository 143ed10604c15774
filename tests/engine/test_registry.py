"""The registry of agents by public name."""

from __future__ import annotations

from typing import Any

import pytest
from agents import Agent
from django.core.exceptions import ImproperlyConfigured

from demo.agents import billing, support_desk
from engine import registry
from tests import scripted


def test_it_registers_the_support_desk_by_default() -> None:
    assert registry.agent_names() == ["support"]
    assert registry.default_agent_name() == "support"
    assert registry.get_agent("support") is support_desk


def test_it_keeps_the_order_of_the_setting(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {
        "billing": "demo.agents.billing",
        "support": "demo.agents.support_desk",
    }

    assert registry.agent_names() == ["billing", "support"]
    assert registry.default_agent_name() == "billing"
    assert registry.get_agent("billing") is billing


def test_it_names_the_registered_agents_for_an_unknown_name() -> None:
    with pytest.raises(registry.UnknownAgent) as caught:
        registry.get_agent("sales")

    assert isinstance(caught.value, KeyError)
    assert caught.value.name == "sales"
    assert str(caught.value) == "No agent is registered as 'sales'. Registered agents: 'support'."


def test_it_rejects_a_path_that_does_not_import(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {"broken": "demo.agents.no_such_agent"}

    with pytest.raises(
        ImproperlyConfigured, match=r"AGENTSITE_AGENTS\['broken'\].*does not import"
    ):
        registry.get_agent("broken")


def test_it_rejects_a_path_that_is_not_an_agent(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {"tool": "demo.tools.lookup_order"}

    with pytest.raises(ImproperlyConfigured, match="is a FunctionTool, not an agents.Agent"):
        registry.get_agent("tool")


def test_it_rejects_an_empty_registry(settings: Any) -> None:
    settings.AGENTSITE_AGENTS = {}

    with pytest.raises(ImproperlyConfigured, match="register at least one agent"):
        registry.default_agent_name()


def test_it_imports_an_agent_once_until_reset(
    settings: Any, monkeypatch: pytest.MonkeyPatch, fresh_registry: None
) -> None:
    first, second = Agent(name="First"), Agent(name="Second")
    settings.AGENTSITE_AGENTS = {"scripted": "tests.scripted.AGENT"}
    monkeypatch.setattr(scripted, "AGENT", first)
    assert registry.get_agent("scripted") is first

    monkeypatch.setattr(scripted, "AGENT", second)
    assert registry.get_agent("scripted") is first  # imported once, then cached

    registry.reset()
    assert registry.get_agent("scripted") is second
