"""What a paused call would touch, for the reviewer who decides it.

A tool's author registers, for a tool name, a function from calls (each its arguments and the
user it would run for: the run's context user, `AgentRun.requested_by`) to a few (label,
value) facts per call, read from the database as the tool would read them:
`facts.register("cancel_order", order_facts)`, from the app's `AppConfig.ready()`. It gets a
page's calls at once, so that an inbox of a hundred requests reads the database a bounded
number of times. The inbox row and the request page show the facts beside the arguments; a
function that fails shows nothing and is logged: the inbox never breaks on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from approvals.models import ApprovalRequest

logger = logging.getLogger(__name__)

Facts = list[tuple[str, str]]
# (arguments, user) of each call -> its facts, in the same order.
FactsFunction = Callable[[Sequence[tuple[dict[str, Any], Any]]], Sequence[Facts]]

_registered: dict[str, FactsFunction] = {}
# Where `attach` leaves a request's facts for the template.
ATTRIBUTE = "_call_facts"


def register(tool_name: str, function: FactsFunction) -> None:
    """Show `function`'s facts on every request to call `tool_name`."""
    _registered[tool_name] = function


def unregister(tool_name: str) -> None:
    _registered.pop(tool_name, None)


def attach(requests: Iterable[ApprovalRequest]) -> None:
    """Read the facts of `requests` (one call per tool) and keep them on each request."""
    by_tool: dict[str, list[ApprovalRequest]] = {}
    for request in requests:
        by_tool.setdefault(request.tool_name, []).append(request)
        setattr(request, ATTRIBUTE, [])
    for tool_name, group in by_tool.items():
        function = _registered.get(tool_name)
        if function is None:
            continue
        calls = [
            (r.arguments if isinstance(r.arguments, dict) else {}, r.run.requested_by)
            for r in group
        ]
        try:
            found = [[(str(label), str(value)) for label, value in f] for f in function(calls)]
        except Exception:
            logger.exception("[non-fatal] The facts of %s requests could not be read.", tool_name)
            continue
        for request, request_facts in zip(group, found, strict=False):
            setattr(request, ATTRIBUTE, request_facts)


def for_request(request: ApprovalRequest) -> Facts:
    """The facts of `request`'s call, read now unless `attach` read them already."""
    if not hasattr(request, ATTRIBUTE):
        attach([request])
    return list(getattr(request, ATTRIBUTE))
