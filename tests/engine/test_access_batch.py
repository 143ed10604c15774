"""The checks of a process's sockets, read together (`engine.access.current_users`,
`recheck_all`, `_Rechecks`): the same answers as one `auth.get_user` per session, in a few
queries for all of them, and on a loop the checks asked while one runs go in one hop."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from engine import access
from tests.engine.test_access import Inbox, open_socket
from tests.factories import client_of, make_reviewer, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_layer")]


def session_of(user: Any) -> str:
    return str(client_of(user).cookies["sessionid"].value)


def test_sessions_are_read_together_and_each_answers_as_django_would() -> None:
    rita, bob, carol = make_reviewer(), make_user(username="bob"), make_user(username="carol")
    rita_tabs = [session_of(rita) for _ in range(3)]  # three logins of hers
    bob_session = session_of(bob)
    carol_session = session_of(carol)
    expired = session_of(bob)
    Session.objects.filter(session_key=expired).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    logged_out = session_of(bob)
    Session.objects.filter(session_key=logged_out).delete()
    carol.set_password("a new password 8c1d")  # her session's hash no longer holds
    carol.save()

    checks = [
        *((key, rita.pk) for key in rita_tabs),
        (bob_session, bob.pk),
        (bob_session, rita.pk),  # a session that is not that user's
        (expired, bob.pk),
        (logged_out, bob.pk),
        (carol_session, carol.pk),
        (None, rita.pk),
        ("not-a-session-key", rita.pk),
    ]
    with CaptureQueriesContext(connection) as queries:
        users = access.current_users(checks)

    assert [user.pk if user else None for user in users] == [
        rita.pk, rita.pk, rita.pk, bob.pk, None, None, None, None, None, None,
    ]  # fmt: skip
    # One query for the sessions, one user read per login that holds (rita's three tabs
    # share hers), carol's read and her session ended (Django's flush), as a request would.
    sessions = [q for q in queries.captured_queries if '"django_session"' in q["sql"]]
    assert sessions[0]["sql"].startswith('SELECT "django_session"."session_key"')
    users_read = [q for q in queries.captured_queries if 'FROM "auth_user"' in q["sql"]]
    assert len(users_read) == 3  # rita, bob, carol
    assert not Session.objects.filter(session_key=carol_session).exists()
    # The same answers, one session at a time.
    assert [access.current_user(key, user_id) for key, user_id in checks[:4]] == users[:4]


def test_a_deactivated_user_s_sessions_all_stop_holding() -> None:
    rita = make_reviewer()
    tabs = [session_of(rita) for _ in range(2)]
    get_user_model().objects.filter(pk=rita.pk).update(is_active=False)

    assert access.current_users([(key, rita.pk) for key in tabs]) == [None, None]


async def test_the_checks_asked_while_one_runs_go_together_in_one_hop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight inbox sockets, every check stale, one push: the first socket's check runs at
    once, the seven asked meanwhile in one more hop; every socket gets the row."""
    monkeypatch.setattr(access, "RECHECK_SECONDS", 0.0)
    batches: list[int] = []
    real = access.recheck_all

    def counted(consumers: list[access.GuardedConsumer]) -> list[bool]:
        batches.append(len(consumers))
        return real(consumers)

    monkeypatch.setattr(access, "recheck_all", counted)
    socket = Inbox()
    rita = await socket.setup()
    keys = [await sync_to_async(session_of)(rita) for _ in range(8)]
    communicators = [
        await open_socket(socket.path, (b"cookie", f"sessionid={key}".encode())) for key in keys
    ]

    await socket.push()
    frames = [await communicator.receive_from(timeout=5) for communicator in communicators]

    assert all('id="request-' in frame for frame in frames)
    assert sum(batches) == 8
    assert len(batches) <= 3, batches  # not eight hops
    assert max(batches) >= 4, batches
    for communicator in communicators:
        await communicator.disconnect()


async def test_a_failed_read_refuses_no_one_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that raises (a bug, or the database away) reaches every socket that waited
    for it as the error it is, not as an answer; the next check asks afresh."""
    rechecks = access._Rechecks()
    calls = []

    def broken(consumers: list[Any]) -> list[bool]:
        calls.append(len(consumers))
        if len(calls) == 1:
            raise RuntimeError("the database went away")
        return [True] * len(consumers)

    monkeypatch.setattr(access, "recheck_all", broken)
    first = rechecks.ask(object())
    second = rechecks.ask(object())
    for answer in (first, second):
        with pytest.raises(RuntimeError):
            await answer
    assert await rechecks.ask(object()) is True
    assert calls == [2, 1]
    await asyncio.sleep(0)
    assert not rechecks.running
