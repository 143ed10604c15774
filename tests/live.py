"""A real agentsite server (daphne, ASGI) and a real Chromium, for browser tests.

The server runs in a subprocess against the test database file, so a test must use
`transactional_db` for the server to see its data.

Every page a browser test opens is watched for the Content Security Policy: a page of the
site served without the header, or anything the policy refused (an inline script or style,
an eval, a connection), fails the test (see `csp_problems`).

Screenshots go to a temporary folder, or to docs/screenshots when AGENTSITE_SCREENSHOTS=1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

# Playwright's `expect` waits up to 15 s for what it expects (its default is 5 s): the suite
# shares two cores between two test processes, their live servers and browsers, so a page
# may take longer to show what it will show. What is expected stays the same.
expect.set_options(timeout=15_000)

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveSite:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def test_database_url() -> str:
    """The URL of the test database this process uses, for servers and workers it starts."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def start_site(
    database_url: str,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    port: int | None = None,
) -> LiveSite:
    port = port or free_port()
    # The developer's model credentials stay out; a test's own (the local provider) go in.
    inherited = {
        name: value
        for name, value in os.environ.items()
        if name not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")
    }
    env = {
        **inherited,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "AGENTSITE_LIVE_TEST_SERVER": "1",
        "DATABASE_URL": database_url,
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentsite.serve",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "agentsite.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    site = LiveSite(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the site exited at start:\n{site.log()}")
        try:
            with urllib.request.urlopen(site.url + "/accounts/login/", timeout=2):
                return site
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the site did not answer within 30 s:\n{site.log()}")


def stop_site(site: LiveSite) -> None:
    site.process.terminate()
    try:
        site.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        site.process.kill()


def flush_traces(site: LiveSite) -> None:
    """Have `site` store the traces its processor holds (tests/urls.py): at the end of a test,
    before its database is emptied. Without it, a trace stored a moment after the test ended
    landed in the next test's database (tests that count traces saw one more)."""
    with urllib.request.urlopen(f"{site.url}/__tests__/flush-traces/", timeout=30) as answer:
        assert answer.status == 204, answer.status


@pytest.fixture(autouse=True)
def live_site_traces_flushed(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the shared `live_site` (its database emptied only after this
    fixture's teardown: pytest-django's database fixtures come first), its traces are in."""
    yield
    if "live_site" in request.fixturenames:
        flush_traces(request.getfixturevalue("live_site"))


@pytest.fixture(scope="session")
def live_site(
    django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveSite]:
    with django_db_blocker.unblock():
        database_url = test_database_url()
    # It serves the whole session on the test database: sweeping it (expiry every minute,
    # recovery on every heartbeat) or polling its outboxes (webhooks, emails) would act on the
    # rows of whatever test runs then, as a foreign process (the sweeper's concurrency test saw
    # its requests expired by it, the webhooks' delivery test one of its deliveries sent by it:
    # tests/harness/test_live.py). A test that wants a sweeping, beating or sending server
    # starts its own.
    site = start_site(
        database_url,
        tmp_path_factory.mktemp("site") / "daphne.log",
        {
            "AGENTSITE_SWEEP_SECONDS": "0",
            "AGENTSITE_HEARTBEAT_SECONDS": "0",
            "AGENTSITE_WEBHOOK_POLL_SECONDS": "0",
            "AGENTSITE_EMAIL_POLL_SECONDS": "0",
        },
    )
    yield site
    stop_site(site)


# Reports every `securitypolicyviolation` of a page to the test (console messages say the same
# for what happens before any script runs, and with JavaScript off).
CSP_WATCH = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.__agentsiteCspViolation(
    `${event.effectiveDirective} refused ${event.blockedURI || "inline code"}` +
    ` in ${event.sourceFile || event.documentURI}:${event.lineNumber}`
  );
}, true);
"""
CSP_CONSOLE = ("Content Security Policy", "Refused to")


def watch_csp(context: Any, problems: list[str], site_prefix: str = "http://127.0.0.1:") -> None:
    """Record in `problems` what the policy refuses in `context`'s pages, and every page of
    the site (any local server) that arrives without the policy."""

    def on_console(message: Any) -> None:
        if any(marker in message.text for marker in CSP_CONSOLE):
            problems.append(f"console: {message.text}")

    def on_response(response: Any) -> None:
        if response.request.resource_type != "document" or not response.url.startswith(site_prefix):
            return
        if "content-security-policy" not in response.headers:
            problems.append(f"no Content-Security-Policy header on {response.url}")

    context.expose_binding(
        "__agentsiteCspViolation", lambda source, text: problems.append(f"event: {text}")
    )
    context.add_init_script(script=CSP_WATCH)
    context.on("console", on_console)
    context.on("response", on_response)


@pytest.fixture
def csp_problems() -> Iterator[list[str]]:
    """What the Content Security Policy refused (or missed) in this test's browser: must be
    nothing when the test ends. A test that provokes a violation on purpose empties it."""
    problems: list[str] = []
    yield problems
    assert not problems, "Content Security Policy problems:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def module_chromium() -> Iterator[Any]:
    """One headless Chromium for a module's browser tests (a launch is a second or two of
    wall time and of CPU); each test gets it through `browser`.

    Playwright's sync API keeps an event loop running in this thread while it is open, which
    makes Django refuse the ORM here; the tests' own ORM calls are still plain sync code, so
    that check is lifted for as long as the browser is open: the module's tests (all browser
    tests) and their fixtures. Module-scoped, so no loop outlives the browser tests' module.
    """
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
            )
            yield chromium
            chromium.close()


@pytest.fixture
def browser(
    module_chromium: Any, monkeypatch: pytest.MonkeyPatch, csp_problems: list[str]
) -> Iterator[Any]:
    """The module's Chromium for one test: every context it opens is watched (`watch_csp`)
    into this test's `csp_problems`, and closed when the test ends (cookies, pages and
    sockets with it), so the next test starts with none."""
    new_context = module_chromium.new_context

    def watched_context(**kwargs: Any) -> Any:
        context = new_context(**kwargs)
        watch_csp(context, csp_problems)
        return context

    monkeypatch.setattr(module_chromium, "new_context", watched_context)
    yield module_chromium
    for context in list(module_chromium.contexts):
        context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where a test saves its screenshots: docs/screenshots when AGENTSITE_SCREENSHOTS=1 (to
    refresh the README's pictures), else this test's temporary folder, so that a test run
    leaves the work tree as it was."""
    folder = SCREENSHOTS if os.environ.get("AGENTSITE_SCREENSHOTS") == "1" else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    return folder
