"""The chat pages through the Django test client: the list, sending, history, undo, clear,
rename, and who may see what. Runs are driven by the test, as in
tests/engine/runs/test_driving.py."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.db.backends import utils as db_utils
from django.test import Client
from django.urls import reverse

from approvals.models import ApprovalRequest
from conversations.actions import BUSY_WAITING, BUSY_WORKING, UNREADABLE
from conversations.models import Conversation, SessionItem
from conversations.session import AuditedEncryptedSession, DjangoSession, open_session
from engine import runs
from engine.models import AgentRun, RunStatus
from engine.runs import rows
from tests.factories import REVIEWER, make_conversation, make_run, make_user, user_message

# How the chat says `cancel_order(order_id=42)` to the person who asked: its tool's description.
CANCEL_42 = "cancel an order that has not been delivered yet (order 42)"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry"),
]

HTMX = {"HX-Request": "true"}


def add_items(conversation: Conversation, items: list[dict[str, Any]]) -> None:
    asyncio.run(open_session(conversation.session_id).add_items(items))


def items_of(conversation: Conversation) -> list[dict[str, Any]]:
    return asyncio.run(open_session(conversation.session_id).get_items())


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def send(client: Client, conversation: Conversation, text: str, **extra: Any) -> Any:
    return client.post(f"/chats/{conversation.session_id}/messages/", {"text": text}, **extra)


def turn(client: Client, conversation: Conversation, text: str) -> AgentRun:
    """Send a message and run the agent on it to its end or its pause."""
    response = send(client, conversation, text)
    assert response.status_code == 302, response.content.decode()[:500]
    run = AgentRun.objects.filter(conversation=conversation).order_by("-pk").first()
    assert run is not None
    asyncio.run(runs.execute(run.pk))
    run.refresh_from_db()
    return run


def page_text(response: Any) -> str:
    """The visible text of a page, tags stripped and spaces collapsed."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", response.content.decode(), flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def textarea_value(response: Any) -> str:
    match = re.search(
        r'<textarea id="id_text"[^>]*>\n?(.*?)</textarea>', response.content.decode(), re.S
    )
    assert match, "no message box"
    return match.group(1)


# --- the list ---------------------------------------------------------------------------------


def test_it_lists_only_her_own_conversations_newest_first(
    client_for_alice: Client, alice: Any
) -> None:
    older = make_conversation(owner=alice, title="Refund <b>question</b>")
    newer = make_conversation(owner=alice, agent_name="support")
    add_items(newer, [user_message("where is   order 7?"), assistant("Shipped.")])
    Conversation.objects.filter(pk=older.pk).update(updated=newer.updated.replace(year=2020))
    bob = make_user(username="bob")
    make_conversation(owner=bob, title="Bob's secret chat")

    response = client_for_alice.get("/chats/")

    body = response.content.decode()
    assert response.status_code == 200
    assert "Bob" not in body
    assert "Refund &lt;b&gt;question&lt;/b&gt;" in body
    assert "where is order 7?" in body  # the first message, as the preview of an untitled chat
    assert body.index("where is order 7?") < body.index("Refund &lt;b&gt;")
    assert f"/chats/{newer.session_id}/" in body and f"/chats/{older.session_id}/" in body
    # Who answers, by its own name as the chat's header says it, not the registry's key.
    assert '<span class="agent-chip">Support desk</span>' in body and " ago" in body
    assert ">support<" not in body


def test_the_list_names_the_agent_that_answers_now(client_for_alice: Client, alice: Any) -> None:
    handed = make_conversation(owner=alice, agent_name="support", current_agent="support/Billing")
    add_items(handed, [user_message("I have a billing question")])

    body = client_for_alice.get("/chats/").content.decode()

    assert '<span class="agent-chip">Billing</span>' in body


def test_a_conversation_opened_and_left_unused_is_not_listed_and_is_reused(
    client_for_alice: Client, alice: Any
) -> None:
    first = client_for_alice.post(reverse("chat_new"), {})
    again = client_for_alice.post(reverse("chat_new"), {})

    assert first["Location"] == again["Location"]  # the same empty one, not a second
    assert Conversation.objects.filter(owner=alice).count() == 1
    listing = client_for_alice.get("/chats/").content.decode()
    assert "No conversations yet" in listing
    assert first["Location"] not in listing

    used = Conversation.objects.get(owner=alice)
    add_items(used, [user_message("where is order 44")])
    assert first["Location"] in client_for_alice.get("/chats/").content.decode()
    assert client_for_alice.post(reverse("chat_new"), {})["Location"] != first["Location"]


def test_it_starts_a_new_conversation_with_the_only_agent(
    client_for_alice: Client, alice: Any
) -> None:
    listing = client_for_alice.get("/chats/")
    assert "New conversation" in listing.content.decode()
    assert '<select name="agent"' not in listing.content.decode()  # one agent: no choice

    response = client_for_alice.post("/chats/new/")

    conversation = Conversation.objects.get(owner=alice)
    assert conversation.agent_name == "support"
    assert response.status_code == 302
    assert response["Location"] == f"/chats/{conversation.session_id}/"
    assert client_for_alice.get(response["Location"]).status_code == 200


def test_it_lets_her_choose_the_agent_when_there_are_several(
    client_for_alice: Client, alice: Any, settings: Any
) -> None:
    settings.AGENTSITE_AGENTS = {
        "support": "demo.agents.support_desk",
        "billing": "demo.agents.billing",
    }
    listing = client_for_alice.get("/chats/").content.decode()
    assert '<select name="agent"' in listing and '<option value="billing">' in listing

    client_for_alice.post("/chats/new/", {"agent": "billing"})
    assert Conversation.objects.get(owner=alice).agent_name == "billing"

    refused = client_for_alice.post("/chats/new/", {"agent": "nobody"}, follow=True)
    assert Conversation.objects.filter(owner=alice).count() == 1
    assert "Choose one of the agents" in refused.content.decode()


# --- sending ---------------------------------------------------------------------------------


def test_sending_a_message_starts_a_run_after_commit(
    client_for_alice: Client, conversation: Conversation, alice: Any, submitted: list
) -> None:
    response = send(client_for_alice, conversation, "  where is order 7  ")

    run = AgentRun.objects.get(conversation=conversation)
    assert response.status_code == 302
    # A plain post (no script): the page it lands on follows the reply by itself.
    assert response.url == f"/chats/{conversation.session_id}/?follow=1#composer"
    assert run.input == "where is order 7"
    assert run.requested_by == alice
    assert run.status == RunStatus.QUEUED
    assert submitted == [("execute", run.pk)]
    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    assert f'id="run-{run.pk}"' in page.content.decode()
    assert "where is order 7" in page_text(page)


def test_htmx_sending_answers_with_an_empty_message_box(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    response = send(client_for_alice, conversation, "where is order 7", headers=HTMX)

    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<form id="composer"')
    assert textarea_value(response) == ""
    assert "autofocus" in body
    assert AgentRun.objects.filter(conversation=conversation).count() == 1


def test_it_refuses_an_empty_message_and_keeps_what_was_typed(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    empty = send(client_for_alice, conversation, "   \n ", headers=HTMX)
    assert empty.status_code == 200
    assert "The message is empty." in empty.content.decode()
    assert textarea_value(empty) == "   \n "

    long_text = "<b>" + "x" * runs.MAX_INPUT_CHARS
    plain = send(client_for_alice, conversation, long_text)
    assert plain.status_code == 400
    assert "The message is too long" in plain.content.decode()
    assert textarea_value(plain) == long_text.replace("<b>", "&lt;b&gt;")
    assert AgentRun.objects.count() == 0
    assert submitted == []


def test_it_refuses_a_second_message_while_the_agent_works_or_waits(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    send(client_for_alice, conversation, "cancel order 42")
    run = AgentRun.objects.get()

    working = send(client_for_alice, conversation, "and order 7?", headers=HTMX)
    assert BUSY_WORKING in working.content.decode()
    assert textarea_value(working) == "and order 7?"

    asyncio.run(runs.execute(run.pk))
    assert AgentRun.objects.get().status == RunStatus.WAITING
    waiting = send(client_for_alice, conversation, "and order 7?")
    assert waiting.status_code == 400
    assert BUSY_WAITING.replace("'", "&#x27;") in waiting.content.decode()
    assert textarea_value(waiting) == "and order 7?"
    assert AgentRun.objects.count() == 1
    assert submitted == [("execute", run.pk)]


def test_a_double_click_starts_one_run(
    alice: Any, conversation: Conversation, submitted: list
) -> None:
    clients = [Client(), Client()]
    for client in clients:
        client.force_login(alice)
    start_line = threading.Barrier(2)
    statuses: list[int] = []

    def click(client: Client) -> None:
        start_line.wait()
        statuses.append(send(client, conversation, "where is order 7", headers=HTMX).status_code)

    threads = [threading.Thread(target=click, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert statuses == [200, 200]
    assert AgentRun.objects.filter(conversation=conversation).count() == 1
    assert len(submitted) == 1


def test_she_can_send_again_once_the_reply_is_there(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    first = turn(client_for_alice, conversation, "where is order 7")
    assert first.status == RunStatus.COMPLETED, first.error
    second = turn(client_for_alice, conversation, "where is order 3")
    assert second.status == RunStatus.COMPLETED, second.error
    assert AgentRun.objects.count() == 2


# --- the history -----------------------------------------------------------------------------


def test_her_text_is_escaped_and_the_agent_s_markdown_is_sanitized(
    client_for_alice: Client, conversation: Conversation
) -> None:
    add_items(
        conversation,
        [
            user_message("<script>alert('user')</script> **not bold**"),
            assistant(
                "**Bold** and a [link](https://example.com).\n\n- one\n- two\n\n"
                "<script>alert('agent')</script><img src=x onerror=alert(1)> "
                "[bad](javascript:alert(1))"
            ),
        ],
    )

    body = client_for_alice.get(f"/chats/{conversation.session_id}/").content.decode()

    assert "&lt;script&gt;alert(&#x27;user&#x27;)&lt;/script&gt; **not bold**" in body
    assert "<strong>Bold</strong>" in body
    assert (
        '<a href="https://example.com" target="_blank" rel="noopener noreferrer nofollow">' in body
    )
    assert "<li>one</li>" in body
    assert "<script>alert" not in body
    assert "<img" not in body
    assert 'href="javascript' not in body


def test_a_finished_turn_shows_her_message_the_tool_note_and_the_reply(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    # Order 44 is one of alice's own (the tools see only the asker's orders).
    run = turn(client_for_alice, conversation, "where is order 44")
    assert run.status == RunStatus.COMPLETED, run.error

    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    text = page_text(page)

    assert "where is order 44" in text
    # In plain words for her, from the tool's description; the call itself is for operators.
    assert "Look up one of the customer&#x27;s orders: item, amount, status and what was" in text
    assert "refunded (order 44) → " in text
    assert "lookup_order(" not in text
    assert "Here is what I found:" in text and "shipped" in text
    assert "data-active" not in page.content.decode()
    assert text.index("where is order 44") < text.index("Look up one") < text.index("Here is")


def test_a_paused_run_says_what_it_waits_for(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    run = turn(client_for_alice, conversation, "cancel order 42")
    assert run.status == RunStatus.WAITING, run.error

    page = client_for_alice.get(f"/chats/{conversation.session_id}/")
    fragment = client_for_alice.get(f"/chats/{conversation.session_id}/history/", headers=HTMX)

    for response in (page, fragment):
        body = response.content.decode()
        # In plain words from the tool's description; the call itself is for operators.
        assert f"A person will confirm: {CANCEL_42}" in body
        assert "cancel_order(order_id=42)" not in body
        assert f'<div id="run-{run.pk}" class="turn" data-status="waiting" data-active>' in body
    assert fragment.content.decode().lstrip().startswith('<div id="messages"')
    assert 'hx-trigger="resync from:body' in fragment.content.decode()
    assert "Waiting for approval" in page_text(client_for_alice.get("/chats/"))


def test_after_a_rejection_the_reply_says_so(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    run = turn(client_for_alice, conversation, "cancel order 42")
    rita = make_user(perms=[REVIEWER], username="rita")
    runs.decide(ApprovalRequest.objects.get(run=run), rita, runs.Decision.reject())

    resuming = page_text(client_for_alice.get(f"/chats/{conversation.session_id}/"))
    assert f"Not approved by rita: {CANCEL_42}" in resuming

    asyncio.run(runs.resume(run.pk))
    text = page_text(client_for_alice.get(f"/chats/{conversation.session_id}/"))
    assert "Waiting for a reviewer" not in text
    assert "The request to cancel order 42 was not approved, so nothing was done" in text


def test_a_failed_run_says_what_went_wrong(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    send(client_for_alice, conversation, "where is order 7")
    run = AgentRun.objects.get()
    rows.fail_sync(run.pk, "The agent failed: APIConnectionError: Connection error.")

    text = page_text(client_for_alice.get(f"/chats/{conversation.session_id}/"))

    assert "where is order 7" in text  # her message is not lost with the run
    assert "The agent couldn't finish this reply." in text
    assert "The agent failed: APIConnectionError: Connection error." in text


# --- undo, clear, rename ------------------------------------------------------------------------


def test_undo_removes_her_last_message_and_its_reply(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    turn(client_for_alice, conversation, "where is order 7")
    kept = items_of(conversation)
    turn(client_for_alice, conversation, "where is order 3")
    assert len(items_of(conversation)) > len(kept)

    response = client_for_alice.post(f"/chats/{conversation.session_id}/undo/", follow=True)

    assert items_of(conversation) == kept
    text = page_text(response)
    assert "Your last message and its reply were removed." in text
    assert "where is order 3" not in text and "where is order 7" in text

    client_for_alice.post(f"/chats/{conversation.session_id}/undo/")
    assert items_of(conversation) == []
    nothing = client_for_alice.post(f"/chats/{conversation.session_id}/undo/", follow=True)
    assert "There is nothing to undo." in page_text(nothing)


def test_undo_and_clear_wait_for_the_agent(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    turn(client_for_alice, conversation, "cancel order 42")  # waits for a reviewer
    before = items_of(conversation)

    undo = client_for_alice.post(f"/chats/{conversation.session_id}/undo/", follow=True)
    clear = client_for_alice.post(f"/chats/{conversation.session_id}/clear/", follow=True)

    # Each refusal says what applies to its action: to undo, withdraw first.
    assert "be undone yet: withdraw the request first" in page_text(undo)
    assert "You can clear the conversation once the agent has finished." in page_text(clear)
    assert items_of(conversation) == before


def test_undo_never_removes_an_item_it_cannot_read(
    client_for_alice: Client, conversation: Conversation, settings: Any
) -> None:
    settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()
    add_items(conversation, [user_message("first"), assistant("one")])
    # An item written under another key: it cannot be decrypted, so it must stay.
    asyncio.run(
        AuditedEncryptedSession(
            conversation.session_id,
            DjangoSession(conversation.session_id),
            Fernet.generate_key().decode(),
        ).add_items([user_message("under another key")])
    )
    add_items(conversation, [assistant("newest")])
    rows = list(SessionItem.objects.order_by("pk").values_list("payload", flat=True))

    response = client_for_alice.post(f"/chats/{conversation.session_id}/undo/", follow=True)

    assert UNREADABLE.replace("'", "&#x27;") in response.content.decode()
    after = list(SessionItem.objects.order_by("pk").values_list("payload", flat=True))
    assert after[:3] == rows[:3]  # the popped newest item is back, after the unreadable one
    assert [item["content"] for item in items_of(conversation)[:1]] == ["first"]
    assert items_of(conversation)[-1] == assistant("newest")
    page = page_text(client_for_alice.get(f"/chats/{conversation.session_id}/"))
    assert "1 earlier item of this conversation can't be decrypted" in page


def test_clear_asks_first_then_empties_the_conversation(
    client_for_alice: Client, conversation: Conversation, submitted: list
) -> None:
    turn(client_for_alice, conversation, "where is order 7")

    confirm = client_for_alice.get(f"/chats/{conversation.session_id}/clear/")
    assert "Clear this conversation?" in page_text(confirm)
    assert items_of(conversation)

    cleared = client_for_alice.post(f"/chats/{conversation.session_id}/clear/", follow=True)
    assert items_of(conversation) == []
    assert Conversation.objects.filter(pk=conversation.pk).exists()
    text = page_text(cleared)
    assert "The conversation was cleared." in text
    assert "where is order 7" not in text
    assert "Start the conversation" in text


def test_rename_sets_an_escaped_title_of_at_most_200_characters(
    client_for_alice: Client, conversation: Conversation
) -> None:
    url = f"/chats/{conversation.session_id}/rename/"
    renamed = client_for_alice.post(url, {"title": "  <i>Order</i>   seven "}, follow=True)
    conversation.refresh_from_db()
    assert conversation.title == "<i>Order</i> seven"
    assert "&lt;i&gt;Order&lt;/i&gt; seven" in renamed.content.decode()
    assert "<i>Order</i>" not in renamed.content.decode()
    assert "&lt;i&gt;Order&lt;/i&gt; seven" in client_for_alice.get("/chats/").content.decode()

    too_long = client_for_alice.post(url, {"title": "y" * 201})
    assert too_long.status_code == 400
    assert "A title has at most 200 characters (this one has 201)." in page_text(too_long)
    assert 'value="' + "y" * 201 + '"' in too_long.content.decode()  # kept for fixing
    conversation.refresh_from_db()
    assert conversation.title == "<i>Order</i> seven"

    client_for_alice.post(url, {"title": ""})
    conversation.refresh_from_db()
    assert conversation.title == ""


# --- who may see what ---------------------------------------------------------------------------


def chat_urls(session_id: str) -> list[tuple[str, str]]:
    base = f"/chats/{session_id}/"
    return [
        ("get", base),
        ("get", base + "history/"),
        ("get", base + "clear/"),
        ("post", base + "messages/"),
        ("post", base + "undo/"),
        ("post", base + "clear/"),
        ("post", base + "rename/"),
    ]


def test_every_view_of_someone_else_s_conversation_is_a_404(
    client_for_alice: Client, submitted: list
) -> None:
    bob = make_user(username="bobtheowner")
    theirs = make_conversation(owner=bob, title="Bob's")
    add_items(theirs, [user_message("bob's secret")])

    for method, url in chat_urls(theirs.session_id):
        data = {"text": "hi", "title": "mine now"} if method == "post" else None
        response = getattr(client_for_alice, method)(url, data)
        assert response.status_code == 404, (method, url)
        # Names long enough that a random CSRF token never holds them ("bob" once did).
        page = response.content.decode()
        assert "bobtheowner" not in page.lower() and "Bob&#x27;s" not in page
        assert "bob&#x27;s secret" not in page and "bob's secret" not in page

    theirs.refresh_from_db()
    assert theirs.title == "Bob's"
    assert items_of(theirs) == [user_message("bob's secret")]
    assert AgentRun.objects.count() == 0
    assert client_for_alice.get("/chats/nobody-has-this/").status_code == 404


def test_visitors_are_sent_to_log_in(conversation: Conversation, submitted: list) -> None:
    visitor = Client()
    urls = [("get", "/chats/"), ("post", "/chats/new/"), *chat_urls(conversation.session_id)]
    for method, url in urls:
        response = getattr(visitor, method)(url)
        assert response.status_code == 302, (method, url)
        assert response.url.startswith("/accounts/login/?next="), (method, url)
    assert AgentRun.objects.count() == 0
    assert Conversation.objects.count() == 1


# --- cost -----------------------------------------------------------------------------------------


@contextmanager
def count_queries() -> Iterator[list[str]]:
    """Every query of every thread: the session reads in worker threads, not in the view's."""
    seen: list[str] = []
    lock = threading.Lock()
    wrapper: Any = db_utils.CursorWrapper
    original = wrapper._execute

    def counting(self: Any, sql: str, params: Any, *args: Any) -> Any:
        with lock:
            seen.append(sql)
        return original(self, sql, params, *args)

    wrapper._execute = counting
    try:
        yield seen
    finally:
        wrapper._execute = original


def fill(conversation: Conversation, exchanges: int) -> None:
    items: list[dict[str, Any]] = []
    for n in range(exchanges):
        items += [
            user_message(f"question {n}"),
            {
                "type": "function_call",
                "call_id": f"c{n}",
                "name": "lookup_order",
                "arguments": f'{{"order_id": {n}}}',
            },
            {"type": "function_call_output", "call_id": f"c{n}", "output": f"Order {n}."},
            assistant(f"**Answer** {n}"),
        ]
    add_items(conversation, items)


def test_a_long_chat_costs_as_many_queries_as_a_short_one(
    client_for_alice: Client, alice: Any, submitted: list
) -> None:
    short = make_conversation(owner=alice)
    fill(short, 2)
    long = make_conversation(owner=alice)
    fill(long, 25)  # 100 items
    assert SessionItem.objects.filter(conversation=long).count() == 100
    for conversation in (short, long):
        send(client_for_alice, conversation, "where is order 7")
        asyncio.run(runs.execute(AgentRun.objects.filter(conversation=conversation).get().pk))

    counts = {}
    for conversation in (short, long):
        for path in ("", "history/"):
            with count_queries() as queries:
                response = client_for_alice.get(f"/chats/{conversation.session_id}/{path}")
            assert response.status_code == 200
            counts[conversation.pk, path] = len(queries)
    assert "Answer</strong> 24" in response.content.decode()

    # Session, user, conversation, session items, latest run, the approval requests of the
    # calls shown (what people did with them), the replies' runs with the user's ratings,
    # two permission checks. (On SQLite the session items are read through the backend's own
    # connection, which this count does not see: one fewer.)
    assert counts[long.pk, ""] == counts[short.pk, ""] <= 9
    assert counts[long.pk, "history/"] == counts[short.pk, "history/"] <= 9

    for n in range(40):
        make_conversation(owner=alice, title=f"chat {n}")
    with count_queries() as queries:
        assert client_for_alice.get("/chats/").status_code == 200
    assert len(queries) <= 6


def test_a_very_long_chat_shows_its_newest_items_and_says_so(
    client_for_alice: Client, conversation: Conversation, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("conversations.views.HISTORY_ITEMS_SHOWN", 8)
    fill(conversation, 3)  # 12 items
    text = page_text(client_for_alice.get(f"/chats/{conversation.session_id}/"))
    assert "Earlier messages of this long conversation are not shown." in text
    assert "question 0" not in text and "question 2" in text


@pytest.mark.parametrize(
    "status", [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.RESUMING, RunStatus.WAITING]
)
def test_a_page_showing_an_unfinished_run_reads_its_messages_again_every_10_s(
    client_for_alice: Client, conversation: Conversation, alice: Any, status: str
) -> None:
    """A push is a hint: a run that ends in another process whose events cannot reach this
    page's server (or whose event was lost) still shows, whatever state the page saw it in.
    Only a waiting run's page read again before (a browser test caught a page left at
    "running" for good, CI of 2026-12-07)."""
    make_run(conversation=conversation, status=status)
    history = client_for_alice.get(f"/chats/{conversation.session_id}/history/").content.decode()
    pollers = re.findall(r'<[^>]*hx-trigger="every 10s"[^>]*>', history)
    assert len(pollers) == 1, pollers
    assert f'hx-get="/chats/{conversation.session_id}/history/"' in pollers[0]
    assert 'hx-target="#messages"' in pollers[0]


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED])
def test_a_page_showing_a_finished_run_does_not_poll(
    client_for_alice: Client, conversation: Conversation, alice: Any, status: str
) -> None:
    make_run(conversation=conversation, status=status, final_output="Done.")
    history = client_for_alice.get(f"/chats/{conversation.session_id}/history/").content.decode()
    assert 'hx-trigger="every' not in history


@pytest.mark.usefixtures("fresh_registry")
def test_the_agent_picker_names_each_agent_by_its_own_name(
    client_for_alice: Client, settings: Any
) -> None:
    settings.AGENTSITE_AGENTS = {
        "support": "demo.agents.support_desk",
        "billing": "demo.agents.billing",
    }

    body = client_for_alice.get("/chats/").content.decode()

    assert '<option value="support">Support desk</option>' in body
    assert '<option value="billing">Billing</option>' in body
