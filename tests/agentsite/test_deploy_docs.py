"""`deploy/.env.example` is production's environment, documented: every name
in it is a setting agentsite/settings.py reads, every setting is in it, what a production
site must set is set (not commented out), and filled in it passes Django's deployment
checks. `docs/deploy.md` is linked from the README and the map, and the files it names exist.
"""

from __future__ import annotations

import getpass
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.agentsite.test_settings import variables_read
from tests.agentsite.test_settings_deploy import PRODUCTION, STRONG_KEY, manage

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / ".env.example"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"

# What a production deploy of several processes must set itself: the defaults suit `make run`
# (one process, SQLite, the in-memory layer, no TLS, the demo's offline model), not it.
MUST_SET = {
    *PRODUCTION,  # DEBUG off, the key, hosts, origins, TLS and the proxy's header
    "DATABASE_URL",  # one PostgreSQL for every process
    "DATABASE_POOL_MAX_SIZE",  # within the connection budget
    "REDIS_URL",  # the channel layer the processes share
    "AGENTSITE_EXECUTOR",  # runs in workers
    "AGENTSITE_SESSION_ENCRYPTION_KEY",  # conversations encrypted at rest
    "OPENAI_API_KEY",  # a real model
    "DEFAULT_FROM_EMAIL",  # the emails' sender, at the site's own domain
    "AGENTSITE_EMAIL_SITE_URL",  # the emails' links are absolute: the site's address
}
# Values a team replaces (`<...>`), filled in here to check the rest.
FILLED = {
    "SECRET_KEY": STRONG_KEY,
    "AGENTSITE_SESSION_ENCRYPTION_KEY": Fernet.generate_key().decode(),
    "OPENAI_API_KEY": "sk-not-a-real-key",
}
ASSIGNMENT = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$")
# The values systemd's EnvironmentFile= (the units) and a POSIX shell (deploy/manage sources the
# file for commands run by hand and by cron) read alike: a word of characters that neither
# gives a meaning to, or text in single quotes with no quote inside. Anything else, a space,
# `<`, `$`, a backslash or a double quote, is read one way by systemd and another by the shell.
PLAIN_VALUE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*")
QUOTED_VALUE = re.compile(r"'([^'\n]*)'")


def value_of(name: str, written: str) -> str:
    """What `NAME=written` sets, to systemd and to the shell alike; refused if they differ."""
    if PLAIN_VALUE.fullmatch(written):
        return written
    quoted = QUOTED_VALUE.fullmatch(written)
    if quoted is None:
        raise ValueError(f"{name}={written}: systemd and a shell read it differently; quote it")
    return quoted[1]


def assignments() -> list[tuple[str, str, bool]]:
    """(name, value, set): each `NAME=value` line, and whether it is set or commented out."""
    found = []
    for line in EXAMPLE.read_text().splitlines():
        match = ASSIGNMENT.match(line.strip())
        if match:
            name = match.group(2)
            found.append((name, value_of(name, match.group(3)), match.group(1) is None))
    return found


def production_environment() -> dict[str, str]:
    env = {name: value for name, value, is_set in assignments() if is_set}
    for name, value in FILLED.items():
        env[name] = value
    env["DATABASE_URL"] = env["DATABASE_URL"].replace("<password>", "not-a-password")
    return env


def test_every_name_in_the_example_is_a_setting_and_every_setting_is_there() -> None:
    named = [name for name, _, _ in assignments()]
    read = set(variables_read())

    assert len(named) == len(set(named)), "a name given twice"
    assert set(named) - read == set()  # nothing the settings do not read
    assert read - set(named) == set()  # nothing the settings read left out


# systemd's reader of environment.d files: the parser of EnvironmentFile= (systemd's
# src/basic/env-file.c), which then expands `$` (no value above may hold one) and skips an
# empty value (EnvironmentFile= sets it empty).
ENVIRONMENT_D = Path(
    "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator"
)


def read_by_systemd(text: str, folder: Path) -> dict[str, str]:
    (folder / "environment.d").mkdir()
    (folder / "environment.d" / "agentsite.conf").write_text(text)
    read = subprocess.run(
        [str(ENVIRONMENT_D)],
        env={"XDG_CONFIG_HOME": str(folder), "HOME": str(folder)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = {}
    for line in read.stdout.splitlines():
        name, value = line.split("=", 1)
        if value.startswith('"'):  # printed quoted, with \ before `"`, `\`, `$` and `
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        found[name] = value
    return found


def test_every_value_of_the_example_reads_alike_to_systemd_and_to_a_shell(
    tmp_path: Path,
) -> None:
    """The units read the file with systemd's rules, deploy/manage with the shell's: each line,
    commented ones uncommented, sets the same value for both (the shell's side:
    tests/agentsite/test_deploy_one_host.py)."""
    text = re.sub(r"^# ([A-Z][A-Z0-9_]*=)", r"\1", EXAMPLE.read_text(), flags=re.MULTILINE)
    written = {name: value for name, value, _ in assignments()}  # refuses any other value

    read = read_by_systemd(text, tmp_path)

    assert {name: read.get(name, "") for name in written} == written


def test_what_production_must_set_is_set() -> None:
    values = {name: value for name, value, is_set in assignments() if is_set}

    assert MUST_SET - set(values) == set()
    assert values["DEBUG"] == "0"
    assert values["AGENTSITE_EXECUTOR"] == "tasks"
    assert values["REDIS_URL"].startswith("redis://")
    assert values["DATABASE_URL"].startswith("postgres://")
    # Only values a team must choose are left to fill in, each named here.
    placeholders = {name for name, value in values.items() if "<" in value}
    assert placeholders == {*FILLED, "DATABASE_URL"}


def test_the_example_filled_in_passes_the_deployment_checks() -> None:
    env = production_environment()
    assert not any("<" in value for value in env.values())

    checked = manage("check", "--deploy", "--fail-level", "WARNING", **env)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_the_deploy_guide_is_linked_and_names_files_that_exist() -> None:
    guide = DEPLOY_DOC.read_text()

    assert "docs/deploy.md" in (ROOT / "README.md").read_text()
    assert "deploy.md" in (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`((?:deploy|scripts|bench|tests|engine|agentsite)/[\w./-]+)`", guide))
    assert "deploy/.env.example" in named
    missing = {path for path in named if not (ROOT / path.rstrip("/")).exists()}
    assert missing == set()
    # Each part the guide must cover.
    for heading in (
        "## One host",
        "## Several hosts",
        "## Upgrades",
        "## What to monitor",
        "## Which process sweeps",
        "## When Redis is down",
        "## The ASGI server",
    ):
        assert heading in guide, heading


# --- the systemd units ------------------------------------------------------------------------

UNITS = ROOT / "deploy" / "systemd"


@pytest.mark.parametrize("unit", ["agentsite-web@.service", "agentsite-worker@.service"])
def test_each_systemd_unit_verifies_and_starts_at_boot(unit: str, tmp_path: Path) -> None:
    """`systemd-analyze verify` (systemd's own checker) finds nothing to say of each unit, an
    instance of it as `systemctl enable` makes one, with the paths of this checkout standing
    in for /srv/agentsite; each starts at boot, after the network and the services it needs."""
    text = (UNITS / unit).read_text()
    sections = re.findall(r"^\[(\w+)\]$", text, re.MULTILINE)
    assert sections == ["Unit", "Service", "Install"]
    assert "WantedBy=multi-user.target" in text
    assert "After=network-online.target postgresql.service redis-server.service" in text
    assert "EnvironmentFile=/etc/agentsite/agentsite.env" in text
    environment = tmp_path / "agentsite.env"
    environment.write_text("DEBUG=0\n")
    here = (
        text.replace("/srv/agentsite/.venv/bin/python", sys.executable)
        .replace("/srv/agentsite", str(ROOT))
        .replace("/etc/agentsite/agentsite.env", str(environment))
        .replace("User=agentsite", f"User={getpass.getuser()}")
    )
    instance = tmp_path / unit.replace("@.", "@8001.")
    instance.write_text(here)
    verified = subprocess.run(
        ["systemd-analyze", "verify", str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert verified.returncode == 0, verified.stderr
    said = [line for line in verified.stderr.splitlines() if str(instance) in line]
    assert said == [], verified.stderr


def test_the_guide_installs_the_units_it_ships() -> None:
    guide = DEPLOY_DOC.read_text()
    assert "deploy/systemd/agentsite-web@.service" in guide
    assert "deploy/systemd/agentsite-worker@.service" in guide
    assert "systemctl daemon-reload" in guide
    # No unit is written out in the guide any more: the files are the one copy.
    assert "[Service]" not in guide
