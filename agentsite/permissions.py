"""Who may do what, in one place for views, consumers and templates."""

from __future__ import annotations

from typing import Any

DECIDE_PERMISSION = "approvals.decide_approvalrequest"


def is_reviewer(user: Any) -> bool:
    """A reviewer may see the inbox and approve or reject tool calls."""
    return bool(user is not None and user.is_authenticated and user.has_perm(DECIDE_PERMISSION))
