"""Where the site may send (`common/destinations.py`): public addresses only, unless
AGENTSITE_OUTBOUND_ALLOWED_HOSTS names the host or its network. Each spelling of a loopback,
link-local, private or unspecified address, and a name that resolves to one, is refused at
the connection (nothing reaches the listener behind it), by every sender: the shared opener,
a webhook's delivery, the OTLP sender; the webhook form and a system check say so at once."""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from django.core import checks
from django.test import Client
from opentelemetry.sdk.trace.export import SpanExportResult

from common import destinations, outbound
from tests.factories import make_user
from tests.webhooks import make_endpoint, queued
from tracing import forwarding, otlp
from tracing.apps import check_otlp_destination
from webhooks import delivery
from webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

# Every spelling the outside security suite tried, and more; each reaches this machine or its
# network.
SPELLINGS = [
    ("127.0.0.1", "loopback"),
    ("127.1", "loopback"),
    ("2130706433", "loopback"),
    ("0x7f000001", "loopback"),
    ("0177.0.0.1", "loopback"),
    ("[::1]", "loopback"),
    ("[::ffff:127.0.0.1]", "loopback"),
    ("localhost", "loopback"),
    ("0.0.0.0", "unspecified (this host)"),
    ("169.254.169.254", "link-local"),
    ("[fe80::1]", "link-local"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("[fd00::1]", "private"),
    ("100.64.0.1", "reserved"),
]


@pytest.fixture
def listener(server: Any) -> Any:
    """What an attacker would aim at: a service on this machine's loopback (`server`,
    tests/common/conftest.py)."""
    return server


@pytest.fixture
def nothing_allowed(settings: Any) -> None:
    settings.AGENTSITE_OUTBOUND_ALLOWED_HOSTS = []


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """A resolver's answers for names that are not this machine's: a public name may be made
    to resolve to any address by whoever holds its zone."""
    answers: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in answers:
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
                for address in answers[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


def _post(url: str) -> Any:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    return outbound.opener.open(request, timeout=5)


@pytest.mark.usefixtures("nothing_allowed")
@pytest.mark.parametrize(("host", "what"), SPELLINGS)
def test_every_spelling_of_a_private_address_is_refused_at_the_connection(
    listener: Any, host: str, what: str
) -> None:
    port = listener.server_address[1]
    with pytest.raises(urllib.error.URLError) as refused:
        _post(f"http://{host}:{port}/hook")
    reason = refused.value.reason
    assert isinstance(reason, destinations.DestinationRefused)
    assert f"a {what} address" in str(reason)
    assert "AGENTSITE_OUTBOUND_ALLOWED_HOSTS" in str(reason)
    assert listener.paths == []


@pytest.mark.usefixtures("nothing_allowed")
def test_a_public_name_that_resolves_to_a_private_address_is_refused(
    listener: Any, dns: dict[str, list[str]]
) -> None:
    port = listener.server_address[1]
    dns["hooks.example.com"] = ["127.0.0.1"]
    named = r"hooks\.example\.com resolves to 127\.0\.0\.1"
    with pytest.raises(urllib.error.URLError, match=named):
        _post(f"http://hooks.example.com:{port}/hook")
    # A public and a private address: refused whole (which one is used is not ours to pick).
    dns["mixed.example.com"] = ["93.184.216.34", "127.0.0.1"]
    with pytest.raises(urllib.error.URLError, match="a loopback address"):
        _post(f"http://mixed.example.com:{port}/hook")
    assert listener.paths == []


def test_a_public_address_is_allowed_and_the_setting_allows_named_hosts_and_networks(
    listener: Any, settings: Any, dns: dict[str, list[str]]
) -> None:
    public = ipaddress.ip_address("93.184.216.34")
    settings.AGENTSITE_OUTBOUND_ALLOWED_HOSTS = []
    assert destinations.refusal("example.com", public) is None
    assert destinations.refusal("[2606:4700::1]", ipaddress.ip_address("2606:4700::1")) is None

    port = listener.server_address[1]
    dns["collector.internal"] = ["127.0.0.1"]
    settings.AGENTSITE_OUTBOUND_ALLOWED_HOSTS = ["Collector.Internal"]  # by name, any case
    assert _post(f"http://collector.internal:{port}/by-name").status == 200
    with pytest.raises(urllib.error.URLError):
        _post(f"http://127.0.0.1:{port}/not-by-its-address")  # the name only, not the address
    settings.AGENTSITE_OUTBOUND_ALLOWED_HOSTS = ["127.0.0.0/8"]
    assert _post(f"http://127.0.0.1:{port}/by-network").status == 200
    assert listener.paths == ["/by-name", "/by-network"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nothing_allowed")
def test_a_webhook_to_a_private_address_is_not_sent_and_its_attempt_says_why(
    listener: Any,
) -> None:
    endpoint = make_endpoint(f"http://2130706433:{listener.server_address[1]}/hooks")
    queued([endpoint], 1)
    assert delivery.deliver_all_due() == 1
    row = WebhookDelivery.objects.get()
    # Failed at once: trying again would be refused again (admin replays it once allowed).
    assert row.status == DeliveryStatus.FAILED and row.attempts == 1
    assert row.last_response_code is None
    assert row.last_error.startswith("Not sent: 2130706433 resolves to 127.0.0.1, a loopback")
    assert "AGENTSITE_OUTBOUND_ALLOWED_HOSTS" in row.last_error
    assert listener.paths == []


@pytest.mark.usefixtures("nothing_allowed")
def test_the_otlp_sender_sends_no_span_to_a_private_address(
    listener: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://[::ffff:127.0.0.1]:{listener.server_address[1]}/v1/traces"
    started = time.monotonic()
    for protocol in ("http/protobuf", "http/json"):
        sender = forwarding.span_exporter(url, protocol=protocol)
        with caplog.at_level(logging.WARNING, logger="tracing.forwarding"):
            assert sender.export(otlp.readable_spans([])) is SpanExportResult.FAILURE
        assert sender.lost == 1
    assert "a loopback address" in caplog.text
    assert listener.paths == []
    assert time.monotonic() - started < 5  # refused at once: no retry for a refusal


@pytest.mark.usefixtures("nothing_allowed")
def test_a_system_check_warns_of_an_otlp_endpoint_at_a_private_address(settings: Any) -> None:
    settings.AGENTSITE_OTLP_ENDPOINT = "http://169.254.169.254/v1/traces"
    [warning] = check_otlp_destination()
    assert warning.level == checks.WARNING and warning.id == "tracing.W002"
    assert "169.254.169.254, a link-local address" in warning.msg
    settings.AGENTSITE_OUTBOUND_ALLOWED_HOSTS = ["169.254.169.254"]
    assert check_otlp_destination() == []
    settings.AGENTSITE_OTLP_ENDPOINT = "http://collector.example.com/v1/traces"  # no DNS asked
    settings.AGENTSITE_OUTBOUND_ALLOWED_HOSTS = []
    assert check_otlp_destination() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("nothing_allowed")
def test_the_webhook_form_refuses_a_private_address_at_once() -> None:
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    form = {"name": "metadata", "events": ["run.failed"], "enabled": "on"}
    answer = client.post(
        "/admin/webhooks/webhookendpoint/add/",
        {**form, "url": "http://169.254.169.254/latest/meta-data"},
    )
    assert answer.status_code == 200
    assert "169.254.169.254, a link-local address" in answer.content.decode()
    assert WebhookEndpoint.objects.count() == 0
