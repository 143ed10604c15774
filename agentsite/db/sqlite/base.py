"""agentsite's SQLite backend: Django's, with two changes for a site whose runs write from
many threads of one process at once.

1. Writers queue in the process, not in SQLite. SQLite lets one writer in at a time; the
   others sleep in its busy handler, which retries after growing pauses (up to 100 ms), so a
   writer can lose the lock again and again while others commit: in the concurrency benchmark
   single waits reached 1.3 s for transactions that hold the lock for a millisecond. Here every
   write (a transaction, which is `BEGIN IMMEDIATE` on this site, or a write statement outside
   one) first takes a lock shared by all connections of the process to that file, so writers
   are served in turn and wait only as long as the lock is really held. Writers in other
   processes (a `db_worker`, a management command) still meet SQLite's own busy handling.
   A lock not obtained within the connection's `timeout` is passed over: SQLite's busy
   handling then decides, as it would without this backend.
2. WAL checkpoints happen off the request path. By default the commit that takes the WAL past
   1,000 pages copies them into the database file itself, so a run's turn or a page view pays
   for the trace spans that other threads wrote. Here a background thread checkpoints after
   commits (PASSIVE: it never blocks readers or writers), and connections checkpoint
   themselves only past `WAL_AUTOCHECKPOINT_PAGES`, a backstop in case that thread falls behind.
"""

from __future__ import annotations

import datetime
import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.db.backends.sqlite3 import base
from django.db.transaction import TransactionManagementError

logger = logging.getLogger(__name__)

# The backstop of point 2 (pages of 4 KiB); SQLite's default is 1,000.
WAL_AUTOCHECKPOINT_PAGES = 20_000
# The checkpointer runs at most this often (seconds), and only after a commit.
CHECKPOINT_INTERVAL = 0.2
_READS = ("SELECT", "PRAGMA", "EXPLAIN", "BEGIN", "SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT")


class _File:
    """The write lock and the checkpointer of one database file, shared by the process."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.lock = threading.RLock()
        self.committed = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.checkpoints = 0  # done by the background thread, for tests and operators

    def acquire(self) -> bool:
        if self.lock.acquire(timeout=self.timeout):
            return True
        logger.warning(
            "SQLite %s: no turn to write within %.0f s; leaving it to SQLite's busy handling.",
            self.path,
            self.timeout,
        )
        return False

    def after_commit(self) -> None:
        # Set only when clear (`set()` takes the event's lock, a few µs): a flag found set
        # is cleared by the checkpointer before the checkpoint that follows, which then
        # sees this commit.
        if not self.committed.is_set():
            self.committed.set()
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._checkpoint_forever,
                        name=f"sqlite-checkpoint {self.path}",
                        daemon=True,
                    )
                    self._thread.start()

    def _checkpoint_forever(self) -> None:
        connection: sqlite3.Connection | None = None
        while True:
            self.committed.wait()
            self.committed.clear()
            try:
                if connection is None:
                    connection = sqlite3.connect(
                        self.path, timeout=self.timeout, check_same_thread=False
                    )
                connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.checkpoints += 1
            except sqlite3.Error:
                # A busy or vanished file (a test database dropped): try again after the
                # next commit, on a fresh connection.
                logger.debug("SQLite %s: checkpoint failed", self.path, exc_info=True)
                if connection is not None:
                    connection.close()
                connection = None
            time.sleep(CHECKPOINT_INTERVAL)


@functools.cache
def driver_sql(sql: str) -> str:
    """SQL written with Django's `%s` placeholders, in the driver's `?` style (for the fixed
    statements of the lean paths, which hold no literal `%`)."""
    return sql.replace("%s", "?")


class LeanCursor:
    """The driver's connection inside `lean_transaction`, taking Django's `%s` placeholders."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.raw.execute(driver_sql(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> sqlite3.Cursor:
        return self.raw.executemany(driver_sql(sql), rows)


class LeanTransaction:
    """`DatabaseWrapper.lean_transaction()`: a plain class, not a generator's context
    manager, which cost a few µs of a 60 µs append."""

    __slots__ = ("_wrapper", "_raw")

    def __init__(self, wrapper: DatabaseWrapper) -> None:
        self._wrapper = wrapper
        self._raw: sqlite3.Connection | None = None

    def __enter__(self) -> LeanCursor:
        wrapper = self._wrapper
        if wrapper.in_atomic_block:
            raise TransactionManagementError("lean_transaction() inside atomic()")
        if wrapper.connection is None:
            wrapper.ensure_connection()
        raw = wrapper.connection
        wrapper._take_write_lock()
        try:
            with wrapper.wrap_database_errors:
                raw.execute("BEGIN IMMEDIATE")
        except BaseException:
            wrapper._give_write_lock(wrote=True)
            raise
        self._raw = raw
        return LeanCursor(raw)

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        wrapper, raw = self._wrapper, self._raw
        assert raw is not None
        self._raw = None
        try:
            with wrapper.wrap_database_errors:
                if exc_type is None:
                    raw.commit()
                    return
                raw.rollback()
            # What left the block is raised as within `wrap_database_errors`: a driver's
            # error as Django's (and marked, for `close_if_unusable_or_obsolete`), anything
            # else as it is.
            wrapper.wrap_database_errors.__exit__(exc_type, exc, traceback)
        finally:
            wrapper._give_write_lock(wrote=True)


_files: dict[str, _File] = {}
_files_lock = threading.Lock()


def shared_file(path: str, timeout: float = 5.0) -> _File:
    with _files_lock:
        found = _files.get(path)
        if found is None:
            found = _files[path] = _File(path, timeout)
        return found


class DatabaseWrapper(base.DatabaseWrapper):
    _shared: _File | None = None
    _holds_write_lock = False

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if not self.is_in_memory_db():
            self._shared = shared_file(
                str(self.settings_dict["NAME"]), float(conn_params.get("timeout", 5.0))
            )
            connection.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
        return connection

    def lean_transaction(self) -> LeanTransaction:
        """A write transaction straight on the driver's connection, for hot paths of a few
        fixed statements (the session store): the process's write lock, `BEGIN IMMEDIATE`,
        then COMMIT, or ROLLBACK on any exception. Django's `atomic()` and cursor wrappers
        cost more than such a transaction's SQL. The ORM must not be used inside (Django
        does not know the transaction is open).
        """
        return LeanTransaction(self)

    def lean_now(self) -> str:
        """`ops.adapt_datetimefield_value(timezone.now())`, the text a datetime column gets for
        now, in half its time (2.5 µs instead of 5, of a 100 µs append): the instant in the
        connection's time zone (`timezone`, UTC unless the database's TIME_ZONE names
        another) made naive, or without USE_TZ (`timezone` None) the local time, as
        `timezone.now()` then is."""
        zone = self.timezone
        now = datetime.datetime.now(zone)
        return str(now if zone is None else now.replace(tzinfo=None))

    def lean_fetch(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """All rows of one read, straight on the driver's connection (Django's cursor
        wrappers cost a third of a short read), with Django's error translation kept."""
        self.ensure_connection()
        with self.wrap_database_errors:
            return self.connection.execute(driver_sql(sql), params).fetchall()

    def create_cursor(self, name: str | None = None) -> Any:
        cursor = self.connection.cursor(factory=_QueuedWritesCursor)
        cursor.wrapper = self
        return cursor

    # A transaction holds the process's write lock from BEGIN to COMMIT or ROLLBACK.

    def _start_transaction_under_autocommit(self) -> None:
        self._take_write_lock()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            self._give_write_lock()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]
        finally:
            self._give_write_lock(wrote=True)

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # (not in django-stubs)
        finally:
            self._give_write_lock()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]
        finally:
            self._give_write_lock()

    def _take_write_lock(self) -> None:
        if self._shared is not None and not self._holds_write_lock:
            self._holds_write_lock = self._shared.acquire()

    def _give_write_lock(self, *, wrote: bool = False) -> None:
        """Release the lock if this connection holds it; after a write, the checkpointer
        is told there may be work."""
        if not self._holds_write_lock:
            return
        self._holds_write_lock = False
        assert self._shared is not None
        self._shared.lock.release()
        if wrote:
            self._shared.after_commit()


class _QueuedWritesCursor(base.SQLiteCursorWrapper):
    """A write statement outside a transaction (SQLite commits it at once) takes the
    process's write lock for its own duration."""

    wrapper: DatabaseWrapper

    def execute(self, query: str, params: Any = None) -> Any:
        if not self._writes_alone(query):
            return super().execute(query, params)
        with self._turn():
            return super().execute(query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        if not self._writes_alone(query):
            return super().executemany(query, param_list)
        with self._turn():
            return super().executemany(query, param_list)

    def _writes_alone(self, query: str) -> bool:
        return (
            self.wrapper._shared is not None
            and not self.connection.in_transaction
            and not query.lstrip()[:9].upper().startswith(_READS)
        )

    @contextmanager
    def _turn(self) -> Iterator[None]:
        wrapper = self.wrapper
        if wrapper._holds_write_lock:  # already this connection's turn
            yield
            return
        wrapper._take_write_lock()
        try:
            yield
        finally:
            wrapper._give_write_lock(wrote=True)
