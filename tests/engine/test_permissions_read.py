"""Permissions read for many users at once (`engine.permissions.read_permissions`): the same
answers as `user.has_perm` reading them one user at a time, in two queries for all."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from engine.permissions import DECIDE_PERMISSION, read_permissions
from tests.factories import make_user

pytestmark = pytest.mark.django_db

PERMISSIONS = [DECIDE_PERMISSION, "approvals.manage_approvalpolicy", "tracing.view_trace"]


def permission(name: str) -> Permission:
    app, codename = name.split(".")
    return Permission.objects.get(content_type__app_label=app, codename=codename)


def people() -> list[Any]:
    direct = make_user(username="direct")
    direct.user_permissions.add(permission(DECIDE_PERMISSION))
    grouped = make_user(username="grouped")
    reviewers = Group.objects.create(name="reviewers")
    reviewers.permissions.add(permission(DECIDE_PERMISSION), permission("tracing.view_trace"))
    grouped.groups.add(reviewers)
    both = make_user(username="both")
    both.groups.add(reviewers)
    both.user_permissions.add(permission("approvals.manage_approvalpolicy"))
    inactive = make_user(username="inactive")
    inactive.groups.add(reviewers)
    get_user_model().objects.filter(pk=inactive.pk).update(is_active=False)
    superuser = make_user(username="root")
    get_user_model().objects.filter(pk=superuser.pk).update(is_superuser=True)
    make_user(username="nobody")
    return list(get_user_model().objects.order_by("pk"))


def answers(users: list[Any]) -> list[list[bool]]:
    return [[user.has_perm(name) for name in PERMISSIONS] for user in users]


def test_many_users_read_together_answer_as_each_alone() -> None:
    people()
    alone = answers(list(get_user_model().objects.order_by("pk")))
    together = list(get_user_model().objects.order_by("pk"))

    with CaptureQueriesContext(connection) as read:
        read_permissions(together)
    assert len(read.captured_queries) == 2

    with CaptureQueriesContext(connection) as asked:
        assert answers(together) == alone
    # Only the superuser's come from Django's own read (it reads every permission for her).
    assert len(asked.captured_queries) <= 2
    assert alone[0] == [True, False, False]  # direct
    assert alone[1] == [True, False, True]  # grouped
    assert alone[2] == [True, True, True]  # both
    assert alone[3] == [False, False, False]  # inactive
    assert alone[4] == [True, True, True]  # superuser
    assert alone[5] == [False, False, False]  # nobody


def test_django_keeps_its_permissions_where_they_are_filled() -> None:
    """If Django's ModelBackend kept its read elsewhere, the fill would be ignored (no harm,
    but no gain): this says so."""
    user = make_user(username="direct")
    user.user_permissions.add(permission(DECIDE_PERMISSION))
    user = get_user_model().objects.get(pk=user.pk)
    read_permissions([user])
    with CaptureQueriesContext(connection) as asked:
        assert user.has_perm(DECIDE_PERMISSION)
    assert asked.captured_queries == []
