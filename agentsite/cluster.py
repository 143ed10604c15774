"""`python -m agentsite.cluster` (`make cluster`): agentsite on several processes, as a team
deploys it, on this machine: PostgreSQL, Redis, `--web-processes` web processes, `--workers`
task workers, and nginx as the one entry point on `--port`. Debian's binaries, 127.0.0.1 only,
each service on a port and in a folder of its own under `.cluster/` (the database is created
once and kept for the next start). In the foreground: Ctrl-C stops everything it started, by
process id, in order (nginx, the web processes, the workers, Redis, PostgreSQL).

It runs the files a team copies to real hosts, not a copy of them: the process list
`deploy/processes` (its `release` lines first, then its `web` and `worker` lines) and the
nginx site `deploy/nginx/agentsite.conf.template`. What is the cluster's own: the services a
host gets from its distribution or its cloud (PostgreSQL, Redis, nginx's main configuration),
the environment below, and the demo users.

The tests start the same clusters through `Cluster` (tests/cluster/__init__.py): every service
is waited for until it answers, and one that does not fails with the end of its log.
"""

from __future__ import annotations

import argparse
import glob
import grp
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = ROOT / "deploy" / "processes"
NGINX_SITE = ROOT / "deploy" / "nginx" / "agentsite.conf.template"
STATIC_ROOT = ROOT / "staticfiles"  # settings.STATIC_ROOT, where collectstatic writes
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
# A page every web process serves without a session (what a load balancer's check would ask).
PROBE_PATH = "/accounts/login/"
LOG_TAIL_LINES = 40


class ServiceFailed(RuntimeError):
    """A service exited, or did not answer in time; the message ends with its log's tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        # As nginx binds: a port left in TIME_WAIT by closed connections is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def answers_http(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.HTTPError):
            return False

    return check


def answers_redis(port: int) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    return check


def answers_postgres(url: str) -> Callable[[], bool]:
    def check() -> bool:
        import psycopg

        try:
            psycopg.connect(url, connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True

    return check


@dataclass
class Service:
    """One process of the cluster: started and waited for until it answers, stopped by its
    process id. Its output goes to `log_path` (appended to across restarts)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    answers: Callable[[Service], bool]
    port: int | None = None
    # Who runs it, when this process is root (PostgreSQL refuses to run as root).
    user: str | None = None
    stop_signal: signal.Signals = signal.SIGTERM
    stop_within: float = 15.0
    process: subprocess.Popen[bytes] | None = None
    _log_start: int = 0
    _asked: bool = False

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        """Start the process; `wait` then waits for it to answer."""
        assert not self.running(), f"{self.name} is running already"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._asked = False
        as_user: dict[str, Any] = {}
        if self.user and os.geteuid() == 0:
            account = pwd.getpwnam(self.user)
            as_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # A session of its own: Ctrl-C reaches the cluster, which stops each in order.
                start_new_session=True,
                **as_user,
            )

    def wait(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise ServiceFailed(
                    f"{self.name} exited with {self.process.returncode} at start. "
                    f"The end of {self.log_path}:\n{self.log_tail()}"
                )
            if self.answers(self):
                return
            time.sleep(0.1)
        self.kill()
        raise ServiceFailed(
            f"{self.name} did not answer within {within:g} s. "
            f"The end of {self.log_path}:\n{self.log_tail()}"
        )

    def start(self, within: float = 60.0) -> None:
        self.spawn()
        self.wait(within)

    def run_once(self, within: float = 120.0) -> str:
        """Run a one-off step to its end; its output, or `ServiceFailed` with its log's tail."""
        self.spawn()
        assert self.process is not None
        try:
            self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServiceFailed(
                f"{shlex.join(self.argv)} did not end within {within:g} s:\n{self.log_tail()}"
            ) from None
        if self.process.returncode != 0:
            raise ServiceFailed(
                f"{shlex.join(self.argv)} failed ({self.process.returncode}). "
                f"The end of {self.log_path}:\n{self.log_tail()}"
            )
        return self.log()

    def ask_to_stop(self) -> None:
        """Send it `stop_signal`; `stop` then waits for it."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(self.stop_signal)
            self._asked = True

    def stop(self) -> None:
        """Ask it to stop (`stop_signal`) unless asked already; killed if it is still there
        after `stop_within`."""
        if not self.running():
            return
        assert self.process is not None
        if not self._asked:
            self.process.send_signal(self.stop_signal)
        try:
            self.process.wait(timeout=self.stop_within)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: gone at once, with no chance to say so (a crash, an OOM kill)."""
        if not self.running():
            return
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def log(self) -> str:
        """What it wrote since it was last started."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


def _log_says(text: str) -> Callable[[Service], bool]:
    return lambda service: text in service.log()


@dataclass(frozen=True)
class ProcessLine:
    """One line of deploy/processes: `name: [NAME=value ...] command ...`."""

    name: str
    env: dict[str, str]
    argv: list[str]

    def command(self, port: int | None = None) -> list[str]:
        """The argv to run: `$PORT` is the process's own port, `python` this interpreter (the
        checkout's virtualenv)."""
        argv = [
            word.replace("${PORT}", str(port)).replace("$PORT", str(port)) for word in self.argv
        ]
        if port is None and any("$PORT" in word or "${PORT}" in word for word in self.argv):
            raise ValueError(f"{self.name}: needs a port")
        return [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]


def read_processes(path: Path = PROCESSES) -> list[ProcessLine]:
    lines = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, command = text.partition(":")
        words = shlex.split(command)
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_-]*", name.strip()) or not words:
            raise ValueError(f"{path}:{number}: not `name: command`: {raw!r}")
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if not words:
            raise ValueError(f"{path}:{number}: no command: {raw!r}")
        lines.append(ProcessLine(name.strip(), env, words))
    return lines


def render_nginx_site(values: Mapping[str, str], template: Path = NGINX_SITE) -> str:
    """The site template with its `${AGENTSITE_...}` names replaced (nginx's own `$name`s
    stay); a name the template uses that `values` lacks is refused."""

    def value(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise KeyError(f"{template.name} needs {match[1]}")
        return values[match[1]]

    return re.sub(r"\$\{(AGENTSITE_[A-Z_]+)\}", value, template.read_text())


NGINX_MAIN = """\
# Written by agentsite/cluster.py at every start: the process-wide part a host's own
# /etc/nginx/nginx.conf holds; the site is deploy/nginx/agentsite.conf.template.
{user}worker_processes 1;
pid {prefix}/nginx.pid;
error_log {logs}/nginx-error.log warn;
events {{
    worker_connections 1024;
}}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    sendfile on;
    # Which web process served each request ($upstream_addr), for whoever reads the log.
    log_format agentsite '$remote_addr [$time_local] "$request" $status $body_bytes_sent '
                         'upstream=$upstream_addr {request_time}';
    access_log {logs}/nginx-access.log agentsite;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/agentsite.conf;
}}
"""


def write_nginx_config(prefix: Path, logs: Path, port: int, upstream_ports: list[int]) -> Path:
    """nginx's configuration in `prefix`: the cluster's main part and deploy/'s site, with
    nginx on 127.0.0.1:`port` before the web processes on `upstream_ports`."""
    prefix.mkdir(parents=True, exist_ok=True)
    site = render_nginx_site(
        {
            "AGENTSITE_LISTEN": f"127.0.0.1:{port}",
            "AGENTSITE_SERVER_NAME": "127.0.0.1 localhost",
            "AGENTSITE_UPSTREAM_SERVERS": "\n    ".join(
                f"server 127.0.0.1:{upstream};" for upstream in upstream_ports
            ),
            "AGENTSITE_STATIC_ROOT": str(STATIC_ROOT),
        }
    )
    (prefix / "agentsite.conf").write_text(site)
    (prefix / "nginx.conf").write_text(
        NGINX_MAIN.format(
            user=_nginx_user(), prefix=prefix, logs=logs, request_time="${request_time}s"
        )
    )
    return prefix / "nginx.conf"


def _nginx_user() -> str:
    """Who nginx's workers run as, when it starts as root: nobody, who reads the static files
    and nginx's own folders; root only if nobody could not reach the static files (a
    checkout in a home folder others may not enter)."""
    if os.geteuid() != 0:
        return ""  # they stay this user
    for folder in [STATIC_ROOT, *STATIC_ROOT.parents]:
        if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH:
            return "user root root;\n"
    nobody = pwd.getpwnam("nobody")
    return f"user nobody {grp.getgrgid(nobody.pw_gid).gr_name};\n"


def _postgres_bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not found:
        raise ServiceFailed("PostgreSQL is not installed (apt-get install postgresql).")
    return Path(found[-1])


@dataclass
class Cluster:
    """PostgreSQL, Redis, the web processes, the workers and nginx, in `folder`.

    `base_env` is what every process inherits (this process's environment by default), `env`
    what it sets on top of the cluster's own settings. `fast_postgres` turns fsync off, for
    clusters thrown away afterwards (tests).
    """

    folder: Path
    port: int = 8000
    web_processes: int = 2
    workers: int = 2
    env: dict[str, str] = field(default_factory=dict)
    base_env: Mapping[str, str] | None = None
    fast_postgres: bool = False
    seed_demo: bool = True
    say: Callable[[str], None] = lambda text: None
    services: list[Service] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.folder = self.folder.resolve()
        self.logs = self.folder / "logs"
        self.postgres_port = free_port()
        self.redis_port = free_port()
        self.database_url = f"postgres://postgres@127.0.0.1:{self.postgres_port}/agentsite"
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.processes = read_processes()
        self.web: list[Service] = []
        self.worker: list[Service] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- the environment ---------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """Every process's environment: production's settings for one host on 127.0.0.1
        (DEBUG off, a key of its own, PostgreSQL, Redis, nginx's headers trusted)."""
        env = dict(os.environ if self.base_env is None else self.base_env)
        env.update(
            {
                "DJANGO_SETTINGS_MODULE": "agentsite.settings",
                "DEBUG": "0",
                "SECRET_KEY": self._secret_key(),
                "ALLOWED_HOSTS": "127.0.0.1,localhost",
                "DATABASE_URL": self.database_url,
                "REDIS_URL": self.redis_url,
                # nginx always sets X-Forwarded-Proto to its own scheme (http here).
                "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
                "PYTHONUNBUFFERED": "1",
            }
        )
        # Emails link to nginx: the web processes behind it and the workers that send the
        # mail cannot know the address people reach (agentsite.serve's default is its own).
        if not env.get("AGENTSITE_EMAIL_SITE_URL") and not env.get("AGENTSITE_WEBHOOK_SITE_URL"):
            env["AGENTSITE_EMAIL_SITE_URL"] = self.url
        env.update(self.env)
        return env

    def _secret_key(self) -> str:
        path = self.folder / "secret_key"
        if not path.exists():
            path.write_text(secrets.token_urlsafe(50))
            path.chmod(0o600)
        return path.read_text().strip()

    def _pool_size(self) -> int:
        return int(self.environment().get("DATABASE_POOL_MAX_SIZE") or 10)

    # --- starting and stopping ---------------------------------------------------------------

    def start(self) -> None:
        """Start everything, each service answering before the next starts; on a failure,
        stop what started and raise `ServiceFailed`."""
        if not port_is_free(self.port):
            raise ServiceFailed(f"Port {self.port} is in use: choose another (PORT=...).")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        try:
            self._start_postgres()
            self._start_redis()
            self._release()
            self._start_processes()
            self._start_nginx()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every service this cluster started, by process id: nginx (no new request),
        the web processes (each drains), the workers (each lets its runs in flight end),
        Redis, PostgreSQL."""
        for kind in ["nginx", "web", "worker", "redis", "postgres"]:
            # All of a kind at once (each web process drains on its own), then the next kind.
            of_kind = [s for s in self.services if s.name.split("-")[0] == kind and s.running()]
            for service in of_kind:
                service.ask_to_stop()
            for service in of_kind:
                service.stop()

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _add(self, service: Service) -> Service:
        self.services.append(service)
        return service

    def _start_postgres(self) -> None:
        bindir = _postgres_bindir()
        home = self.folder / "postgres"
        data = home / "data"
        user = "postgres" if os.geteuid() == 0 else None
        home.mkdir(exist_ok=True)
        if user:
            account = pwd.getpwnam(user)
            os.chown(home, account.pw_uid, account.pw_gid)
        if not (data / "PG_VERSION").exists():
            self.say("PostgreSQL: a new database in " + str(data))
            Service(
                "postgres-initdb",
                [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"]
                + ["-E", "UTF8"],
                dict(os.environ),
                self.logs / "postgres-initdb.log",
                answers=lambda service: False,
                user=user,
            ).run_once()
        budget = (self.web_processes + self.workers) * self._pool_size() + 20
        options = [
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
            "-c",
            f"max_connections={budget}",
        ]
        if self.fast_postgres:
            options += ["-c", "fsync=off", "-c", "synchronous_commit=off"]
            options += ["-c", "full_page_writes=off"]
        admin_url = f"postgres://postgres@127.0.0.1:{self.postgres_port}/postgres"
        service = self._add(
            Service(
                "postgres",
                [str(bindir / "postgres"), "-D", str(data), "-p", str(self.postgres_port)]
                + options,
                dict(os.environ),
                self.logs / "postgres.log",
                answers=lambda service: answers_postgres(admin_url)(),
                port=self.postgres_port,
                user=user,
                # "fast": clients are disconnected (they were stopped before it anyway).
                stop_signal=signal.SIGINT,
                stop_within=30,
            )
        )
        service.start()
        import psycopg

        with psycopg.connect(admin_url, autocommit=True) as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = 'agentsite'"
            ).fetchone()
            if not exists:
                connection.execute("CREATE DATABASE agentsite")
        self.say(f"PostgreSQL on 127.0.0.1:{self.postgres_port} (pid {service.pid})")

    def _start_redis(self) -> None:
        folder = self.folder / "redis"
        folder.mkdir(exist_ok=True)
        service = self._add(
            Service(
                "redis",
                [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.redis_port)]
                + ["--dir", str(folder), "--save", "", "--appendonly", "no"]
                + ["--protected-mode", "yes"],
                dict(os.environ),
                self.logs / "redis.log",
                answers=lambda service: answers_redis(self.redis_port)(),
                port=self.redis_port,
            )
        )
        service.start()
        self.say(f"Redis on 127.0.0.1:{self.redis_port} (pid {service.pid})")

    def _release(self) -> None:
        env = self.environment()
        for line in self.processes:
            if line.name == "release":
                self._run_step(line.command(), {**env, **line.env})
        if self.seed_demo:
            # The demo users with their demo passwords, as `make run` has them: seed_demo sets
            # those only with DEBUG on (a demo on this machine), so for this step alone.
            self._run_step(
                [sys.executable, "manage.py", "seed_demo"], {**env, "DEBUG": "1"}, show=True
            )

    def _run_step(self, argv: list[str], env: dict[str, str], show: bool = False) -> None:
        step = Service(
            "release", argv, env, self.logs / "release.log", answers=lambda service: False
        )
        output = step.run_once(within=300)
        if show:
            self.say(output.strip())

    def _start_processes(self) -> None:
        env = self.environment()
        kinds = {line.name: line for line in self.processes}
        missing = {"web", "worker"} - set(kinds)
        if missing:
            raise ServiceFailed(f"{PROCESSES} has no {' or '.join(sorted(missing))} line")
        for number in range(1, self.web_processes + 1):
            port = free_port()
            line = kinds["web"]
            self.web.append(
                self._add(
                    Service(
                        f"web-{number}",
                        line.command(port),
                        {**env, **line.env},
                        self.logs / f"web-{number}.log",
                        answers=lambda service: answers_http(
                            f"http://127.0.0.1:{service.port}{PROBE_PATH}"
                        )(),
                        port=port,
                        # The drain (AGENTSITE_SHUTDOWN_GRACE) and a little more.
                        stop_within=float(env.get("AGENTSITE_SHUTDOWN_GRACE") or 10) + 10,
                    )
                )
            )
        for number in range(1, self.workers + 1):
            line = kinds["worker"]
            self.worker.append(
                self._add(
                    Service(
                        f"worker-{number}",
                        line.command(),
                        {**env, **line.env},
                        self.logs / f"worker-{number}.log",
                        answers=_log_says("Starting worker"),
                        # The drain: no more claims, the runs in flight end (a turn or so).
                        stop_within=30,
                    )
                )
            )
        # Started together, waited for one by one: they start in parallel.
        for service in self.web + self.worker:
            service.spawn()
        for service in self.web + self.worker:
            service.wait()
            self.say(f"{service.name} (pid {service.pid})" + _on(service.port))

    def _start_nginx(self) -> None:
        prefix = self.folder / "nginx"
        config = write_nginx_config(
            prefix, self.logs, self.port, [web.port or 0 for web in self.web]
        )
        service = self._add(
            Service(
                "nginx",
                [NGINX, "-p", str(prefix), "-e", str(self.logs / "nginx-error.log")]
                + ["-c", str(config), "-g", "daemon off;"],
                dict(os.environ),
                self.logs / "nginx.log",
                answers=lambda service: answers_http(self.url + PROBE_PATH)(),
                port=self.port,
            )
        )
        service.start()
        self.say(f"nginx (pid {service.pid}) on 127.0.0.1:{self.port}")


def _on(port: int | None) -> str:
    return f" on 127.0.0.1:{port}" if port else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentsite.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--port", type=int, default=8000, help="nginx's port (8000)")
    parser.add_argument("--web-processes", type=int, default=2, help="web processes (2)")
    parser.add_argument("--workers", type=int, default=2, help="task workers (2)")
    parser.add_argument("--folder", type=Path, default=ROOT / ".cluster", help="(.cluster)")
    args = parser.parse_args(argv)
    if args.web_processes < 1 or args.workers < 1:
        parser.error("at least one web process and one worker")

    cluster = Cluster(
        args.folder,
        port=args.port,
        web_processes=args.web_processes,
        workers=args.workers,
        say=lambda text: print(text, flush=True),
    )

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # Ctrl-C as well as SIGTERM, even when started with SIGINT ignored (in the background).
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    code = 0
    try:
        cluster.start()
        print(f"\nagentsite on {cluster.url}/  (logs in {cluster.logs}; Ctrl-C stops it)")
        while True:
            for service in cluster.services:
                if not service.running():
                    assert service.process is not None
                    print(
                        f"{service.name} exited ({service.process.returncode}); the end of "
                        f"{service.log_path}:\n{service.log_tail()}",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.5)
    except ServiceFailed as failure:
        print(failure, file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C would leave processes behind; each is killed after its wait anyway.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("Stopping: nginx, web, workers, Redis, PostgreSQL", flush=True)
        cluster.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
