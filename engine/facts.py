"""What a paused call would touch, for the reviewer who decides it.

A tool's author registers a function from the call's arguments and the user it would run for
(the run's context user, `AgentRun.requested_by`) to a few (label, value) facts, read from the
database as the tool would read them: `facts.register("cancel_order", order_facts)`, from the
app's `AppConfig.ready()`. The inbox row and the request page show them beside the arguments.
A function that fails shows nothing and is logged: the inbox never breaks on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from approvals.models import ApprovalRequest

logger = logging.getLogger(__name__)

Facts = list[tuple[str, str]]
FactsFunction = Callable[[dict[str, Any], Any], Facts]

_registered: dict[str, FactsFunction] = {}


def register(tool_name: str, function: FactsFunction) -> None:
    """Show `function(arguments, user)`'s facts on every request to call `tool_name`."""
    _registered[tool_name] = function


def unregister(tool_name: str) -> None:
    _registered.pop(tool_name, None)


def for_request(request: ApprovalRequest) -> Facts:
    """The facts registered for `request`'s tool, for the user its run acts for; [] for none."""
    function = _registered.get(request.tool_name)
    if function is None:
        return []
    arguments = request.arguments if isinstance(request.arguments, dict) else {}
    try:
        return [
            (str(label), str(value))
            for label, value in function(arguments, request.run.requested_by)
        ]
    except Exception:
        logger.exception("[non-fatal] The facts of request %s could not be read.", request.pk)
        return []
