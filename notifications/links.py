"""The link each email carries to its request: signed (the site's SECRET_KEY, a salt of its
own), bound to the request and to the person it was sent to, and expiring. It only opens the
request's page: a GET never decides anything (a mail scanner follows links), the reviewer
decides there with the page's POST, after logging in.

The token travels in the query string (`/notifications/open/?t=…`), which the site's access
log never writes (`agentsite/serve.py`), and the landing page redirects at once to the
request's own address, so it is not kept in the browser's address bar either."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.conf import settings
from django.core import signing
from django.urls import reverse

SALT = "agentsite.notifications.review-link"


@dataclass(frozen=True)
class Link:
    request_id: int
    user_id: int


class LinkRefused(Exception):
    """Why a link cannot be followed; `status` is the page's HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def token(request_id: int, user_id: int) -> str:
    return signing.TimestampSigner(salt=SALT).sign_object(
        {"r": request_id, "u": user_id}, compress=True
    )


def url(request_id: int, user_id: int) -> str:
    """The absolute link for the email (AGENTSITE_EMAIL_SITE_URL)."""
    path = reverse("notification_open") + "?" + urlencode({"t": token(request_id, user_id)})
    return f"{settings.AGENTSITE_EMAIL_SITE_URL.rstrip('/')}{path}"


def read(value: str) -> Link:
    """The link `value` stands for, or LinkRefused: 410 when it is older than
    AGENTSITE_EMAIL_LINK_SECONDS, 400 when it was not made here (changed, cut, made up)."""
    try:
        data = signing.TimestampSigner(salt=SALT).unsign_object(
            value, max_age=settings.AGENTSITE_EMAIL_LINK_SECONDS
        )
    except signing.SignatureExpired:
        raise LinkRefused(
            410, "This link has expired. Open the inbox to find the request."
        ) from None
    except (signing.BadSignature, ValueError, TypeError):
        raise LinkRefused(
            400, "This link is not valid: it may have been cut or changed in the email."
        ) from None
    if not (
        isinstance(data, dict) and isinstance(data.get("r"), int) and isinstance(data.get("u"), int)
    ):
        raise LinkRefused(400, "This link is not valid.")
    return Link(request_id=data["r"], user_id=data["u"])
