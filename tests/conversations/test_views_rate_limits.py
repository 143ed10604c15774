"""Per-person limits on messages and new conversations: a clear 429, nothing stored, the typed
text kept."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from conversations.models import Conversation
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.factories import client_of, make_conversation, make_user

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("submitted")]
HTMX = {"HX-Request": "true"}


def finish_all(user: Any) -> None:
    # Each conversation takes one message at a time; the limit counts across them anyway.
    AgentRun.objects.filter(requested_by=user).update(status=RunStatus.COMPLETED)


def test_it_refuses_the_message_past_the_limit_with_a_429_and_keeps_the_text(
    settings: Any,
) -> None:
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 3
    alice = make_user()
    client = client_of(alice)
    for _ in range(3):
        conversation = make_conversation(owner=alice)
        url = reverse("chat_send", args=[conversation.session_id])
        assert client.post(url, {"text": "hello"}, headers=HTMX).status_code == 200
        finish_all(alice)
    other = make_conversation(owner=alice)
    url = reverse("chat_send", args=[other.session_id])
    response = client.post(url, {"text": "one more thing"}, headers=HTMX)
    assert response.status_code == 429
    text = response.content.decode()
    assert "You are sending messages too fast: at most 3 a minute." in text
    assert "one more thing" in text
    assert AgentRun.objects.filter(requested_by=alice).count() == 3
    page = client.post(url, {"text": "plain form"})
    assert page.status_code == 429 and "plain form" in page.content.decode()


def test_the_limit_is_per_person_and_per_minute(settings: Any) -> None:
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 1
    alice, bob = make_user(), make_user()
    first = make_conversation(owner=alice)
    runs.start_run(first, "hello", alice)
    finish_all(alice)
    with pytest.raises(runs.RateLimited, match="Try again in"):
        runs.start_run(make_conversation(owner=alice), "again", alice)
    runs.start_run(make_conversation(owner=bob), "hello", bob)  # bob has his own count
    AgentRun.objects.filter(requested_by=alice).update(
        created=timezone.now() - timedelta(seconds=61)
    )
    runs.start_run(make_conversation(owner=alice), "a minute later", alice)


def test_no_limit_when_it_is_zero(settings: Any) -> None:
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 0
    alice = make_user()
    for _ in range(5):
        runs.start_run(make_conversation(owner=alice), "hello", alice)
    assert AgentRun.objects.filter(requested_by=alice).count() == 5


def test_it_refuses_new_conversations_past_the_hourly_limit(settings: Any) -> None:
    settings.AGENTSITE_CONVERSATIONS_PER_HOUR = 2
    alice = make_user()
    client = client_of(alice)
    for number in range(2):
        assert client.post(reverse("chat_new"), {}).status_code == 302
        # Used: the next New opens another (an unused one would be reused, counting nothing).
        Conversation.objects.filter(owner=alice).update(title=f"Chat {number}")
    response = client.post(reverse("chat_new"), {})
    assert response.status_code == 429
    assert "You are starting conversations too fast: at most 2 an hour." in (
        response.content.decode()
    )
    assert Conversation.objects.filter(owner=alice).count() == 2
    Conversation.objects.filter(owner=alice).update(created=timezone.now() - timedelta(hours=2))
    assert client.post(reverse("chat_new"), {}).status_code == 302
