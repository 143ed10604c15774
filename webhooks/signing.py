"""The Agentsite-Signature header, as Stripe signs its webhooks: `t=<unix seconds>,v1=<hex
HMAC-SHA256 of "<t>.<raw body>" with the endpoint's secret>`. A receiver checks it with
`verify` (or the same few lines: docs/webhooks.md)."""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Agentsite-Signature"
EVENT_HEADER = "Agentsite-Event"
DELIVERY_HEADER = "Agentsite-Delivery"
# How old a signed timestamp a receiver should accept, in seconds (replayed requests).
TOLERANCE = 300


def signature(secret: str, body: bytes, timestamp: int) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    at = int(time.time()) if timestamp is None else timestamp
    return f"t={at},v1={signature(secret, body, at)}"


def verify(
    secret: str, body: bytes, value: str, *, tolerance: int = TOLERANCE, now: float | None = None
) -> bool:
    """Whether `value` (an Agentsite-Signature header) signs `body` with `secret`, at most
    `tolerance` seconds ago."""
    parts = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance:
        return False
    return hmac.compare_digest(parts.get("v1", ""), signature(secret, body, timestamp))
