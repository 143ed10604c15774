"""Who may do what, in one place for views, consumers and templates."""

from __future__ import annotations

from typing import Any

DECIDE_PERMISSION = "approvals.decide_approvalrequest"


def is_reviewer(user: Any) -> bool:
    """A reviewer may see the inbox and approve or reject tool calls."""
    return bool(user is not None and user.is_authenticated and user.has_perm(DECIDE_PERMISSION))


VIEW_TRACES_PERMISSION = "tracing.view_trace"


def can_view_traces(user: Any) -> bool:
    """Staff, and users given the permission to view traces."""
    return bool(
        user is not None
        and user.is_authenticated
        and user.is_active
        and (user.is_staff or user.has_perm(VIEW_TRACES_PERMISSION))
    )
