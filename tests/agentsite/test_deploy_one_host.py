"""The "One host" section of docs/deploy.md, run as written. Its shell blocks are read from
the guide itself, so the guide and these tests cannot drift apart, and run with this checkout
standing in for /srv/agentsite and a temporary folder for /etc. What needs a real host is
left out: the package manager, git, systemctl, certbot, the editor, PostgreSQL's createuser
and createdb."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.agentsite.test_deploy_docs import EXAMPLE, assignments

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy.md"
NGINX = "/usr/sbin/nginx"
CRON_FILE = ROOT / "deploy" / "cron" / "agentsite"

# Commands that need a real host or a person, not run here.
NOT_HERE = ("apt-get", "useradd", "git", "systemctl", "certbot", "editor", "nginx")


def one_host() -> str:
    guide = GUIDE.read_text()
    return guide.split("\n## One host\n", 1)[1].split("\n## ", 1)[0]


def shell_blocks() -> list[str]:
    """The guide's ```sh blocks in "One host", in order, out of their list items' indent."""
    found = re.findall(r"^( *)```sh\n(.*?)^\1```$", one_host(), re.MULTILINE | re.DOTALL)
    return [textwrap.dedent(body) for _, body in found]


def block(containing: str) -> str:
    """The one shell block of "One host" that contains `containing`."""
    found = [body for body in shell_blocks() if containing in body]
    assert len(found) == 1, f"{len(found)} blocks of docs/deploy.md contain {containing!r}"
    return found[0]


def here(commands: str, tmp_path: Path) -> str:
    """`commands` as this test runs them: as the current user (the guide's `agentsite`, who
    owns files and runs commands there, does not exist here), on this checkout and its
    interpreter, with /etc in `tmp_path`, without the commands of NOT_HERE (nor their
    continuation lines)."""
    kept: list[str] = []
    dropping = False
    for line in commands.splitlines():
        if not dropping:
            dropping = line.split(" ", 1)[0] in NOT_HERE
            if not dropping:
                kept.append(line)
        dropping = dropping and line.endswith("\\")
    text = "\n".join(kept) + "\n"
    for host, test in [
        ("runuser -u agentsite -- ", ""),
        ("-o agentsite -g agentsite ", ""),
        ("/srv/agentsite/.venv/bin/python", sys.executable),
        ("/srv/agentsite", str(ROOT)),
        ("/etc/", f"{tmp_path}/etc/"),
    ]:
        text = text.replace(host, test)
    return text


def environment(tmp_path: Path, **env: str) -> dict[str, str]:
    """As little as cron gives a command, plus what points the guide's paths at the test's:
    the environment file, and this checkout's virtualenv (the guide's is /srv/agentsite/.venv).
    """
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "AGENTSITE_ENV_FILE": str(tmp_path / "etc" / "agentsite" / "agentsite.env"),
        "VIRTUAL_ENV": sys.prefix,
        **env,
    }


def run(commands: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`commands` of the guide, as `here` makes them, in bash from the checkout (the guide's
    /srv/agentsite), stopping at the first that fails."""
    return subprocess.run(
        ["bash", "-e", "-u", "-c", here(commands, tmp_path)],
        cwd=ROOT,
        env=environment(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def command(containing: str) -> str:
    """The one line of the guide's shell blocks that contains `containing`."""
    found = [line for body in shell_blocks() for line in body.splitlines() if containing in line]
    assert len(found) == 1, f"{len(found)} lines of docs/deploy.md contain {containing!r}"
    return found[0]


# --- packages ---------------------------------------------------------------------------


def test_the_guide_installs_the_packages_its_commands_run() -> None:
    commands = "\n".join(shell_blocks())
    installs = " ".join(re.findall(r"apt-get install (?:-y )?([^\n\\]+)", commands)).split()
    needed = {
        "envsubst": "gettext-base",
        "git ": "git",
        "-m venv": "python3.13-venv",
        "createuser": "postgresql",
        "nginx -t": "nginx",
        "/etc/cron.d/": "cron",
        "certbot": "python3-certbot-nginx",
    }
    for used, package in needed.items():
        assert used in commands, used
        assert package in installs, package
    assert "redis-server" in installs


# --- step 2: the database -----------------------------------------------------------------


def test_the_database_the_guide_creates_is_the_one_the_environment_names() -> None:
    url = urlsplit({name: value for name, value, _ in assignments()}["DATABASE_URL"])
    role = command("createuser").split()[-1]
    created = command("createdb").split()

    assert url.username == role == "agentsite"
    assert created[-1] == url.path.lstrip("/")
    assert created[created.index("--owner") + 1] == role
    # Debian's PostgreSQL takes passwords over TCP from this host (pg_hba.conf: host ...
    # 127.0.0.1/32 scram-sha-256); its Unix socket would want the peer's system user.
    assert url.hostname == "127.0.0.1"


# --- step 3: the environment file, and commands run by hand ------------------------------


def environment_file(tmp_path: Path) -> Path:
    """/etc/agentsite/agentsite.env as step 3 makes it, then filled in as its editor is told."""
    made = run(block("/etc/agentsite/agentsite.env"), tmp_path)
    assert made.returncode == 0, made.stderr
    env_file = tmp_path / "etc" / "agentsite" / "agentsite.env"
    assert env_file.stat().st_mode & 0o777 == 0o600
    text = env_file.read_text()
    # The keys are made by the commands; the editor is left what only a person knows, each
    # named in the guide.
    left = {match[1] for match in re.finditer(r"^([A-Z_]+)=.*<", text, re.MULTILINE)}
    assert left == {"DATABASE_URL", "OPENAI_API_KEY"}
    for name in left:
        assert name in one_host(), name
    values = dict(re.findall(r"^([A-Z_]+)=(.*)$", text, re.MULTILINE))
    assert len(values["SECRET_KEY"]) >= 50
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}=", values["AGENTSITE_SESSION_ENCRYPTION_KEY"])
    text = text.replace("<password>", "0123456789abcdef").replace(
        "'<your OpenAI API key>'", "sk-not-a-real-key"
    )
    env_file.write_text(text)
    return env_file


def test_the_environment_file_passes_the_deployment_checks_through_the_guides_wrapper(
    tmp_path: Path,
) -> None:
    environment_file(tmp_path)

    checked = run(command("check --deploy"), tmp_path)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout


def test_the_wrapper_says_in_one_line_that_the_environment_file_is_missing(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "nowhere.env"

    checked = run(command("check --deploy"), tmp_path, AGENTSITE_ENV_FILE=str(missing))

    assert checked.returncode != 0
    assert checked.stderr.strip().splitlines() == [
        f"deploy/manage: cannot read {missing}: no such file. Make it as docs/deploy.md says "
        "(One host, step 3), or name another with AGENTSITE_ENV_FILE."
    ]


def test_the_wrapper_reads_every_value_of_the_example_as_systemd_does(
    tmp_path: Path,
) -> None:
    """deploy/manage's shell sets each value of the example (commented ones uncommented) to
    what systemd reads in it (tests/agentsite/test_deploy_docs.py holds systemd's side)."""
    env_file = tmp_path / "all.env"
    env_file.write_text(re.sub(r"^# ([A-Z][A-Z0-9_]*=)", r"\1", EXAMPLE.read_text(), flags=re.M))
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexec env -0\n")
    python.chmod(0o755)

    shown = subprocess.run(
        [str(ROOT / "deploy" / "manage"), "help"],
        env=environment(
            tmp_path, AGENTSITE_ENV_FILE=str(env_file), VIRTUAL_ENV=str(tmp_path / "venv")
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert shown.returncode == 0, shown.stderr
    read = dict(item.split("=", 1) for item in shown.stdout.split("\0") if item)
    written = {name: value for name, value, _ in assignments()}
    assert {name: read.get(name) for name in written} == written


# --- step 4: database, static files -------------------------------------------------------


def test_the_hand_run_commands_go_through_the_wrapper_as_agentsite() -> None:
    for name in ("migrate", "collectstatic", "createsuperuser", "check --deploy"):
        line = command(f"manage {name}")
        assert line.startswith("runuser -u agentsite -- /srv/agentsite/deploy/manage "), line
    assert (ROOT / "deploy" / "manage").stat().st_mode & 0o111


# --- steps 6 and 7: nginx, then TLS ------------------------------------------------------

NGINX_CONF = """\
# What Debian's /etc/nginx/nginx.conf holds that matters here: the sites it includes.
pid {prefix}/nginx.pid;
error_log stderr;
events {{
}}
http {{
    include /etc/nginx/mime.types;
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/etc/nginx/sites-enabled/*;
}}
"""


def debian_nginx(tmp_path: Path) -> Path:
    """/etc/nginx in `tmp_path` as Debian's package leaves it: its default site enabled."""
    etc = tmp_path / "etc" / "nginx"
    (etc / "sites-available").mkdir(parents=True)
    (etc / "sites-enabled").mkdir()
    default = etc / "sites-available" / "default"
    default.write_text("server {\n    listen 80 default_server;\n    root /var/www/html;\n}\n")
    (etc / "sites-enabled" / "default").symlink_to(default)
    (etc / "nginx.conf").write_text(NGINX_CONF.format(prefix=tmp_path))
    return etc


def directives(site: Path) -> str:
    """The nginx configuration in `site` without its comments."""
    return "\n".join(line.split("#", 1)[0].strip() for line in site.read_text().splitlines())


def nginx_test(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on the configuration in `tmp_path`: it reads every file and certificate,
    binds nothing."""
    return subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path), "-e", "stderr"]
        + ["-c", str(tmp_path / "etc" / "nginx" / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_nginx_step_renders_and_enables_a_site_nginx_accepts(tmp_path: Path) -> None:
    etc = debian_nginx(tmp_path)

    made = run(block("envsubst"), tmp_path)

    assert made.returncode == 0, made.stderr
    assert [path.name for path in (etc / "sites-enabled").iterdir()] == ["agentsite"]
    site = directives(etc / "sites-enabled" / "agentsite")
    assert "listen 80;" in site
    assert "server_name agents.example.com;" in site
    assert "${" not in site  # every name of the template replaced; nginx's own $names stay
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in site
    assert f"alias {ROOT}/staticfiles/;" in site
    tested = nginx_test(tmp_path)
    assert tested.returncode == 0, tested.stderr
    assert "test is successful" in tested.stderr


def self_signed(folder: Path, name: str) -> None:
    """fullchain.pem and privkey.pem in `folder`, as certbot leaves them, for `name`."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True)
    (folder / "fullchain.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / "privkey.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def test_the_tls_step_makes_the_site_https_with_a_redirect_nginx_accepts(
    tmp_path: Path,
) -> None:
    etc = debian_nginx(tmp_path)
    self_signed(
        tmp_path / "etc" / "letsencrypt" / "live" / "agents.example.com", "agents.example.com"
    )
    assert run(block("envsubst"), tmp_path).returncode == 0

    made = run(block("listen 443 ssl"), tmp_path)

    assert made.returncode == 0, made.stderr
    site = directives(etc / "sites-available" / "agentsite")
    assert site.count("listen 443 ssl;") == 1
    assert site.count("listen 80;") == 1  # the redirect's
    assert "return 301 https://$host$request_uri;" in site
    tested = nginx_test(tmp_path)
    assert tested.returncode == 0, tested.stderr
    assert "test is successful" in tested.stderr


# --- step 8: cron -------------------------------------------------------------------------


def test_the_cron_file_prunes_traces_daily_as_agentsite_through_the_wrapper(
    tmp_path: Path,
) -> None:
    text = CRON_FILE.read_text()
    # cron reads a file of /etc/cron.d/ only if its name is letters, digits, _ and -, and
    # a last line only if it ends.
    assert re.fullmatch(r"[A-Za-z0-9_-]+", CRON_FILE.name)
    assert text.endswith("\n")
    jobs = [
        line.split(None, 6)
        for line in text.splitlines()
        if line.strip() and not line.startswith("#") and not re.match(r"^[A-Z]+=", line)
    ]
    assert len(jobs) == 1
    minute, hour, day, month, weekday, user, job = jobs[0]
    assert minute.isdigit() and hour.isdigit()
    assert (day, month, weekday) == ("*", "*", "*")
    assert user == "agentsite"
    assert job.split()[:2] == ["/srv/agentsite/deploy/manage", "prune_traces"]
    installed = block("/etc/cron.d/")
    assert "install -m 0644 deploy/cron/agentsite /etc/cron.d/agentsite" in installed

    # The job in a shell with cron's bare environment, asked for its help: the wrapper
    # reaches the command, with the settings loaded from the environment file.
    environment_file(tmp_path)
    helped = run(f"{job} --help", tmp_path)

    assert helped.returncode == 0, helped.stderr
    assert "--older-than" in helped.stdout
