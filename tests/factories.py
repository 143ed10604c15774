"""Small factories for test data: `make_*(**kwargs)` with sensible defaults."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from conversations.models import Conversation

_counter = {"n": 0}


def _next() -> int:
    _counter["n"] += 1
    return _counter["n"]


def make_user(**kwargs: Any) -> Any:
    kwargs.setdefault("username", f"user{_next()}")
    password = kwargs.pop("password", "pass-for-tests")
    user = get_user_model().objects.create_user(**kwargs)
    user.set_password(password)
    user.save()
    return user


def make_conversation(**kwargs: Any) -> Conversation:
    kwargs.setdefault("session_id", f"conv_test_{_next()}")
    kwargs.setdefault("agent_name", "support")
    return Conversation.objects.create(**kwargs)


def make_reviewer(username: str = "rita", password: str = "pass-for-tests") -> Any:
    """A user who may decide tool calls (the permission `is_reviewer` checks); an existing
    user of that name is made a reviewer instead."""
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.filter(username=username).first() or make_user(
        username=username, password=password
    )
    user.user_permissions.add(
        Permission.objects.get(
            codename="decide_approvalrequest", content_type__app_label="approvals"
        )
    )
    return type(user).objects.get(pk=user.pk)  # drop the permission cache


def start_run(text: str, agent_name: str = "support") -> Any:
    """A run of `agent_name` on `text`, queued by a new user in a new conversation."""
    from approvals.models import AgentRun
    from engine import runs

    alice = make_user(username=f"alice{AgentRun.objects.count()}")
    conversation = make_conversation(owner=alice, agent_name=agent_name)
    return runs.start_run(conversation, text, alice)
