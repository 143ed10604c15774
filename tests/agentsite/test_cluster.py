"""The pieces `make cluster` is built of (agentsite/cluster.py), without a cluster: the process
list and the nginx site a team copies from deploy/, and a service that fails to start."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentsite.cluster import (
    NGINX,
    Cluster,
    ProcessLine,
    Service,
    ServiceFailed,
    _log_says,
    free_port,
    read_processes,
    render_nginx_site,
    write_nginx_config,
)


def test_the_process_list_releases_then_runs_web_processes_and_workers_on_the_tasks_executor() -> (
    None
):
    lines = read_processes()
    assert [line.name for line in lines] == ["release", "release", "web", "worker"]
    assert [line.argv[-2:] for line in lines[:2]] == [
        ["migrate", "--no-input"],
        ["collectstatic", "--no-input"],
    ]
    web, worker = lines[2], lines[3]
    # Runs execute in the workers: every process that enqueues or runs them says so.
    assert web.env == worker.env == {"AGENTSITE_EXECUTOR": "tasks"}
    command = web.command(8123)
    assert command[0] == sys.executable  # this checkout's virtualenv
    assert command[command.index("-p") + 1] == "8123"
    assert "--proxy-headers" in command  # the client's address is nginx's X-Forwarded-For
    # The worker that runs many runs at once (engine/management/commands/run_worker.py), not
    # django-tasks-db's `db_worker`, which runs one at a time.
    assert worker.command()[1:3] == ["manage.py", "run_worker"]
    with pytest.raises(ValueError, match="needs a port"):
        web.command()


@pytest.mark.parametrize("line", ["web python -m agentsite.serve", "web:", "web: DEBUG=1"])
def test_a_process_line_it_cannot_read_is_refused(tmp_path: Path, line: str) -> None:
    path = tmp_path / "processes"
    path.write_text(f"# a comment\n\n{line}\n")
    with pytest.raises(ValueError, match=r"processes:3"):
        read_processes(path)


def test_a_process_line_keeps_its_environment_apart_from_its_command(tmp_path: Path) -> None:
    path = tmp_path / "processes"
    path.write_text("web: A=1 B_2='two words' python -m x -p ${PORT}\n")
    assert read_processes(path) == [
        ProcessLine("web", {"A": "1", "B_2": "two words"}, ["python", "-m", "x", "-p", "${PORT}"])
    ]


def test_the_nginx_site_renders_and_nginx_accepts_it(tmp_path: Path) -> None:
    config = write_nginx_config(tmp_path / "nginx", tmp_path, free_port(), [8101, 8102])
    site = (tmp_path / "nginx" / "agentsite.conf").read_text()
    assert not re.search(r"\$\{AGENTSITE_[A-Z_]+\}", site)
    assert "server 127.0.0.1:8101;\n    server 127.0.0.1:8102;" in site
    assert "least_conn;" in site
    checked = subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path / "nginx"), "-e", str(tmp_path / "error.log")]
        + ["-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    assert "syntax is ok" in checked.stderr


def test_the_nginx_site_refuses_a_name_it_was_not_given() -> None:
    with pytest.raises(KeyError, match="AGENTSITE_"):
        render_nginx_site({"AGENTSITE_LISTEN": "127.0.0.1:1"})


def service(tmp_path: Path, code: str, answers: str = "never said") -> Service:
    return Service(
        "probe",
        [sys.executable, "-u", "-c", code],
        {},
        tmp_path / "probe.log",
        answers=_log_says(answers),
    )


def test_a_service_that_exits_at_start_fails_with_the_end_of_its_log(tmp_path: Path) -> None:
    broken = service(tmp_path, "print('could not connect to the database'); raise SystemExit(3)")
    with pytest.raises(ServiceFailed) as failed:
        broken.start(within=10)
    assert "probe exited with 3 at start" in str(failed.value)
    assert "could not connect to the database" in str(failed.value)


def test_a_service_that_never_answers_is_killed_and_fails_with_the_end_of_its_log(
    tmp_path: Path,
) -> None:
    silent = service(tmp_path, "import time; print('still loading'); time.sleep(60)")
    with pytest.raises(ServiceFailed) as failed:
        silent.start(within=1)
    assert "probe did not answer within 1 s" in str(failed.value)
    assert "still loading" in str(failed.value)
    assert not silent.running()


def test_a_service_is_stopped_by_its_process_id_and_started_again(tmp_path: Path) -> None:
    probe = service(tmp_path, "import time; print('ready'); time.sleep(60)", answers="ready")
    probe.start(within=10)
    first = probe.pid
    probe.stop()
    assert not probe.running()
    assert probe.process is not None and probe.process.returncode == -15  # SIGTERM
    probe.start(within=10)  # its log is read from the new start on
    assert probe.running() and probe.pid != first
    assert probe.log() == "ready\n"
    probe.kill()
    assert probe.process.returncode == -9


def test_the_emails_of_a_cluster_link_to_its_nginx(tmp_path: Path) -> None:
    """Its web processes are behind nginx and its workers send the mail: neither knows the
    address people reach, so the cluster says it (`make cluster PORT=8080` linked to 8000)."""
    env = Cluster(tmp_path, port=8080, base_env={}).environment()
    assert env["AGENTSITE_EMAIL_SITE_URL"] == "http://127.0.0.1:8080"

    configured = {"AGENTSITE_EMAIL_SITE_URL": "https://agents.example.com"}
    env = Cluster(tmp_path, port=8080, base_env=configured).environment()
    assert env["AGENTSITE_EMAIL_SITE_URL"] == "https://agents.example.com"
