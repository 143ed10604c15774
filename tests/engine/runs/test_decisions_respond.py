"""Answer as the tool, a decision's action (`engine/runs/decisions.py`). The reviewer skips the call
and writes its result; the tool never runs and the model reads exactly that text as the call's
output; the audit, the history, the request page, the chat and the trace say so."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from conversations.session import DjangoSession
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_reviewer, make_user
from tracing.models import Span

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry", "submitted"),
]

# Text with a line break, a quote and markup: the model must read it exactly as written.
ANSWER = 'Sent by hand: 80 USD to "acme" <ref 7>.\nReceipt #991.'
REPLY = "Done: the money went out by hand."


def text(response: Any) -> str:
    return str(response.content.decode())


def paused_wire(settings: Any, owner: Any = None) -> tuple[AgentRun, ApprovalRequest, Any]:
    """A run of an agent whose model calls `wire_money` and then replies, paused at the call."""
    model = ScriptedModel(
        [
            [function_call("wire_money", {"account": "acme", "amount": 80}, call_id="call_r1")],
            [assistant_message(REPLY, item_id="msg_r1")],
        ]
    )
    agent = Agent(name="Wire", model=model, tools=[scripted.wire_money])
    run = scripted.executed(scripted.start(settings, agent, "send 80 to acme", owner))
    return run, run.approval_requests.get(), model


def respond(client: Client, request: ApprovalRequest, answer: str, **headers: Any) -> Any:
    return client.post(
        reverse("inbox_decide", args=[request.pk]),
        {"action": "respond", "response": answer, "seen_hash": request.arguments_hash},
        **headers,
    )


def outputs(items: list[Any], call_id: str) -> list[Any]:
    return [
        item.get("output")
        for item in items
        if isinstance(item, dict)
        and item.get("type") == "function_call_output"
        and item.get("call_id") == call_id
    ]


def test_it_answers_as_the_tool_the_tool_never_runs_and_the_model_reads_the_text(
    client: Client, settings: Any, traces: Any
) -> None:
    run, request, model = paused_wire(settings)
    client.force_login(make_reviewer())
    response = respond(client, request, ANSWER)
    assert response.status_code == 302

    decision = ApprovalDecision.objects.get(request=request)
    assert decision.kind == DecisionKind.RESPONDED and decision.is_response
    assert (decision.approved, decision.message) == (False, ANSWER)
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.RESPONDED

    # While it resumes, the chat says what happened, and not that the call was refused.
    client.force_login(run.conversation.owner)
    chat = text(client.get(reverse("chat", args=[run.conversation.session_id])))
    assert "Answered by rita without running the tool" in chat
    assert "Not approved" not in chat

    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert scripted.EXECUTED == []  # the tool never ran
    # The model's next input holds exactly the reviewer's text as the call's output.
    assert outputs(list(model.last_call.input), "call_r1") == [ANSWER]
    stored = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    assert outputs(stored, "call_r1") == [ANSWER]

    chat = text(client.get(reverse("chat", args=[run.conversation.session_id])))
    assert REPLY in chat
    assert "Not approved" not in chat and "rejected" not in chat.lower()

    traces.flush()
    [span] = Span.objects.filter(trace_id=run.trace_id, name="approval decision")
    assert (span.data["reviewer"], span.data["decision"]) == ("rita", "respond")
    assert span.data["message"] == ANSWER

    client.force_login(make_reviewer())
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert "Answered as the tool" in page and "the tool did not run" in page
    assert "Receipt #991" in page and "&lt;ref 7&gt;" in page
    history = text(client.get(reverse("inbox_history")))
    assert "Answered as the tool" in history
    # An answer is not a rejection in the history's counts.
    rejected = text(client.get(reverse("inbox_history"), {"decision": "rejected"}))
    assert f"decision-row-{decision.pk}" not in rejected
    answered = text(client.get(reverse("inbox_history"), {"decision": "responded"}))
    assert f"decision-row-{decision.pk}" in answered


def test_an_empty_answer_is_a_clear_error_and_decides_nothing(
    client: Client, settings: Any
) -> None:
    _, request, _ = paused_wire(settings)
    client.force_login(make_reviewer())
    error = "Write the result the agent should read as the tool&#x27;s output; it is empty."

    page = respond(client, request, "   \n ")
    assert page.status_code == 400
    assert error in text(page)
    row = respond(
        client, request, "", HTTP_HX_REQUEST="true", HTTP_HX_TARGET=f"request-{request.pk}"
    )
    assert row.status_code == 200 and error in text(row)
    with pytest.raises(runs.DecisionRefused, match="it is empty"):
        runs.decide(request, make_reviewer(), runs.Decision.respond("  "))

    assert not ApprovalDecision.objects.exists()
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending


def test_a_double_submit_answers_once_and_the_run_resumes_once(
    client: Client, settings: Any, submitted: list
) -> None:
    run, request, model = paused_wire(settings)
    client.force_login(make_reviewer())
    assert respond(client, request, ANSWER).status_code == 302
    again = respond(client, request, "a second answer", HTTP_HX_REQUEST="true")
    assert "Already answered as the tool by rita" in text(again)
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert [job for job in submitted if job[0] == "resume"] == [("resume", run.pk)]

    asyncio.run(runs.resume(run.pk))
    asyncio.run(runs.resume(run.pk))  # a resume run twice: the second finds nothing to do
    assert scripted.EXECUTED == []
    stored = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    assert outputs(stored, "call_r1") == [ANSWER]
    assert "a second answer" not in json.dumps(stored)


def test_only_a_reviewer_answers_and_never_in_her_own_conversation(
    client: Client, settings: Any
) -> None:
    rita = make_reviewer()
    _, request, _ = paused_wire(settings, owner=rita)
    mallory = make_user(username="mallory")
    client.force_login(mallory)
    assert respond(client, request, ANSWER).status_code == 403
    with pytest.raises(runs.DecisionRefused, match="not allowed"):
        runs.decide(request, mallory, runs.Decision.respond(ANSWER))

    with pytest.raises(runs.NeedsAnotherReviewer, match="answer as the tool"):
        runs.decide(request, rita, runs.Decision.respond(ANSWER))
    client.force_login(rita)
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert '<fieldset class="respond" disabled>' in page
    assert not ApprovalDecision.objects.exists()

    settings.AGENTSITE_SELF_APPROVAL = True
    decision = runs.decide(request, rita, runs.Decision.respond(ANSWER))
    assert decision.kind == DecisionKind.RESPONDED


def test_the_row_and_the_request_page_offer_to_respond_as_the_tool(
    client: Client, settings: Any
) -> None:
    _, request, _ = paused_wire(settings)
    client.force_login(make_reviewer())
    inbox = text(client.get(reverse("inbox")))
    assert "Respond as the tool" in inbox
    assert f'id="row-response-{request.pk}"' in inbox and 'value="respond"' in inbox
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert f'<textarea name="response" id="response-{request.pk}"' in page
    assert 'name="action" value="respond"' in page
    assert "the agent reads exactly what you write here" in page

    # Through the row (htmx): the row answers with the decided row.
    row = respond(
        client, request, ANSWER, HTTP_HX_REQUEST="true", HTTP_HX_TARGET=f"request-{request.pk}"
    )
    body = text(row)
    assert "Answered by a reviewer" in body and "as the tool; it did not run" in body
