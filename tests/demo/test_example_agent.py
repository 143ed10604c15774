"""docs/agents.md's first agent, followed literally with no model key: the example file is
the one the page shows, registered with the page's own line beside the demo's agent, and the
message the page says to send pauses for a reviewer and books once approved."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from agentsite.settings import env_agents
from engine import registry, runs
from engine.models import AgentRun, RunStatus
from examples import leave
from tests.factories import make_conversation, make_reviewer, make_user, session_items

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_registry")]

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "agents.md").read_text()
EXAMPLE = ROOT / "examples" / "leave.py"


def docs_message(tool_call: str) -> str:
    """The first line of the page that starts `call <tool_call> ` (what it says to send)."""
    match = re.search(rf"^\s*(call {tool_call}\b.*)$", PAGE, re.MULTILINE)
    assert match, f"docs/agents.md says to send no `call {tool_call}`"
    return match.group(1).strip()


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch, settings: Any) -> dict[str, Any]:
    """AGENTSITE_AGENTS as the page's `make run` line sets it."""
    line = re.search(r'^\s*AGENTSITE_AGENTS="([^"]+)" make run$', PAGE, re.MULTILINE)
    assert line, "docs/agents.md shows no `AGENTSITE_AGENTS=... make run` line"
    monkeypatch.setenv("AGENTSITE_AGENTS", line.group(1))
    settings.AGENTSITE_AGENTS = env_agents("AGENTSITE_AGENTS", {})
    registry.reset()
    leave.BOOKINGS.clear()
    return settings.AGENTSITE_AGENTS


def ask(text: str, user: Any) -> AgentRun:
    conversation = make_conversation(owner=user, agent_name="leave")
    run = runs.start_run(conversation, text, user)
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def test_the_page_shows_the_example_file_as_it_is() -> None:
    assert f"```python\n{EXAMPLE.read_text()}```" in PAGE


def test_registering_it_keeps_the_demo_agent(registered: dict[str, Any]) -> None:
    assert list(registered) == ["support", "leave"]
    assert registry.get_agent("support").name == "Support desk"
    assert registry.get_agent("leave") is leave.leave_desk


def test_the_page_s_message_pauses_and_books_once_approved(
    registered: dict[str, Any], submitted: list[Any]
) -> None:
    alice = make_user(username="alice")
    run = ask(docs_message("book_leave"), alice)

    assert run.status == RunStatus.WAITING, run.error
    request = run.approval_requests.get()
    assert request.tool_name == "book_leave"
    assert request.arguments == {"days": 3, "first_day": "2027-01-04"}
    assert leave.BOOKINGS == {}  # nothing booked before a person looked

    runs.decide(request, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()

    assert run.status == RunStatus.COMPLETED, run.error
    assert "Booked 3 days from 04 January 2027; 22 days left." in run.final_output
    assert list(leave.BOOKINGS.values()) == [(alice.pk, leave.date(2027, 1, 4), 3)]


def test_a_short_leave_books_at_once_and_the_balance_is_the_asker_s(
    registered: dict[str, Any], submitted: list[Any]
) -> None:
    alice, bob = make_user(username="alice"), make_user(username="bob")
    booked = ask('call book_leave {"days": 1, "first_day": "2027-01-04"}', alice)
    assert booked.status == RunStatus.COMPLETED, booked.error
    assert "24 days left" in booked.final_output

    assert "`call leave_balance` asks no one" in PAGE
    assert "alice has 24 days" in ask("call leave_balance", alice).final_output
    assert "bob has 25 days" in ask("call leave_balance", bob).final_output


def test_an_argument_outside_its_bounds_never_reaches_the_tool(
    registered: dict[str, Any], submitted: list[Any]
) -> None:
    run = ask('call book_leave {"days": 0, "first_day": "2027-01-04"}', make_user())
    # Arguments the SDK cannot validate unchanged wait for a person (as the page says), and
    # an approval runs the validation, not the tool.
    assert run.status == RunStatus.WAITING, run.error
    runs.decide(run.approval_requests.get(), make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()

    assert run.status == RunStatus.COMPLETED, run.error
    [output] = [item["output"] for item in session_items(run) if item.get("output")]
    assert output.startswith("An error occurred while running the tool")
    assert leave.BOOKINGS == {}


def test_without_a_call_it_says_how_to_call_each_tool(
    registered: dict[str, Any], submitted: list[Any]
) -> None:
    reply = ask("hello", make_user()).final_output

    assert "call leave_balance" in reply
    assert 'call book_leave {"days": 1, "first_day": "' in reply
