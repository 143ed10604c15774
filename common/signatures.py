"""Webhook signatures as Standard Webhooks specifies (https://www.standardwebhooks.com), so a
receiver checks a delivery with that project's library in its own language:

    webhook-id: <the event's id: the same on every retry and replay>
    webhook-timestamp: <the attempt's unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<raw body>">

keyed with the endpoint's secret (`webhooks.models.WebhookEndpoint`), `whsec_<base64 of
32 random bytes>`: the key is the bytes
the base64 stands for. While a rotation's overlap lasts, the signature header lists a
signature by the new secret and one by the previous, space-separated (as the specification
allows), so a receiver can move to the new secret without losing a delivery.

Secrets made before agentsite signed this way are `whsec_<URL-safe text>`, which is not
base64 ("older secrets", `is_standard`). Their key is the secret's text itself, and their
deliveries also carry the header those receivers check, `Agentsite-Signature:
t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">` (as Stripe writes it), until the
endpoint's secret is rotated (docs/webhooks.md: "Moving an older endpoint").

Protocol only: nothing of the site's rows; `webhooks/delivery.py` signs with it."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
LEGACY_SIGNATURE_HEADER = "Agentsite-Signature"  # older secrets only
PREFIX = "whsec_"
KEY_BYTES = 32
# The key lengths the specification allows a secret (24 to 64 bytes).
KEY_RANGE = range(24, 65)


def new_secret() -> str:
    """A signing secret, made by the site (never chosen by a person)."""
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def standard_key(secret: str) -> bytes | None:
    """The key a Standard Webhooks library reads from `secret`; None for an older secret
    (not base64 of an allowed length after the prefix)."""
    if not secret.startswith(PREFIX):
        return None
    try:
        key = base64.b64decode(secret[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(key) in KEY_RANGE else None


def is_standard(secret: str) -> bool:
    return standard_key(secret) is not None


def key(secret: str) -> bytes:
    """What signs with `secret`: its base64's bytes, or an older secret's own text."""
    found = standard_key(secret)
    return secret.encode() if found is None else found


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature of the message (`body` exactly as it is sent)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def legacy_header(secret: str, body: bytes, timestamp: int) -> str:
    """The Agentsite-Signature header of an older secret."""
    signed = f"{timestamp}.".encode() + body
    return f"t={timestamp},v1={hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()}"


def headers(
    signing_secrets: Sequence[str], message_id: str, body: bytes, timestamp: int | None = None
) -> dict[str, str]:
    """The signature headers of one attempt: signed with each of `signing_secrets` (the
    current first, then a rotation's previous), now unless `timestamp` is given."""
    if not signing_secrets:
        raise ValueError("A delivery is signed with at least one secret.")
    at = int(time.time()) if timestamp is None else timestamp
    signed = {
        ID_HEADER: message_id,
        TIMESTAMP_HEADER: str(at),
        SIGNATURE_HEADER: " ".join(
            signature(secret, message_id, at, body) for secret in signing_secrets
        ),
    }
    older = [secret for secret in signing_secrets if not is_standard(secret)]
    if older:
        # At most one: the site makes no older secrets, so only a rotation's previous is one.
        signed[LEGACY_SIGNATURE_HEADER] = legacy_header(older[0], body, at)
    return signed
