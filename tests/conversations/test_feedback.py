"""End users rate replies on the chat page (`conversations.feedback`, `views.chat_feedback`):
thumbs up or down with an optional comment, one row per run and user, only the owner, only a
finished reply; with and without htmx; shown again on reload and on a live push."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client
from django.urls import reverse

from agentsite.asgi import application
from conversations import feedback
from conversations.consumers import _render_run
from conversations.models import Conversation
from conversations.session import open_session
from engine import events, serverloop
from engine.models import AgentRun, RunStatus
from tests.agentsite.test_csp import inline_code
from tests.conversations.test_consumers import HOST, ORIGIN, session_cookie
from tests.factories import make_conversation, make_run, make_user, user_message
from tracing.models import Feedback

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def exchange(conversation: Conversation, text: str, reply: str, **kwargs: Any) -> AgentRun:
    """A finished turn: the session holds the message and the reply, the run completed."""
    kwargs.setdefault("status", RunStatus.COMPLETED)
    run = make_run(
        conversation=conversation, input=text, final_output=reply, pause_count=0, **kwargs
    )
    items = [user_message(text), assistant(reply)]
    asyncio.run(open_session(conversation.session_id).add_items(items))
    return run


@pytest.fixture
def chat(alice: Any) -> tuple[Conversation, AgentRun, AgentRun]:
    conversation = make_conversation(owner=alice)
    first = exchange(conversation, "where is order 42", "It ships tomorrow.")
    second = exchange(conversation, "thanks", "You're welcome.")
    return conversation, first, second


def url(run: AgentRun) -> str:
    return reverse("chat_feedback", args=[run.conversation.session_id, run.pk])


def rate(client: Client, run: AgentRun, score: int, comment: str | None = None, **extra: Any):
    data: dict[str, Any] = {"score": score}
    if comment is not None:
        data["comment"] = comment
    return client.post(url(run), data, **extra)


def pressed(html: str, run: AgentRun) -> dict[str, str]:
    """Which of a reply's buttons are pressed: {"thumbs-up": "false", "thumbs-down": "true"}."""
    form = re.search(rf'<form id="feedback-{run.pk}".*?</form>', html, re.S)
    assert form, f"no rating buttons for run {run.pk}"
    return {
        testid: value
        for value, testid in re.findall(
            r'aria-pressed="(true|false)"[^>]*data-testid="(thumbs-\w+)"', form.group(0)
        )
    }


def test_every_finished_reply_has_the_buttons_unpressed_with_accessible_labels(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun]
) -> None:
    conversation, first, second = chat
    html = client_for_alice.get(reverse("chat", args=[conversation.session_id])).content.decode()
    for run in (first, second):  # an earlier turn, and the latest run's block
        assert pressed(html, run) == {"thumbs-up": "false", "thumbs-down": "false"}
    assert html.count('aria-label="Helpful"') == 2 and html.count('aria-label="Not helpful"') == 2
    assert inline_code(html) == []
    # The message list re-read on reconnect carries them too.
    html = client_for_alice.get(
        reverse("chat_history", args=[conversation.session_id])
    ).content.decode()
    assert pressed(html, first) and pressed(html, second)


def test_a_thumbs_down_with_a_comment_without_javascript_and_the_reload_shows_it(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun], alice: Any
) -> None:
    conversation, first, _ = chat
    response = rate(client_for_alice, first, -1, "The date is wrong.\r\nIt shipped today.")
    assert response.status_code == 302
    assert response["Location"] == f"/chats/{conversation.session_id}/#feedback-{first.pk}"
    row = Feedback.objects.get()
    assert (row.run, row.user, row.score) == (first, alice, -1)
    assert row.comment == "The date is wrong.\nIt shipped today."

    html = client_for_alice.get(response["Location"]).content.decode()
    assert pressed(html, first) == {"thumbs-up": "false", "thumbs-down": "true"}
    # The comment is confirmed as saved, not only thanked for like a thumb.
    assert "The date is wrong." in html and "Thanks, your comment is saved." in html
    assert re.search(
        rf'<form id="feedback-{first.pk}".*?<details class="feedback-more" open>', html, re.S
    )


def test_with_htmx_only_the_buttons_come_back_and_rating_again_changes_the_one_row(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun]
) -> None:
    _, _, second = chat
    response = rate(client_for_alice, second, 1, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert html.startswith(f'<form id="feedback-{second.pk}"')
    assert pressed(html, second) == {"thumbs-up": "true", "thumbs-down": "false"}
    assert "Thanks for your feedback." in html

    rate(client_for_alice, second, -1, "too short", **HTMX)
    rate(client_for_alice, second, -1, "too short", **HTMX)  # a double click
    assert list(Feedback.objects.values_list("score", "comment")) == [(-1, "too short")]
    # A rating without the comment field keeps the comment.
    rate(client_for_alice, second, 1, **HTMX)
    assert list(Feedback.objects.values_list("score", "comment")) == [(1, "too short")]


def test_a_comment_too_long_is_refused_with_its_text_kept(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun]
) -> None:
    conversation, first, _ = chat
    long = "x" * 2001
    response = rate(client_for_alice, first, -1, long, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "A comment has at most 2000 characters (this one has 2001)" in html
    assert long in html and 'aria-invalid="true"' in html
    assert not Feedback.objects.exists()

    response = rate(client_for_alice, first, -1, long)  # without JavaScript: the chat page
    assert response.status_code == 400
    html = response.content.decode()
    assert "A comment has at most 2000 characters" in html and long in html
    assert not Feedback.objects.exists()
    # Exactly 2000, its line breaks counted once each, is fine.
    assert rate(client_for_alice, first, -1, "y\r\n" * 1000).status_code == 302
    assert len(Feedback.objects.get().comment) == 1999  # stripped of its last newline


def test_a_score_that_is_neither_up_nor_down_is_refused(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun]
) -> None:
    _, first, _ = chat
    response = rate(client_for_alice, first, 5, **HTMX)
    assert "Choose thumbs up or thumbs down." in response.content.decode()
    assert rate(client_for_alice, first, 5).status_code == 400
    assert not Feedback.objects.exists()


def test_only_the_owner_rates_and_only_a_finished_reply(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun], alice: Any
) -> None:
    conversation, first, _ = chat
    # Logged out: to the login page.
    response = Client().post(url(first), {"score": 1})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    # Another user's run: as if there were none.
    bob = Client()
    bob.force_login(make_user(username="bob"))
    assert bob.post(url(first), {"score": 1}).status_code == 404
    # A run of another conversation, under this one's URL.
    elsewhere = make_run(conversation=make_conversation(owner=alice), status=RunStatus.COMPLETED)
    wrong = reverse("chat_feedback", args=[conversation.session_id, elsewhere.pk])
    assert client_for_alice.post(wrong, {"score": 1}).status_code == 404
    # Still writing, or waiting for a reviewer: not yet.
    for status in (RunStatus.RUNNING, RunStatus.WAITING):
        running = make_run(conversation=conversation, status=status)
        response = rate(client_for_alice, running, 1)
        assert response.status_code == 409
        assert "not finished yet" in response.content.decode()
    # Only by POST, with a CSRF token.
    assert client_for_alice.get(url(first)).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(url(first), {"score": 1}).status_code == 403
    assert not Feedback.objects.exists()


def test_a_failed_reply_has_no_buttons_and_an_undone_turn_is_not_rated_in_its_place(
    client_for_alice: Client, alice: Any
) -> None:
    conversation = make_conversation(owner=alice)
    kept = exchange(conversation, "hi", "Hello!")
    # Sent again and undone: the run stays, its items left the session.
    make_run(
        conversation=conversation,
        input="hi",
        final_output="Hi there!",
        status=RunStatus.COMPLETED,
        pause_count=0,
    )
    latest = exchange(conversation, "order 7?", "", status=RunStatus.FAILED, error="Timed out.")
    html = client_for_alice.get(reverse("chat", args=[conversation.session_id])).content.decode()
    assert f'id="run-{latest.pk}"' in html and f'id="feedback-{latest.pk}"' not in html
    # "Hello!" is rated as the run that wrote it, the older one on the same text.
    assert re.findall(r'<form id="feedback-(\d+)"', html) == [str(kept.pk)]


def test_a_reply_pushed_live_carries_the_buttons_and_the_owners_rating(
    chat: tuple[Conversation, AgentRun, AgentRun], alice: Any
) -> None:
    conversation, _, second = chat
    Feedback.objects.create(run=second, user=alice, score=-1, comment="meh")
    items = asyncio.run(open_session(conversation.session_id).get_items())
    html = _render_run(conversation.pk, second.pk, items, False, alice.pk)
    assert pressed(html, second) == {"thumbs-up": "false", "thumbs-down": "true"}
    assert "meh" in html
    # A run still writing is pushed without them.
    running = make_run(conversation=conversation, input="more", status=RunStatus.RUNNING)
    html = _render_run(conversation.pk, running.pk, items, False, alice.pk)
    assert f'id="run-{running.pk}"' in html and "feedback-" not in html


async def test_the_socket_pushes_a_finished_reply_with_its_buttons(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.AGENTSITE_SWEEP_SECONDS = 0
    monkeypatch.setattr(serverloop, "_loop", None)

    def setup() -> tuple[Conversation, AgentRun, tuple[bytes, bytes]]:
        alice = make_user(username="alice")
        conversation = make_conversation(owner=alice)
        run = make_run(
            conversation=conversation,
            input="hi",
            final_output="Hello!",
            status=RunStatus.COMPLETED,
            pause_count=0,
        )
        return conversation, run, session_cookie(alice)

    conversation, run, cookie = await sync_to_async(setup)()
    items = [user_message("hi"), assistant("Hello!")]
    await open_session(conversation.session_id).add_items(items)
    communicator = WebsocketCommunicator(
        application, f"/ws/chats/{conversation.session_id}/", headers=[HOST, cookie, ORIGIN]
    )
    connected, _ = await communicator.connect()
    assert connected
    await events.publish(
        [events.RunUpdated(run_id=run.pk, conversation_id=conversation.pk, status="completed")]
    )
    frame = await communicator.receive_from(timeout=5)
    assert f'<form id="feedback-{run.pk}"' in frame
    assert pressed(frame, run) == {"thumbs-up": "false", "thumbs-down": "false"}
    await communicator.disconnect()


def test_two_ratings_at_once_make_one_row(chat: tuple[Conversation, AgentRun, AgentRun]) -> None:
    _, first, _ = chat
    owner = first.conversation.owner
    start = threading.Barrier(4)
    problems: list[BaseException] = []

    def click(score: int) -> None:
        try:
            start.wait()
            feedback.rate(first, owner, score, None)
        except BaseException as error:  # reported below
            problems.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(score,)) for score in (1, -1, 1, -1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert problems == []
    assert Feedback.objects.filter(run=first, user=owner).count() == 1


def test_a_thumbs_down_with_a_comment_reaches_the_trace_and_the_lists_filter(
    client_for_alice: Client, chat: tuple[Conversation, AgentRun, AgentRun]
) -> None:
    """The issue's "done when": the rating an end user gives on the chat page is what the
    operator reads on the run's trace and what the trace list's feedback filter finds."""
    from tests.factories import make_trace, make_viewer

    _, first, second = chat
    rated, other = make_trace(run=first), make_trace(run=second)
    assert rate(client_for_alice, first, -1, "Wrong order, mail bob@example.com").status_code == 302
    operator = Client()
    operator.force_login(make_viewer())
    page = operator.get(reverse("trace_detail", args=[rated.trace_id])).content.decode()
    assert "Thumbs down" in page and "Wrong order, mail [email]" in page
    assert "bob@example.com" not in page
    listed = operator.get(reverse("trace_list"), {"feedback": "down"}).content.decode()
    assert f'id="trace-{rated.pk}"' in listed and f'id="trace-{other.pk}"' not in listed
    assert "1 thumbs down" in listed
    liked = operator.get(reverse("trace_list"), {"feedback": "up"}).content.decode()
    assert f'id="trace-{rated.pk}"' not in liked
