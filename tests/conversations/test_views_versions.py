"""Versions of a conversation on the chat page: editing an earlier message forks the
conversation there and sends the edited text on the new version; the switcher goes back and
forth. Only the owner, never while the conversation is busy, and anything she typed that is
refused stays in its box."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape

from conversations.actions import EDIT_BUSY, EDIT_MOVED, EDIT_WAITING, SEND_MOVED
from conversations.consumers import _render_run
from conversations.models import Branch, Conversation, SessionItem, TurnUsage
from conversations.session import DjangoSession, open_session
from conversations.views import SEND_NO_SUCH_VERSION, TOO_LONG
from engine import events, runs
from engine.models import AgentRun, RunStatus
from tests.factories import make_conversation, make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]

HTMX = {"HX-Request": "true"}
QUESTIONS = ["where is order 44", "where is order 46", "where is order 42"]


@pytest.fixture
def conversation(
    conversation: Conversation, client_for_alice: Client, submitted: list
) -> Conversation:
    """alice's conversation with the support desk, here with three turns, each answered."""
    for text in QUESTIONS:
        response = client_for_alice.post(
            f"/chats/{conversation.session_id}/messages/", {"text": text}
        )
        assert response.status_code == 302
        run_latest(conversation)
    return conversation


def run_latest(conversation: Conversation) -> AgentRun:
    run = AgentRun.objects.filter(conversation=conversation).order_by("-pk").first()
    assert run is not None
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.error
    return run


def edit(client: Client, conversation: Conversation, turn: int, text: str, **extra: Any) -> Any:
    data = {"text": text, "branch": extra.pop("branch", "main")}
    return client.post(f"/chats/{conversation.session_id}/turns/{turn}/edit/", data, **extra)


def switch(client: Client, conversation: Conversation, branch: str) -> Any:
    return client.post(f"/chats/{conversation.session_id}/branches/", {"branch": branch})


def user_bubbles(response: Any) -> list[str]:
    html = response.content.decode()
    return re.findall(r'<div class="msg msg-user"[^>]*><div class="bubble">(.*?)</div>', html, re.S)


def current_version(response: Any) -> str:
    match = re.search(r'data-testid="version-current"[^>]*>(.*?)</span>', response.content.decode())
    assert match, "no version switcher"
    return match.group(1)


def test_editing_her_second_message_forks_there_and_sends_it(
    client_for_alice: Client, conversation: Conversation
) -> None:
    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert 'data-testid="versions"' not in page.content.decode()  # one version only
    assert page.content.decode().count('data-testid="edit-message"') == 3

    response = edit(client_for_alice, conversation, 2, "where is order 42 really")

    assert response.status_code == 302
    assert response.url == f"/chats/{conversation.session_id}/#composer"
    conversation.refresh_from_db()
    assert conversation.current_branch == "edit-1"
    run = AgentRun.objects.order_by("-pk").first()
    assert run is not None and run.input == "where is order 42 really"
    assert AgentRun.objects.get(pk=run.pk).branch == "edit-1"
    run_latest(conversation)

    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == ["where is order 44", "where is order 42 really"]
    assert current_version(page) == "Edit 1"
    assert re.search(r'data-branch="main"[^>]*>Original</button>', page.content.decode())
    # The original is kept as it was.
    kept = asyncio.run(DjangoSession(conversation.session_id).get_items(branch_id="main"))
    assert [i["content"] for i in kept if i.get("role") == "user"] == QUESTIONS
    assert TurnUsage.objects.filter(conversation=conversation, branch="edit-1", turn=2).exists()


def test_switching_back_shows_the_original_and_forth_the_edit(
    client_for_alice: Client, conversation: Conversation
) -> None:
    edit(client_for_alice, conversation, 2, "where is order 42 really")
    run_latest(conversation)

    response = switch(client_for_alice, conversation, "main")

    assert response.status_code == 302
    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == QUESTIONS
    assert current_version(page) == "Original"
    assert "Now showing: Original." in page.content.decode()
    history = client_for_alice.get(f"/chats/{conversation.session_id}/history/")
    assert user_bubbles(history) == QUESTIONS  # the re-read of the messages agrees

    switch(client_for_alice, conversation, "edit-1")
    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == ["where is order 44", "where is order 42 really"]
    # A new message goes on the version shown.
    client_for_alice.post(f"/chats/{conversation.session_id}/messages/", {"text": "thanks"})
    run_latest(conversation)
    session = DjangoSession(conversation.session_id)
    edited = asyncio.run(session.get_items(branch_id="edit-1"))
    assert [i["content"] for i in edited if i.get("role") == "user"][-1] == "thanks"
    assert len(asyncio.run(session.get_items(branch_id="main"))) == len(
        asyncio.run(DjangoSession(conversation.session_id, branch="main").get_items())
    )


def test_the_first_message_and_an_edited_edit_fork_too(
    client_for_alice: Client, conversation: Conversation
) -> None:
    edit(client_for_alice, conversation, 1, "where is order 46")
    run_latest(conversation)
    edit(client_for_alice, conversation, 1, "where is order 44 now", branch="edit-1")
    run_latest(conversation)

    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == ["where is order 44 now"]
    labels = re.findall(
        r'data-testid="version-(?:current|switch)"[^>]*>(.*?)<', page.content.decode()
    )
    assert labels == ["Original", "Edit 1", "Edit 2"]
    assert list(Branch.objects.values_list("branch_id", "source", "from_turn")) == [
        ("edit-1", "main", 1),
        ("edit-2", "edit-1", 1),
    ]


def test_an_edit_is_refused_while_the_agent_answers_and_keeps_the_text(
    client_for_alice: Client, conversation: Conversation
) -> None:
    client_for_alice.post(f"/chats/{conversation.session_id}/messages/", {"text": "and order 46?"})

    response = edit(client_for_alice, conversation, 2, "my edited <b>text</b>")

    assert response.status_code == 409
    html = response.content.decode()
    assert EDIT_BUSY in html
    assert "my edited &lt;b&gt;text&lt;/b&gt;</textarea>" in html
    assert '<details class="msg-edit" open>' in html
    assert not Branch.objects.exists()
    assert Conversation.objects.get(pk=conversation.pk).current_branch == "main"

    response = switch(client_for_alice, conversation, "main")
    assert (
        "You can switch versions once the agent has finished."
        in client_for_alice.get(response.url).content.decode()
    )


def test_an_edit_is_refused_while_a_request_waits(
    client_for_alice: Client, conversation: Conversation
) -> None:
    client_for_alice.post(
        f"/chats/{conversation.session_id}/messages/", {"text": "cancel order 42"}
    )
    run = AgentRun.objects.order_by("-pk").first()
    assert run is not None
    asyncio.run(runs.execute(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.WAITING

    response = edit(client_for_alice, conversation, 1, "hello", headers=HTMX)

    # For htmx, the Edit control alone comes back, open, with the text and why (a 200: htmx
    # swaps no error).
    assert response.status_code == 200
    html = response.content.decode()
    assert html.startswith('<details class="msg-edit" open>')
    assert escape(EDIT_WAITING) in html and "hello</textarea>" in html
    assert not Branch.objects.exists()


@pytest.mark.parametrize(
    ("turn", "text", "error"),
    [
        (2, "", "The message is empty."),
        (2, "   ", "The message is empty."),
        (2, "x" * (runs.MAX_INPUT_CHARS + 1), "The message is too long"),
        (9, "hello", "There is no message 9 in this version of the conversation to edit."),
        (0, "hello", "There is no message 0 in this version of the conversation to edit."),
    ],
)
def test_bad_input_is_refused_with_nothing_changed(
    client_for_alice: Client, conversation: Conversation, turn: int, text: str, error: str
) -> None:
    runs_before = AgentRun.objects.count()

    response = edit(client_for_alice, conversation, turn, text)

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not Branch.objects.exists()
    assert AgentRun.objects.count() == runs_before
    assert Conversation.objects.get(pk=conversation.pk).current_branch == "main"
    assert len(asyncio.run(DjangoSession(conversation.session_id).get_items())) == 12


def test_a_body_beyond_the_upload_limit_is_refused_as_too_long(
    client_for_alice: Client, conversation: Conversation, settings: Any
) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = edit(client_for_alice, conversation, 2, "x" * 2000)
    assert response.status_code == 400
    assert TOO_LONG in response.content.decode()
    assert not Branch.objects.exists()


def test_a_request_without_its_version_or_a_missing_version_is_refused(
    client_for_alice: Client, conversation: Conversation
) -> None:
    url = f"/chats/{conversation.session_id}/turns/2/edit/"
    assert client_for_alice.post(url, {"text": "hello"}).status_code == 400
    assert client_for_alice.post(f"/chats/{conversation.session_id}/branches/").status_code == 400

    response = switch(client_for_alice, conversation, "edit-7")
    assert response.status_code == 302
    page = client_for_alice.get(response.url).content.decode()
    assert "That version of the conversation has no messages any more." in page
    assert not Branch.objects.exists()


def test_an_edit_from_a_page_showing_another_version_is_not_applied(
    client_for_alice: Client, conversation: Conversation
) -> None:
    edit(client_for_alice, conversation, 2, "where is order 42 really")
    run_latest(conversation)

    # A page still showing the original: the conversation is on Edit 1 now.
    response = edit(client_for_alice, conversation, 3, "and order 44?", branch="main")

    assert response.status_code == 302
    assert EDIT_MOVED in client_for_alice.get(response.url).content.decode()
    assert list(Branch.objects.values_list("branch_id", flat=True)) == ["edit-1"]


def send(client: Client, conversation: Conversation, text: str, **data: Any) -> Any:
    headers = data.pop("headers", {})
    return client.post(
        f"/chats/{conversation.session_id}/messages/", {"text": text, **data}, headers=headers
    )


def test_a_message_from_a_page_showing_another_version_is_not_sent(
    client_for_alice: Client, conversation: Conversation
) -> None:
    """Two windows: one shows the original, the other switched to Edit 1 since. A message
    sent from the first would go on a version its page does not show."""
    page = client_for_alice.get(f"/chats/{conversation.session_id}/").content.decode()
    assert '<input type="hidden" name="branch" value="main" form="composer"' in page
    edit(client_for_alice, conversation, 2, "where is order 42 really")
    run_latest(conversation)
    runs_before = AgentRun.objects.count()

    stale = send(client_for_alice, conversation, "and order 46?", branch="main")
    assert stale.status_code == 409
    assert escape(SEND_MOVED) in stale.content.decode()
    assert "and order 46?</textarea>" in stale.content.decode()  # kept in the box
    assert current_version(stale) == "Edit 1"  # and the page shows that version now
    htmx = send(client_for_alice, conversation, "and order 46?", branch="main", headers=HTMX)
    assert htmx.status_code == 200 and htmx["HX-Trigger"] == "resync"
    assert escape(SEND_MOVED) in htmx.content.decode()
    assert AgentRun.objects.count() == runs_before

    for bad in ("\x00", "x" * 500):
        refused = send(client_for_alice, conversation, "and order 46?", branch=bad)
        assert refused.status_code == 400
        assert escape(SEND_NO_SUCH_VERSION) in refused.content.decode()
        assert "and order 46?</textarea>" in refused.content.decode()
    assert AgentRun.objects.count() == runs_before

    # From a page that shows Edit 1, or from a client that does not say: sent, on Edit 1.
    assert send(client_for_alice, conversation, "thanks", branch="edit-1").status_code == 302
    run_latest(conversation)
    assert send(client_for_alice, conversation, "bye").status_code == 302
    run_latest(conversation)
    edited = asyncio.run(DjangoSession(conversation.session_id).get_items(branch_id="edit-1"))
    assert [i["content"] for i in edited if i.get("role") == "user"][-2:] == ["thanks", "bye"]
    history = client_for_alice.get(f"/chats/{conversation.session_id}/history/").content.decode()
    assert '<input type="hidden" name="branch" value="edit-1" form="composer"' in history


def test_a_switch_an_edit_an_undo_and_a_clear_tell_the_conversation_s_open_pages(
    client_for_alice: Client, conversation: Conversation, monkeypatch: Any
) -> None:
    published: list[Any] = []
    monkeypatch.setattr(events, "publish_threadsafe", lambda sent: published.extend(sent))

    def changes() -> int:
        found = [e for e in published if isinstance(e, events.ConversationChanged)]
        published.clear()
        assert all(e.conversation_id == conversation.pk for e in found)
        return len(found)

    edit(client_for_alice, conversation, 2, "where is order 42 really")
    assert changes() == 1
    run_latest(conversation)
    switch(client_for_alice, conversation, "main")
    assert changes() == 1
    client_for_alice.post(f"/chats/{conversation.session_id}/undo/")
    assert changes() == 1
    client_for_alice.post(f"/chats/{conversation.session_id}/clear/")
    assert changes() == 1
    # Nothing changed, nothing said: a switch refused, an undo with nothing to undo.
    switch(client_for_alice, conversation, "edit-9")
    client_for_alice.post(f"/chats/{conversation.session_id}/undo/")
    assert changes() == 0


def test_an_htmx_edit_goes_to_the_page_of_the_new_version(
    client_for_alice: Client, conversation: Conversation
) -> None:
    response = edit(client_for_alice, conversation, 3, "where is order 46 again", headers=HTMX)
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/chats/{conversation.session_id}/#composer"
    assert Conversation.objects.get(pk=conversation.pk).current_branch == "edit-1"


def test_only_the_owner_may_edit_or_switch(
    client_for_alice: Client, conversation: Conversation
) -> None:
    bob = Client()
    bob.force_login(make_user(username="bob"))
    assert edit(bob, conversation, 2, "mine now").status_code == 404
    assert switch(bob, conversation, "main").status_code == 404

    visitor = Client()
    for response in (edit(visitor, conversation, 2, "x"), switch(visitor, conversation, "main")):
        assert response.status_code == 302
        assert response.url.startswith("/accounts/login/?next=")

    forged = Client(enforce_csrf_checks=True)
    forged.force_login(conversation.owner)
    assert edit(forged, conversation, 2, "no token").status_code == 403
    assert switch(forged, conversation, "main").status_code == 403
    assert not Branch.objects.exists()
    assert AgentRun.objects.filter(conversation=conversation).count() == 3


def test_what_she_wrote_is_only_text_in_the_edit_box_and_the_versions(
    client_for_alice: Client, alice: Any, submitted: list
) -> None:
    conversation = make_conversation(owner=alice, agent_name="support")
    payload = "</textarea><script>alert(1)</script>"
    client_for_alice.post(f"/chats/{conversation.session_id}/messages/", {"text": payload})
    run_latest(conversation)

    html = client_for_alice.get(f"/chats/{conversation.session_id}/").content.decode()

    assert "<script>alert(1)</script>" not in html
    assert "&lt;/textarea&gt;&lt;script&gt;alert(1)&lt;/script&gt;</textarea>" in html


def test_a_push_of_a_run_of_another_version_renders_nothing(
    client_for_alice: Client, conversation: Conversation
) -> None:
    first = AgentRun.objects.filter(conversation=conversation).order_by("pk").first()
    assert first is not None
    edit(client_for_alice, conversation, 2, "where is order 42 really")
    edited = run_latest(conversation)
    items = asyncio.run(open_session(conversation.session_id).get_items())

    # The page shows Edit 1: a run of the original is not pushed into it.
    assert _render_run(conversation.pk, first.pk, items, False) == ""
    pushed = _render_run(conversation.pk, edited.pk, items, False, None, [1, 1, 1, 1, 2, 2, 2, 2])
    assert "where is order 42 really" in pushed
    assert 'data-testid="edit-message"' in pushed  # finished: its message can be edited


def test_undo_takes_back_the_last_exchange_of_the_version_shown_only(
    client_for_alice: Client, conversation: Conversation
) -> None:
    edit(client_for_alice, conversation, 2, "where is order 42 really")
    run_latest(conversation)

    client_for_alice.post(f"/chats/{conversation.session_id}/undo/")

    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == ["where is order 44"]
    switch(client_for_alice, conversation, "main")
    assert user_bubbles(client_for_alice.get(f"/chats/{conversation.session_id}/")) == QUESTIONS


def test_clear_empties_every_version_and_starts_again_from_the_original(
    client_for_alice: Client, conversation: Conversation
) -> None:
    edit(client_for_alice, conversation, 2, "where is order 42 really")
    run_latest(conversation)

    asked = client_for_alice.get(f"/chats/{conversation.session_id}/clear/").content.decode()
    assert "in every version of it (the original and each edit)" in asked
    client_for_alice.post(f"/chats/{conversation.session_id}/clear/")

    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == []
    assert 'data-testid="versions"' not in page.content.decode()
    assert Conversation.objects.get(pk=conversation.pk).current_branch == "main"
    assert not TurnUsage.objects.filter(conversation=conversation).exists()


def test_an_encrypted_conversation_forks_the_same(
    client_for_alice: Client, alice: Any, settings: Any, submitted: list
) -> None:
    from cryptography.fernet import Fernet

    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()
    settings.AGENTSITE_SESSION_TTL = 0
    conversation = make_conversation(owner=alice, agent_name="support")
    for text in QUESTIONS:
        client_for_alice.post(f"/chats/{conversation.session_id}/messages/", {"text": text})
        run_latest(conversation)

    response = edit(client_for_alice, conversation, 2, "where is order 42 really")

    assert response.status_code == 302
    run_latest(conversation)
    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert user_bubbles(page) == ["where is order 44", "where is order 42 really"]
    assert current_version(page) == "Edit 1"
    stored = SessionItem.objects.filter(conversation=conversation).values_list("payload", flat=True)
    assert all("__enc__" in payload for payload in stored)
