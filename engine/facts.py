"""What a paused call would touch, for the reviewer who decides it.

A tool's author gives a tool a facts hook: a function from calls (each its arguments and the
user it would run for: the run's context user, `AgentRun.requested_by`) to a few facts per
call, read from the database as the tool would read them. Each fact is a (label, value) pair,
or (label, value, True) for a warning ("Order 7: already delivered"). The hook is declared
beside the tool (`registry.review(tool, facts=hook)`), or registered for a tool name from an
`AppConfig.ready()` (`facts.register("cancel_order", hook)`, for tools one cannot declare).
It gets a page's calls at once, so that an inbox of a hundred requests reads the database a
bounded number of times.

A hook that raises, or takes longer than `TIMEOUT_SECONDS`, never breaks the inbox: its calls
show "facts unavailable", and the failure is logged. So a hook runs in a thread of its own
(with its own database connection, closed after it), which the page waits for that long.

An approval policy that approves only when the facts show no warnings (`engine.policies`)
reads a paused call's facts the same way (`read`): the same hook, arguments, user and time
limit, so it sees what the reviewer would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connections

from engine import registry
from engine.registry import FactsHook

if TYPE_CHECKING:
    from approvals.models import ApprovalRequest

logger = logging.getLogger(__name__)

# How long a page waits for one hook's facts of its calls.
TIMEOUT_SECONDS = 2.0


class Fact(NamedTuple):
    label: str
    value: str
    warning: bool = False


# A call's facts; None when its hook failed or was too slow ("facts unavailable").
Facts = list[Fact] | None
FactsFunction = FactsHook  # the name this module gave hooks before `registry.review`

_registered: dict[str, FactsHook] = {}
# Where `attach` leaves a request's facts for the template.
ATTRIBUTE = "_call_facts"


def register(tool_name: str, function: FactsHook) -> None:
    """Show `function`'s facts on every request to call `tool_name` whose tool declares no
    hook of its own."""
    _registered[tool_name] = function


def unregister(tool_name: str) -> None:
    _registered.pop(tool_name, None)


def hook_for(request: ApprovalRequest) -> FactsHook | None:
    """The facts hook of `request`'s tool: the one its author declared, else one registered
    for its name."""
    run = request.run if "run" in request._state.fields_cache else None
    # An MCP server's tool gets the hook declared for it (`review(server, tool_name=...)`), never
    # one of an agent's tool of the same name.
    sheet = registry.request_sheet(run.agent_name if run else None, request)
    return hook_of(sheet.review, request.tool_name)


def hook_of(review: registry.Review, tool_name: str) -> FactsHook | None:
    """The facts hook of a tool its author declared `review` for: its own, else one
    registered for its name."""
    return review.facts or _registered.get(tool_name)


def _fact(item: Any) -> Fact:
    if isinstance(item, Fact):
        return item
    label, value, *rest = item
    return Fact(str(label), str(value), bool(rest and rest[0]))


def _within_time(
    hook: FactsHook, calls: Sequence[tuple[dict[str, Any], Any]], what: str
) -> Sequence[Sequence[Any]] | None:
    """`hook(calls)`, or None (logged) when it raises or does not answer in time."""
    answer: list[Sequence[Sequence[Any]]] = []

    def work() -> None:
        try:
            answer.append(hook(calls))
        except Exception:
            logger.exception("[non-fatal] The facts of %s requests could not be read.", what)
        finally:
            connections.close_all()

    thread = threading.Thread(target=work, name=f"facts-{what}", daemon=True)
    thread.start()
    thread.join(TIMEOUT_SECONDS)
    if thread.is_alive():
        logger.error(
            "[non-fatal] The facts of %s requests took longer than %.1f s; shown as unavailable.",
            what,
            TIMEOUT_SECONDS,
        )
        return None
    return answer[0] if answer else None


def read(hook: FactsHook, calls: Sequence[tuple[Any, Any]], what: str) -> list[Facts]:
    """The facts `hook` gives of each of `calls` ((arguments, user) pairs; arguments that are
    not an object are read as none), in one call within `TIMEOUT_SECONDS`; None for each when
    it fails, is too slow or answers malformed (logged). `what`: the tools, for the log."""
    given = [(arguments if isinstance(arguments, dict) else {}, user) for arguments, user in calls]
    found = _within_time(hook, given, what)
    try:
        facts = [[_fact(item) for item in f] for f in found] if found is not None else None
        if facts is not None and len(facts) != len(given):
            raise ValueError(f"{len(facts)} lists of facts for {len(given)} calls")
    except Exception:
        logger.exception("[non-fatal] The facts of %s requests are malformed.", what)
        facts = None
    return list(facts) if facts is not None else [None] * len(given)


def attach(requests: Iterable[ApprovalRequest]) -> None:
    """Read the facts of `requests` (one call per hook) and keep them on each request."""
    by_hook: dict[int, tuple[FactsHook, list[ApprovalRequest]]] = {}
    for request in requests:
        setattr(request, ATTRIBUTE, [])
        if not request.arguments_intact:
            continue  # what a tampered call would touch is not what the model asked for
        hook = hook_for(request)
        if hook is not None:
            by_hook.setdefault(id(hook), (hook, []))[1].append(request)
    for hook, group in by_hook.values():
        calls = [(r.arguments, r.run.requested_by) for r in group]
        what = ", ".join(sorted({r.tool_name for r in group}))
        for request, facts in zip(group, read(hook, calls, what), strict=True):
            setattr(request, ATTRIBUTE, facts)


def for_request(request: ApprovalRequest) -> Facts:
    """The facts of `request`'s call, read now unless `attach` read them already."""
    if not hasattr(request, ATTRIBUTE):
        attach([request])
    found = getattr(request, ATTRIBUTE)
    return None if found is None else list(found)
