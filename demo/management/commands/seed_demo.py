"""Create the demo users (and the demo's orders). Safe to run again and again: users that
exist already keep their passwords, so their sessions stay logged in."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db import transaction

# (username, demo password, role). The passwords are for a demo on a laptop: they are set and
# printed only when DEBUG is on.
DEMO_USERS = [
    ("alice", "alice-demo-pass", "end user"),
    ("rita", "rita-demo-pass", "reviewer"),
    ("admin", "admin-demo-pass", "superuser"),
]
REVIEWERS_GROUP = "Reviewers"
# Reviewer permissions, added as the apps that define them land.
REVIEWER_PERMISSIONS = [("approvals", "decide_approvalrequest"), ("tracing", "view_trace")]
# rita also writes the approval policies (the inbox's Policies tab): given to her alone, as a
# permission of its own, since not every reviewer should change what is decided unasked.
POLICY_MANAGERS = ["rita"]
MANAGE_POLICIES = ("approvals", "manage_approvalpolicy")


class Command(BaseCommand):
    help = "Create the demo users alice (end user), rita (reviewer) and admin, and demo data."

    def handle(self, *args: Any, **options: Any) -> None:
        from demo.seed import seed_orders, seed_policies, seed_prices

        with transaction.atomic():
            reviewers = self._reviewers_group()
            lines = [
                self._ensure_user(name, password, role, reviewers)
                for name, password, role in DEMO_USERS
            ]
            seed_orders()
            seed_policies()
            seed_prices()
        self.stdout.write(self.style.SUCCESS("Demo users ready:"))
        for line in lines:
            self.stdout.write(f"  {line}")

    def _reviewers_group(self) -> Group:
        group, _ = Group.objects.get_or_create(name=REVIEWERS_GROUP)
        for app_label, codename in REVIEWER_PERMISSIONS:
            permission = Permission.objects.filter(
                content_type__app_label=app_label, codename=codename
            ).first()
            if permission is not None:
                group.permissions.add(permission)
        return group

    def _ensure_user(self, username: str, password: str, role: str, reviewers: Group) -> str:
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=username, defaults={"email": f"{username}@example.com"}
        )
        if role == "superuser":
            user.is_staff = user.is_superuser = True
        if role == "reviewer":
            user.groups.add(reviewers)
        if username in POLICY_MANAGERS:
            app_label, codename = MANAGE_POLICIES
            permission = Permission.objects.filter(
                content_type__app_label=app_label, codename=codename
            ).first()
            if permission is not None:
                user.user_permissions.add(permission)
        # A password is set once, when the user is created (or has none usable yet: a demo
        # customer that the orders' seed made): setting it again would log out every session
        # of the user (and undo a password changed since).
        if not created and user.has_usable_password():
            shown = "password unchanged"
        elif settings.DEBUG:
            user.set_password(password)
            shown = f"password {password}"
        else:
            # Outside DEBUG nobody may log in with a published password.
            user.set_password(secrets.token_urlsafe(24))
            shown = "random password (set one with `manage.py changepassword`)"
        user.save()
        return f"{username:<6} {role:<10} {shown}"
