"""A throwaway PostgreSQL server of a test's own, as `scripts/with-postgres` starts one, but with
the settings the test chooses (a small `max_connections`, say): Debian's binaries, a fresh
cluster in a temporary folder, on 127.0.0.1 and a free port, stopped when the test ends.

    with running_postgres(max_connections=40) as server:
        server.url                     # for DATABASE_URL
        server.client_connections()    # what pg_stat_activity counts now
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.services import free_port


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql).")
    return Path(found[-1])


def _as_postgres() -> list[str]:
    # PostgreSQL refuses to run as root; Debian's package made a postgres user for it.
    return ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []


@dataclass
class PostgresServer:
    folder: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url, autocommit=True)

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def client_connections(cursor: psycopg.Cursor[tuple[object, ...]]) -> int:
    """The client connections open now (the asking one included): what `max_connections`
    bounds."""
    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
    row = cursor.fetchone()
    assert row is not None
    return int(str(row[0]))


@contextmanager
def running_postgres(*, max_connections: int) -> Iterator[PostgresServer]:
    # A folder of its own under /tmp, as the script's: pytest's temporary folders are private
    # to root, and the server runs as postgres.
    folder = Path(tempfile.mkdtemp(prefix="agentsite-pg."))
    folder.chmod(0o755)
    if os.getuid() == 0:
        os.chown(folder, pwd.getpwnam("postgres").pw_uid, -1)
    bindir = _bindir()
    server = PostgresServer(folder, free_port())
    data = folder / "data"
    subprocess.run(
        [*_as_postgres(), bindir / "initdb", "-D", data, "-U", "postgres", "--auth=trust"]
        + ["-E", "UTF8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    options = (
        f"-h 127.0.0.1 -p {server.port} -k {folder} -c fsync=off -c synchronous_commit=off "
        f"-c max_connections={max_connections}"
    )
    subprocess.run(
        [*_as_postgres(), bindir / "pg_ctl", "-D", data, "-l", folder / "server.log", "-w"]
        + ["-o", options, "start"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield server
    finally:
        subprocess.run(
            [*_as_postgres(), bindir / "pg_ctl", "-D", data, "-m", "immediate", "stop"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        shutil.rmtree(folder, ignore_errors=True)
