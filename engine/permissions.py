"""Who may do what, in one place for views, consumers and templates."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeGuard

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser

    # The configured user model (AUTH_USER_MODEL), for type checking only: django-stubs
    # spells it `_User`, an AbstractBaseUser that its mypy plugin resolves to the model
    # `request.user` holds.
    from django.contrib.auth.models import _User as User

View = Callable[..., HttpResponse]

DECIDE_PERMISSION = "approvals.decide_approvalrequest"


def is_reviewer(user: User | AnonymousUser | None) -> TypeGuard[User]:
    """A reviewer may see the inbox and approve or reject tool calls."""
    return bool(user is not None and user.is_authenticated and user.has_perm(DECIDE_PERMISSION))


MANAGE_POLICIES_PERMISSION = "approvals.manage_approvalpolicy"


def can_manage_policies(user: User | AnonymousUser | None) -> bool:
    """An active reviewer who may also write the approval policies (`engine.policies`): the
    rules that decide calls without a person."""
    return bool(is_reviewer(user) and user.is_active and user.has_perm(MANAGE_POLICIES_PERMISSION))


VIEW_TRACES_PERMISSION = "tracing.view_trace"


def can_view_traces(user: User | AnonymousUser | None) -> bool:
    """Staff, and users given the permission to view traces."""
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and (user.is_staff or user.has_perm(VIEW_TRACES_PERMISSION))
    )


def allowed_only(
    allowed: Callable[[User | AnonymousUser], bool], refusal: str
) -> Callable[[View], View]:
    """A view decorator: 403 with `refusal` for a signed-in user whom `allowed` refuses
    (stack it under `login_required`, which sends visitors to the login page)."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not allowed(request.user):
                raise PermissionDenied(refusal)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate
