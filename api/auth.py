"""Who calls the API: a bearer token (`Authorization: Bearer agt_…`), or the browser session
for same-site use. A token needs no CSRF token (a browser never sends it by itself); the
session does, for every unsafe method, as Django's forms do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security.base import AuthBase
from ninja.utils import check_csrf

from api.models import ApiToken, Scope

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class Unauthorized(HttpError):
    """401 with `WWW-Authenticate: Bearer`; the message never repeats what was sent."""

    def __init__(self, message: str, error: str = "invalid_token") -> None:
        super().__init__(401, message)
        self.error = error


class Forbidden(HttpError):
    def __init__(self, message: str, code: str = "forbidden") -> None:
        super().__init__(403, message)
        self.code = code


@dataclass(frozen=True)
class Caller:
    user: Any
    token: ApiToken | None  # None: the browser session

    def can(self, scope: str) -> bool:
        return self.token is None or scope in self.token.scopes


class BearerToken(AuthBase):
    """A ninja auth callable: the `Caller`, or an error (401; 403 for a failed CSRF check)."""

    # The document names the token; the session works too, for same-site pages.
    openapi_type = "http"
    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> Caller:
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthorized("The Authorization header must read 'Bearer <token>'.")
            found = ApiToken.objects.find(token.strip())
            if found is None:
                raise Unauthorized("The token is unknown, revoked or expired.")
            found.touch()
            return Caller(found.user, found)
        user = request.user
        if not user.is_authenticated or not user.is_active:
            raise Unauthorized(
                "Send an API token (Authorization: Bearer <token>) or log in.", "invalid_request"
            )
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise Forbidden("CSRF check failed: send the X-CSRFToken header.", "csrf_failed")
        return Caller(user, None)


def require_scope(caller: Caller, scope: str = Scope.DECIDE) -> None:
    if not caller.can(scope):
        raise Forbidden(f"This token may only read; this needs the {scope!r} scope.", "scope")
