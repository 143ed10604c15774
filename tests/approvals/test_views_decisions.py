"""Deciding in the inbox (`approvals/views.py`): a rejection's two messages (one for the agent,
a note for reviewers) and their two readers, and separation of duties (a reviewer may not
approve a call in her own conversation)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from conversations.session import DjangoSession
from engine import events, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import (
    grant,
    make_conversation,
    make_request,
    make_reviewer,
    make_run,
    make_user,
)
from tracing.models import Span

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry", "submitted"),
]

NOTE = "Internal: the customer disputed two charges last month <b>x</b>"
MESSAGE = "We cannot send money to that account."


def text(response: Any) -> str:
    return str(response.content.decode())


# --- two messages, two readers ---------------------------------------------------------------


def wire_agent() -> tuple[Agent[Any], ScriptedModel]:
    model = ScriptedModel(
        [
            [function_call("wire_money", {"account": "acme", "amount": 80}, call_id="call_w1")],
            [assistant_message("I could not send it.", item_id="msg_w1")],
        ]
    )
    return Agent(name="Wire", model=model, tools=[scripted.wire_money]), model


def test_a_rejection_note_never_reaches_the_model_the_session_the_trace_or_the_chat(
    client: Client, settings: Any, submitted: list, traces: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, model = wire_agent()
    name = scripted.install(settings, agent)
    scripted.EXECUTED.clear()
    alice = make_user(username="alice")
    conversation = make_conversation(owner=alice, agent_name=name)
    run = runs.start_run(conversation, "send 80 to acme", alice)
    asyncio.run(runs.execute(run.pk))
    request = AgentRun.objects.get(pk=run.pk).approval_requests.get()
    published: list[events.Event] = []
    monkeypatch.setattr(events, "publish_threadsafe", published.extend)

    reviewer = make_reviewer()
    client.force_login(reviewer)
    response = client.post(
        reverse("inbox_decide", args=[request.pk]),
        {
            "action": "reject",
            "seen_hash": request.arguments_hash,
            "message": MESSAGE,
            "note": NOTE,
        },
    )
    assert response.status_code == 302
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.message, decision.note) == (MESSAGE, NOTE)

    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    traces.flush()

    # The model read the message as the tool's output, and never the note.
    last_input = json.dumps(model.last_call.input, default=str)
    assert MESSAGE in last_input
    assert "disputed" not in last_input
    stored = json.dumps(asyncio.run(DjangoSession(conversation.session_id).get_items()))
    assert MESSAGE in stored and "disputed" not in stored
    spans = json.dumps([span.span_data for span in Span.objects.filter(trace_id=run.trace_id)])
    assert MESSAGE in spans  # the decision's span and the model's input are there
    assert "disputed" not in spans
    assert published and all("disputed" not in event.model_dump_json() for event in published)
    assert scripted.EXECUTED == []

    client.force_login(alice)
    chat = text(client.get(reverse("chat", args=[conversation.session_id])))
    assert MESSAGE in chat or "could not send" in chat
    assert "disputed" not in chat

    # Reviewers read both, each labelled for its reader.
    client.force_login(reviewer)
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert "Message to the agent" in page and "may reach the customer" in page
    assert "Internal note" in page and "reviewers only" in page
    assert "the customer disputed two charges last month &lt;b&gt;x&lt;/b&gt;" in page
    history = text(client.get(reverse("inbox_history")))
    assert "disputed two charges" in history and MESSAGE in history
    assert "<b>x</b>" not in history


def test_the_admin_shows_the_note_labelled(client: Client) -> None:
    decision = ApprovalDecision.objects.create(
        request=make_request(),
        reviewer=make_reviewer(),
        approved=False,
        message=MESSAGE,
        note=NOTE,
        arguments_hash="x" * 64,
    )
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client.force_login(admin)
    page = text(client.get(reverse("admin:approvals_approvaldecision_change", args=[decision.pk])))
    assert "Internal note" in page and "Message to the agent" in page
    assert "disputed two charges" in page and "<b>x</b>" not in page


def test_the_decision_form_offers_both_boxes_labelled_for_their_readers(client: Client) -> None:
    request = make_request()
    client.force_login(make_reviewer())
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert 'name="message"' in page and 'name="note"' in page
    assert "the agent reads it and may pass it on to the customer" in page
    assert "reviewers only" in page and "never sent to the agent" in page


# --- separation of duties --------------------------------------------------------------------


def test_a_reviewer_cannot_approve_a_call_in_her_own_conversation(client: Client) -> None:
    rita = make_reviewer()
    own = make_request(run=make_run(owner=rita))
    client.force_login(rita)

    with pytest.raises(runs.NeedsAnotherReviewer) as refused:
        runs.decide(own, rita, runs.Decision.approve())
    assert "another reviewer must approve" in str(refused.value)
    with pytest.raises(runs.NeedsAnotherReviewer):
        runs.decide(own, rita, runs.Decision.approve(always=True))

    # Every path goes through the engine: the request page, a row over htmx, bulk, the admin.
    response = client.post(
        reverse("inbox_decide", args=[own.pk]),
        {"action": "approve", "seen_hash": own.arguments_hash},
        follow=True,
    )
    assert "another reviewer must approve" in text(response)
    response = client.post(
        reverse("inbox_decide", args=[own.pk]),
        {"action": "approve", "seen_hash": own.arguments_hash},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"request-{own.pk}",
    )
    assert "another reviewer must approve" in text(response)
    response = client.post(
        reverse("inbox_bulk_decide"),
        {"action": "approve", "ids": [own.pk], f"hash-{own.pk}": own.arguments_hash},
        follow=True,
    )
    assert "another reviewer must approve" in text(response)
    rita.is_staff = True
    rita.save()
    grant(rita, "approvals.view_approvalrequest")
    response = client.post(
        reverse("admin:approvals_approvalrequest_changelist"),
        {"action": "approve_selected", "_selected_action": [own.pk]},
        follow=True,
    )
    assert "another reviewer must approve" in text(response)

    own.refresh_from_db()
    assert own.status == ApprovalStatus.PENDING
    assert not ApprovalDecision.objects.filter(request=own).exists()

    # Another reviewer may; and a run she asked for in someone else's conversation is hers too.
    runs.decide(own, make_reviewer("bob"), runs.Decision.approve())
    asked = make_request(run=make_run(owner=make_user(), requested_by=rita))
    with pytest.raises(runs.NeedsAnotherReviewer):
        runs.decide(asked, rita, runs.Decision.approve())


def test_she_may_reject_her_own_call(client: Client) -> None:
    rita = make_reviewer()
    own = make_request(run=make_run(owner=rita))
    runs.decide(own, rita, runs.Decision.reject("Not like this."))
    own.refresh_from_db()
    assert own.status == ApprovalStatus.REJECTED and own.decided_by == rita


def test_the_setting_allows_self_approval(settings: Any) -> None:
    settings.AGENTSITE_SELF_APPROVAL = True
    rita = make_reviewer()
    own = make_request(run=make_run(owner=rita))
    runs.decide(own, rita, runs.Decision.approve())
    own.refresh_from_db()
    assert own.status == ApprovalStatus.APPROVED


def test_the_inbox_shows_her_own_requests_as_needing_another_reviewer(
    client: Client, settings: Any
) -> None:
    rita = make_reviewer()
    own = make_request(run=make_run(owner=rita))
    other = make_request()
    client.force_login(rita)

    html = text(client.get(reverse("inbox")))
    own_row = html[html.index(f'id="request-{own.pk}"') :]
    own_row = own_row[: own_row.index("</li>")]
    other_row = html[html.index(f'id="request-{other.pk}"') :]
    other_row = other_row[: other_row.index("</li>")]
    assert "needs another reviewer" in own_row
    assert 'value="approve" class="btn btn-approve" disabled' in own_row
    assert (
        'value="reject" class="btn btn-reject" data-reject-open>' in own_row
    )  # rejecting stays possible
    assert "needs another reviewer" not in other_row
    assert "disabled" not in other_row

    page = text(client.get(reverse("inbox_request", args=[own.pk])))
    assert "needs another reviewer" in page
    assert 'value="approve" class="btn btn-approve" disabled' in page
    assert 'value="approve_always" class="btn btn-secondary" disabled' in page

    # Bob sees it as any other request.
    client.force_login(make_reviewer("bob"))
    html = text(client.get(reverse("inbox")))
    assert "needs another reviewer" not in html

    settings.AGENTSITE_SELF_APPROVAL = True
    client.force_login(rita)
    assert "needs another reviewer" not in text(client.get(reverse("inbox")))


@pytest.mark.usefixtures("fresh_layer")
async def test_a_pushed_row_says_needs_another_reviewer_to_her_only() -> None:
    from tests.approvals.test_consumers import created, open_socket

    rita = await sync_to_async(make_reviewer)()
    bob = await sync_to_async(make_reviewer)("bob")
    own = await sync_to_async(make_request)(run=await sync_to_async(make_run)(owner=rita))
    own = await ApprovalRequest.objects.select_related("run").aget(pk=own.pk)
    sockets = {}
    for name, user, path in [
        ("rita", rita, "/ws/inbox/?show=pending"),
        ("bob", bob, "/ws/inbox/?show=pending"),
        ("rita_page", rita, f"/ws/inbox/?show=request&request={own.pk}"),
        ("bob_page", bob, f"/ws/inbox/?show=request&request={own.pk}"),
    ]:
        sockets[name], connected = await open_socket(user, path)
        assert connected

    await created(own)
    ritas = await sockets["rita"].receive_from(timeout=3)
    bobs = await sockets["bob"].receive_from(timeout=3)
    assert "needs another reviewer" in ritas
    assert 'value="approve" class="btn btn-approve" disabled' in ritas
    assert "needs another reviewer" not in bobs and "disabled" not in bobs
    for name in ("rita_page", "bob_page"):  # the badge only
        assert "needs another reviewer" not in await sockets[name].receive_from(timeout=3)

    # A rejection by her (allowed) reaches both as the decided row, the same for each.
    await runs.adecide(own.pk, rita, runs.Decision.reject())
    ritas = await sockets["rita"].receive_from(timeout=3)
    bobs = await sockets["bob"].receive_from(timeout=3)
    assert ritas == bobs and "row-decided is-rejected" in ritas
    for socket in sockets.values():
        await socket.disconnect()
