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


def read_permissions(users: list[User]) -> None:
    """Read the permissions of many users at once, in two queries, where `user.has_perm`
    reads them per user (two queries each, kept on the user object by Django's
    `ModelBackend`): its caches are filled with the same sets it would read. A superuser,
    an inactive user, or one read already is left to it. With a `ModelBackend` that keeps
    them under other names, nothing is used and it reads them as before."""
    from django.contrib.auth.models import Permission

    pending = {
        user.pk: user
        for user in users
        if user.is_active
        and not user.is_superuser
        and not hasattr(user, "_user_perm_cache")
        and not hasattr(user, "_group_perm_cache")
    }
    if not pending:
        return

    def by_user(user_field: str) -> dict[int, set[str]]:
        """Each pending user's permissions reached through `user_field` ("user": her own;
        "group__user": her groups'), named as `has_perm` names them."""
        found: dict[int, set[str]] = {pk: set() for pk in pending}
        reached = Permission.objects.filter(**{f"{user_field}__in": list(pending)})
        for user_id, app, codename in reached.values_list(
            user_field, "content_type__app_label", "codename"
        ):
            found[user_id].add(f"{app}.{codename}")
        return found

    own, grouped = by_user("user"), by_user("group__user")
    for pk, user in pending.items():
        # ModelBackend._get_permissions' own names for what it read.
        setattr(user, "_user_perm_cache", own[pk])  # noqa: B010
        setattr(user, "_group_perm_cache", grouped[pk])  # noqa: B010


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
