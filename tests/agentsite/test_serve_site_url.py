"""The links in emails lead to the server that sent them: a server started as `make run`
starts it (`agentsite/serve.py`), on a port of its own, links to that port unless the site's
address is configured; behind a proxy, or on a socket, it cannot tell and links nowhere of
its own."""

from __future__ import annotations

import email
import email.policy
import time
import urllib.request
from pathlib import Path

import pytest

from agentsite.serve import default_site_url, served_url
from tests.factories import make_request
from tests.live import free_port, start_site, stop_site
from tests.live import test_database_url as live_database_url
from tests.notifications import LINK, SmtpServer, announce, opted_in

APP = "agentsite.asgi:application"


@pytest.mark.parametrize(
    ("argv", "url"),
    [
        (["-b", "127.0.0.1", "-p", "21080", APP], "http://127.0.0.1:21080"),  # `make run`
        ([APP], "http://127.0.0.1:8000"),  # daphne's defaults
        (["-p", "9000", APP], "http://127.0.0.1:9000"),
        (["-b", "localhost", APP], "http://localhost:8000"),
        (["--bind=::1", "--port=9000", APP], "http://[::1]:9000"),
        # Every interface: this machine's own address is one of them.
        (["-b", "0.0.0.0", "-p", "9000", APP], "http://127.0.0.1:9000"),
        (["-b", "::", "-p", "9000", APP], "http://[::1]:9000"),
    ],
)
def test_it_reads_the_address_it_serves_from_its_arguments(argv: list[str], url: str) -> None:
    assert served_url(argv) == url


@pytest.mark.parametrize(
    "argv",
    [
        # Behind a proxy, the proxy's address is the site's.
        ["--proxy-headers", "-b", "127.0.0.1", "-p", "9000", APP],
        ["-u", "/tmp/agentsite.sock", APP],
        ["--fd", "3", APP],
        ["-e", "ssl:443:privateKey=key.pem", APP],
        ["-p", "0", APP],  # any free port: not known before it listens
        ["-p", "ninety", APP],  # daphne says what is wrong with it
        [],
    ],
)
def test_it_names_no_address_it_cannot_tell(argv: list[str]) -> None:
    assert served_url(argv) is None


def test_the_served_address_is_the_default_of_the_emails_links_only() -> None:
    argv = ["-b", "127.0.0.1", "-p", "21080", APP]
    environ: dict[str, str] = {}
    default_site_url(argv, environ)
    assert environ == {"AGENTSITE_EMAIL_SITE_URL": "http://127.0.0.1:21080"}

    environ = {"AGENTSITE_EMAIL_SITE_URL": ""}  # empty is not set, as the settings read it
    default_site_url(argv, environ)
    assert environ == {"AGENTSITE_EMAIL_SITE_URL": "http://127.0.0.1:21080"}

    # Configured, or configured for webhooks (which emails fall back to): left as it is.
    for configured in (
        {"AGENTSITE_EMAIL_SITE_URL": "https://agents.example.com"},
        {"AGENTSITE_WEBHOOK_SITE_URL": "https://agents.example.com"},
    ):
        environ = dict(configured)
        default_site_url(argv, environ)
        assert environ == configured

    environ = {}
    default_site_url(["--proxy-headers", *argv], environ)
    assert environ == {}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("orders")
def test_a_server_on_a_port_of_its_own_emails_links_that_reach_it(tmp_path: Path) -> None:
    opted_in("rita")
    request = make_request()
    announce(request)  # queued; the server's own timer sends it
    smtp = SmtpServer()
    port = free_port()
    assert port != 8000
    site = start_site(
        live_database_url(),
        tmp_path / "site.log",
        {
            # Nothing configured: the server's own address is the default.
            "AGENTSITE_EMAIL_SITE_URL": "",
            "AGENTSITE_WEBHOOK_SITE_URL": "",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(smtp.port),
            "EMAIL_USE_TLS": "0",
            "AGENTSITE_EMAIL_POLL_SECONDS": "0.2",
            "AGENTSITE_SWEEP_SECONDS": "0",
            "AGENTSITE_HEARTBEAT_SECONDS": "0",
            "AGENTSITE_WEBHOOK_POLL_SECONDS": "0",
        },
        port=port,
    )
    try:
        deadline = time.monotonic() + 30
        while not smtp.messages and time.monotonic() < deadline:
            time.sleep(0.1)
        assert smtp.messages, site.log()
        sent = email.message_from_bytes(smtp.messages[0], policy=email.policy.default)
        text = sent.get_body(("plain",)).get_content()
        (link,) = LINK.findall(text)
        assert link.startswith(f"http://127.0.0.1:{port}/notifications/open/?t="), link

        # Followed (nobody logged in): the server answers, with its login page.
        with urllib.request.urlopen(link, timeout=10) as answer:
            assert answer.status == 200
            assert answer.url.startswith(f"http://127.0.0.1:{port}/accounts/login/?next=")
    finally:
        stop_site(site)
        smtp.close()
