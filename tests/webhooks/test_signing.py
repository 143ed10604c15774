"""The Agentsite-Signature header (`webhooks/signing.py`): a receiver's check refuses another
body, another secret or an old timestamp."""

from __future__ import annotations

from tests.webhooks import verified
from webhooks import signing


def test_the_signature_refuses_another_body_secret_or_an_old_timestamp() -> None:
    body = b'{"id":"evt_1"}'
    value = signing.header("whsec_s", body, timestamp=1_000_000)
    assert value.startswith("t=1000000,v1=")
    assert signing.verify("whsec_s", body, value, now=1_000_100)
    assert not signing.verify("whsec_s", body + b" ", value, now=1_000_100)
    assert not signing.verify("whsec_t", body, value, now=1_000_100)
    assert not signing.verify("whsec_s", body, value, now=1_000_000 + 301)
    assert not signing.verify("whsec_s", body, "v1=abc", now=1_000_000)
    assert verified("whsec_s", body, signing.header("whsec_s", body))
