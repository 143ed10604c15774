"""The chat page says what is so after a reload or a resume: what a streaming run has said so
far, the title and who answers, what a waiting call waits for in plain words; and the request
page stops saying it waits once the request is decided. (The browser half:
tests/browser/test_chat_after_reload.py; the streamed text: tests/engine/runs/test_streaming.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from approvals.models import ApprovalRequest
from conversations.consumers import _render_run
from conversations.models import Conversation
from conversations.rendering import call_for, plain_call
from conversations.session import DjangoSession
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.approvals.test_consumers import open_socket
from tests.factories import (
    client_of,
    make_conversation,
    make_request,
    make_reviewer,
    make_run,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

HTMX = {"HX-Request": "true"}
CANCEL_42 = "cancel an order that has not been delivered yet (order 42)"


# --- what has streamed, across a reload -----------------------------------------------------


def test_the_page_shows_what_a_streaming_run_has_said_so_far(
    conversation: Conversation, alice: Any
) -> None:
    run = make_run(conversation=conversation, status=RunStatus.RUNNING, pause_count=0)
    AgentRun.objects.filter(pk=run.pk).update(streamed_text="Order 7 <is> shipp")

    page = client_of(alice).get(f"/chats/{conversation.session_id}/").text

    assert (
        f'<span id="run-{run.pk}-text" class="stream" data-run="{run.pk}" data-segment="0" '
        'data-length="18">Order 7 &lt;is&gt; shipp</span>'
    ) in page
    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
    assert "Order 7" not in client_of(alice).get(f"/chats/{conversation.session_id}/").text


# --- the header and the composer ------------------------------------------------------------


def test_the_first_message_s_push_titles_the_conversation(
    conversation: Conversation, alice: Any, submitted: list
) -> None:
    assert "New conversation" in client_of(alice).get(f"/chats/{conversation.session_id}/").text
    run = runs.start_run(conversation, "where is <order> 7", alice)

    pushed = _render_run(conversation.pk, run.pk, [], False)

    assert pushed.startswith('<div id="after-run-0" class="slot" hx-swap-oob="outerHTML">')
    assert (
        '<h1 id="chat-title" class="chat-title" data-testid="chat-title" hx-swap-oob="true">'
        "where is &lt;order&gt; 7</h1>"
    ) in pushed
    assert ">Support desk</span>" in pushed


def test_a_refusal_while_busy_says_what_it_waits_for(
    conversation: Conversation, alice: Any
) -> None:
    run = make_run(conversation=conversation, status=RunStatus.WAITING)
    client = client_of(alice)
    url = f"/chats/{conversation.session_id}/messages/"

    waiting = client.post(url, {"text": "and refund it"}, headers=HTMX).text
    assert 'id="composer-error" class="composer-error" role="alert" data-busy="waiting"' in waiting

    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    working = client.post(url, {"text": "and refund it"}, headers=HTMX).text
    assert 'data-busy="working"' in working

    AgentRun.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
    assert "data-busy" not in client.post(url, {"text": ""}, headers=HTMX).text


# --- waiting, in plain words ----------------------------------------------------------------


def test_a_waiting_call_reads_plainly_and_operators_also_see_the_call(
    conversation: Conversation, alice: Any
) -> None:
    run = make_run(conversation=conversation)
    make_request(run=run)
    rita = make_reviewer()
    reviewers_own = make_conversation(owner=rita, agent_name="support")
    make_request(run=make_run(conversation=reviewers_own))

    hers = client_of(alice).get(f"/chats/{conversation.session_id}/").text
    assert f"A person will confirm: {CANCEL_42}</p>" in hers
    assert "cancel_order(order_id=42)" not in hers

    operators = client_of(rita).get(f"/chats/{reviewers_own.session_id}/").text
    assert (
        f'A person will confirm: {CANCEL_42} <code class="call">cancel_order(order_id=42)</code>'
    ) in operators


def test_plain_words_come_from_the_tool_s_description() -> None:
    assert plain_call("Send money. Audited.", "wire_money", {"account_id": "b", "amount": 5}) == (
        "send money (account b, amount 5)"
    )
    assert plain_call("", "wire_money", {"note": None}) == "wire money"
    assert plain_call("A tool.\n\nArgs: ...", "t", {}) == "A tool"
    long = plain_call("Write.", "t", {"body": "x" * 100, "a": 1, "b": 2, "c": 3, "d": 4})
    assert long == f"write (body {'x' * 39}…, a 1, b 2, c 3, …)"


def test_a_call_whose_arguments_were_edited_is_never_put_in_plain_words() -> None:
    request = make_request()
    ApprovalRequest.objects.filter(pk=request.pk).update(arguments={"order_id": 7})
    request.refresh_from_db()

    call = call_for(request)
    assert call.plain == call.raw == request.call_display()
    assert "7" not in call.plain


# --- the request page -----------------------------------------------------------------------


async def test_the_request_page_stops_saying_waiting_for_you_once_decided() -> None:
    request = await sync_to_async(make_request)()
    conversation = await Conversation.objects.aget(runs__approval_requests=request)
    await DjangoSession(conversation.session_id).add_items(
        [
            {"role": "user", "content": "cancel order 42"},
            {
                "type": "function_call",
                "call_id": request.call_id,
                "name": "cancel_order",
                "arguments": '{"order_id": 42}',
            },
        ]
    )
    rita = await sync_to_async(make_reviewer)()
    bob = await sync_to_async(make_reviewer)("bob")
    url = f"/inbox/{request.pk}/"
    page = await sync_to_async(lambda: client_of(rita).get(url).text)()
    state = f'<span id="call-state-{request.pk}" class="who-label"'
    assert f"{state}>waiting for you</span>" in page
    communicator, connected = await open_socket(
        rita, f"/ws/inbox/?show=request&request={request.pk}"
    )
    assert connected

    await sync_to_async(runs.decide)(request.pk, bob, runs.Decision.reject())

    frame = await communicator.receive_from(timeout=2)
    assert f'{state} hx-swap-oob="true">rejected by bob</span>' in frame
    page = await sync_to_async(lambda: client_of(rita).get(url).text)()
    assert f"{state}>rejected by bob</span>" in page
    assert "waiting for you" not in page
    await communicator.disconnect()
