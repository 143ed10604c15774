"""The runs' admin (`engine/admin.py`): view-only; searched by conversation, input, tool and
call id, filtered by the tool a run asked for, its saved state shown pretty-printed and
escaped. (Requests and decisions: tests/approvals/test_admin.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from engine import runs
from engine.models import AgentRun
from tests.factories import make_conversation, pause_run

# Tools run in worker threads with their own database connections: they must see committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

RUNS = "/admin/engine/agentrun/"
REQUESTS = "/admin/approvals/approvalrequest/"


def test_it_searches_runs_by_session_input_tool_and_call_id(
    admin_client: Client, paused_run: AgentRun
) -> None:
    run = paused_run
    request = run.approval_requests.get()
    for query in (run.conversation.session_id, "cancel order", "cancel_order", request.call_id):
        response = admin_client.get(RUNS, {"q": query})
        assert response.context["cl"].result_count == 1, query
    assert admin_client.get(RUNS, {"q": "no such thing"}).context["cl"].result_count == 0
    for query in (run.conversation.session_id, "cancel order", request.call_id):
        response = admin_client.get(REQUESTS, {"q": query})
        assert response.context["cl"].result_count == 1, query


def test_it_shows_the_state_pretty_printed_and_escaped(
    admin_client: Client, submitted: list
) -> None:
    run = pause_run("cancel order 42 <script>alert(1)</script>")

    body = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()

    assert "<script>alert(1)</script>" not in body
    # The state's JSON, indented, inside a <pre>; the input it holds is escaped there too.
    start = body.index('<pre class="pretty-json">{\n  &quot;$schemaVersion&quot;')
    state = body[start : body.index("</pre>", start)]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in state


def test_it_filters_runs_by_the_tool_they_asked_for(
    admin_client: Any, paused_run: AgentRun
) -> None:
    cancel = paused_run
    other = runs.start_run(make_conversation(agent_name="support"), "where is order 7")
    page = admin_client.get(
        "/admin/engine/agentrun/?approval_requests__tool_name=cancel_order"
    ).content.decode()
    assert f"/admin/engine/agentrun/{cancel.pk}/change/" in page
    assert f"/admin/engine/agentrun/{other.pk}/change/" not in page
