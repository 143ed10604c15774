"""agentsite's SQLite backend (agentsite/db/sqlite/base.py): writers of one process queue in
the process, and WAL checkpoints run in a background thread."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone

from agentsite.db.sqlite import base
from conversations.models import Conversation

# `make test` runs these on SQLite only (`-m "not sqlite"` on PostgreSQL).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def shared() -> base._File:
    connection.ensure_connection()
    found = getattr(connections["default"], "_shared", None)
    assert isinstance(found, base._File)
    return found


def in_thread(work: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except Exception as exc:  # reported to the test
            outcome.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_the_site_runs_on_agentsite_backend() -> None:
    assert isinstance(connections["default"], base.DatabaseWrapper)
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        assert cursor.fetchone()[0] == base.WAL_AUTOCHECKPOINT_PAGES
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"


def test_a_transaction_holds_the_process_write_lock_until_it_commits() -> None:
    lock = shared().lock
    with transaction.atomic():
        Conversation.objects.create(title="first")
        assert lock._is_owned()  # type: ignore[attr-defined]
        # Another thread's write waits for our commit in the process, not in SQLite.
        thread, outcome = in_thread(lambda: Conversation.objects.create(title="second").pk)
        thread.join(0.5)
        assert thread.is_alive(), "the other writer did not wait for the lock"
        assert not outcome
    assert not lock._is_owned()  # type: ignore[attr-defined]
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], int), outcome
    assert set(Conversation.objects.values_list("title", flat=True)) == {"first", "second"}


def test_a_rolled_back_transaction_gives_the_lock_back() -> None:
    lock = shared().lock
    with pytest.raises(RuntimeError), transaction.atomic():
        Conversation.objects.create(title="undone")
        raise RuntimeError
    assert not lock._is_owned()  # type: ignore[attr-defined]
    thread, outcome = in_thread(lambda: Conversation.objects.create(title="after").pk)
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], int), outcome
    assert list(Conversation.objects.values_list("title", flat=True)) == ["after"]


def test_a_write_outside_a_transaction_takes_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    file = shared()
    original = file.acquire

    def acquire() -> bool:
        taken.append(threading.current_thread().name)
        return original()

    monkeypatch.setattr(file, "acquire", acquire)
    Conversation.objects.create(title="autocommit")  # one INSERT, committed by itself
    assert len(taken) == 1
    list(Conversation.objects.all())  # a read takes no turn
    assert len(taken) == 1
    assert not file.lock._is_owned()  # type: ignore[attr-defined]


def test_many_writer_threads_all_commit_in_turn() -> None:
    """Twelve threads, each a mix of transactions and single writes: every row arrives, no
    "database is locked", and the lock is free at the end."""
    errors: list[BaseException] = []

    def writer(number: int) -> None:
        try:
            for step in range(10):
                if step % 2:
                    with transaction.atomic():
                        Conversation.objects.create(title=f"{number}-{step}")
                        time.sleep(0.001)
                else:
                    Conversation.objects.create(title=f"{number}-{step}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert Conversation.objects.count() == 120
    assert not shared().lock._is_owned()  # type: ignore[attr-defined]


def test_a_writer_that_waits_too_long_is_left_to_sqlite(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No turn within the timeout: the write goes on to SQLite's own busy handling (as
    without this backend), and gets in once the holder commits."""
    file = shared()
    monkeypatch.setattr(file, "timeout", 0.05)
    holder = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Conversation.objects.create(title="holder")
            holder.set()
            release.wait(10)

    thread, _ = in_thread(hold)
    assert holder.wait(10)
    try:
        waiter, result = in_thread(lambda: Conversation.objects.create(title="late").pk)
        deadline = time.monotonic() + 10
        while "no turn to write" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "no turn to write" in caplog.text
        assert waiter.is_alive() and not result  # now in SQLite's busy handler
    finally:
        release.set()
        thread.join(10)
    waiter.join(30)
    assert len(result) == 1 and isinstance(result[0], int), result
    assert set(Conversation.objects.values_list("title", flat=True)) == {"holder", "late"}


def test_checkpoints_run_in_the_background_after_commits() -> None:
    file = shared()
    before = file.checkpoints
    with transaction.atomic():
        Conversation.objects.bulk_create([Conversation(title="x" * 500) for _ in range(2000)])
    deadline = time.monotonic() + 10
    while file.checkpoints == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert file.checkpoints > before
    # The background checkpoint copied every frame of that commit into the database file.
    # (Another thread of the suite may be writing or checkpointing at this very moment, a
    # trace export's commit for one: then a PASSIVE checkpoint reports busy; ask again.)
    deadline = time.monotonic() + 10
    while True:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            busy, log_frames, checkpointed = cursor.fetchone()
        if busy == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert busy == 0 and log_frames == checkpointed


def test_a_lean_transaction_commits_or_rolls_back_whole_and_takes_its_turn() -> None:
    wrapper = connections["default"]
    lock = shared().lock
    conversation = Conversation.objects.create(title="lean")
    with wrapper.lean_transaction() as driver:  # type: ignore[attr-defined]
        assert lock._is_owned()  # type: ignore[attr-defined]
        driver.execute(
            "UPDATE conversations_conversation SET title = %s WHERE id = %s",
            ["done", conversation.pk],
        )
    assert not lock._is_owned()  # type: ignore[attr-defined]
    conversation.refresh_from_db()
    assert conversation.title == "done"
    assert wrapper.lean_fetch(  # type: ignore[attr-defined]
        "SELECT title FROM conversations_conversation WHERE id = %s", [conversation.pk]
    ) == [("done",)]

    with pytest.raises(RuntimeError), wrapper.lean_transaction() as driver:  # type: ignore[attr-defined]
        driver.execute(
            "UPDATE conversations_conversation SET title = %s WHERE id = %s",
            ["lost", conversation.pk],
        )
        raise RuntimeError
    assert not lock._is_owned()  # type: ignore[attr-defined]
    conversation.refresh_from_db()
    assert conversation.title == "done"

    # Not inside Django's own transaction, which would not know about it.
    with (
        pytest.raises(transaction.TransactionManagementError),
        transaction.atomic(),
        wrapper.lean_transaction(),  # type: ignore[attr-defined]
    ):
        pass


def test_a_driver_error_in_a_lean_transaction_is_djangos_and_writes_nothing() -> None:
    wrapper = connections["default"]
    lock = shared().lock
    conversation = Conversation.objects.create(title="lean", session_id="lean-error")
    with pytest.raises(IntegrityError), wrapper.lean_transaction() as driver:  # type: ignore[attr-defined]
        driver.execute(
            "UPDATE conversations_conversation SET title = %s WHERE id = %s",
            ["lost", conversation.pk],
        )
        driver.execute(
            "INSERT INTO conversations_conversation (session_id) VALUES (%s)", ["lean-error"]
        )
    assert not lock._is_owned()  # type: ignore[attr-defined]
    conversation.refresh_from_db()
    assert conversation.title == "lean"


@pytest.mark.parametrize(("use_tz", "zone"), [(True, None), (True, "Europe/Paris"), (False, None)])
def test_lean_now_is_the_text_django_stores_for_now(settings: Any, use_tz: bool, zone: Any) -> None:
    settings.USE_TZ = use_tz
    wrapper = connections["default"]
    saved = wrapper.settings_dict["TIME_ZONE"]
    wrapper.settings_dict["TIME_ZONE"] = zone
    wrapper.__dict__.pop("timezone", None)
    try:
        before = wrapper.ops.adapt_datetimefield_value(timezone.now())
        now = wrapper.lean_now()  # type: ignore[attr-defined]
        after = wrapper.ops.adapt_datetimefield_value(timezone.now())
    finally:
        wrapper.settings_dict["TIME_ZONE"] = saved
        wrapper.__dict__.pop("timezone", None)
    parse = datetime.datetime.fromisoformat
    assert parse(before) <= parse(now) <= parse(after)
    assert parse(after) - parse(before) < datetime.timedelta(seconds=1)
    assert str(parse(now)) == now
