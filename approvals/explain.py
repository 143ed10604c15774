"""Each request explains itself: what reviewers read beside a call, in the inbox row, on the
request page and in the history.

From the tool (`registry.tool_sheet`): its description, the risk its author declared, its
arguments labelled from its JSON schema (each property's title, its description as a hint,
in the schema's order, not the stored one), text as text with its line breaks, and money as
money (the arguments its author declared as money, `review(money=[...])`). From the tool's
facts hook (`engine.facts`): what the call would touch, with its warnings. Everything here is
text for templates, which escape it.

By kind (`ApprovalRequest.kind`): a shell call's commands and a patch's diff are read by
`kinds.py`; an MCP server's tool is not one of the agent's own tools, so nothing is looked up
for it by name (a function tool of the same name would lend it its description, its risk and
its schema): a local server's tool is explained by what the server listed when the run
paused (its description, its input schema's labelled arguments), which the request keeps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from approvals import kinds
from approvals.models import MCP_KINDS, ApprovalRequest, ToolKind
from common.formatting import money
from engine import facts, policies, registry, runs
from engine.facts import Fact

ATTRIBUTE = "_explanation"
# A text longer than this, or with a line break, is shown as a block of its own.
LONG_TEXT = 80


@dataclass(frozen=True)
class Argument:
    name: str
    label: str
    hint: str
    value: str
    # "text", "long" (a block, line breaks kept), "money", "number", "empty", "json"
    kind: str


@dataclass(frozen=True)
class Explanation:
    description: str
    risk: str
    risk_declared: bool
    intact: bool
    arguments: list[Argument]
    # What the call would touch; None: its facts hook failed ("facts unavailable").
    facts: list[Fact] | None = field(default_factory=list)
    # Whether a reviewer may edit its arguments before approving (`registry.review(editable=)`).
    editable: bool = False
    # What the approval policies said when the run paused (None: nothing worth saying, no
    # rules), and, for a call that still waits, what they would say now when that differs.
    policy: policies.Verdict | None = None
    policy_now: policies.Verdict | None = None
    # What kind of tool it is for (`ToolKind`), and for a shell call or a patch, the call read
    # for people (None: not that kind, or arguments of another shape, shown as arguments).
    kind: str = ToolKind.FUNCTION
    shell: kinds.ShellView | None = None
    patch: kinds.PatchView | None = None
    # Whether a reviewer may answer it as the tool (not a hosted MCP server's call).
    answerable: bool = True

    @property
    def facts_unavailable(self) -> bool:
        return self.facts is None

    @property
    def warnings(self) -> list[Fact]:
        return [fact for fact in self.facts or [] if fact.warning]


def description_text(description: str) -> str:
    """A tool's description as prose: a docstring's line wrapping undone, its paragraphs kept
    (separated by a blank line)."""
    paragraphs = re.split(r"\n\s*\n", description.strip())
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def _words(name: str) -> str:
    """An argument's name in words: "order_id" and "orderId" (MCP tools often have such
    names) both read "order id"."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).replace("_", " ").lower()


def _argument(name: str, schema: dict[str, Any], value: Any, review: registry.Review) -> Argument:
    label = str(schema.get("title") or _words(name).capitalize())
    hint = str(schema.get("description") or "")
    if name in review.money:
        shown = money(value, review.currency)
        if shown is not None:
            return Argument(name, label, hint, shown, "money")
    if value is None:
        return Argument(name, label, hint, "—", "empty")
    if isinstance(value, bool):
        return Argument(name, label, hint, "yes" if value else "no", "text")
    if isinstance(value, int | float):
        return Argument(name, label, hint, str(value), "number")
    if isinstance(value, str):
        long = "\n" in value or len(value) > LONG_TEXT
        return Argument(name, label, hint, value, "long" if long else "text")
    return Argument(name, label, hint, json.dumps(value, ensure_ascii=False), "json")


def arguments_for(arguments: Any, sheet: registry.ToolSheet) -> list[Argument]:
    """The call's arguments for people: the schema's properties in its order, then any the
    schema does not know (in the order the model sent them)."""
    if not isinstance(arguments, dict):
        return [Argument("", "Arguments", "", json.dumps(arguments, ensure_ascii=False), "json")]
    shown = [
        _argument(name, schema, arguments[name], sheet.review)
        for name, schema in sheet.properties
        if name in arguments
    ]
    known = {name for name, _ in sheet.properties}
    shown += [
        _argument(str(name), {}, value, sheet.review)
        for name, value in arguments.items()
        if name not in known
    ]
    return shown


def ran_with(request: ApprovalRequest, arguments: Any) -> list[Argument]:
    """The arguments a reviewer's edit ran the call with, labelled as the model's are."""
    return arguments_for(arguments, registry.request_sheet(request.run.agent_name, request))


def attach(requests: Iterable[ApprovalRequest], *, with_facts: bool = True) -> None:
    """Explain each of `requests` and keep it on the request (`for_request` reads it): one
    tool lookup per tool, and one facts call per facts hook for them all."""
    requests = list(requests)
    if with_facts:
        facts.attach(requests)
    sheets: dict[tuple[str | None, str, str, str], registry.ToolSheet] = {}
    judged = _policy_lines(requests)
    for request in requests:
        run = request.run if "run" in request._state.fields_cache else None
        # An MCP server's tool has no sheet of the agent's (`registry.find_tool`): a local
        # server's is what the server listed when the run paused, kept on the request.
        key = (run.agent_name if run else None, request.agent_name, request.tool_name, request.kind)
        sheet = (
            registry.request_sheet(key[0], request)
            if request.kind in MCP_KINDS
            else sheets.get(key) or sheets.setdefault(key, registry.tool_sheet(*key))
        )
        intact = request.arguments_intact
        shell = (
            kinds.shell_view(request.arguments)
            if intact and request.kind == ToolKind.SHELL
            else None
        )
        patch = (
            kinds.patch_view(request.arguments)
            if intact and request.kind == ToolKind.APPLY_PATCH
            else None
        )
        setattr(
            request,
            ATTRIBUTE,
            Explanation(
                description=description_text(sheet.description),
                risk=str(sheet.review.risk),
                risk_declared=sheet.review.declared,
                intact=intact,
                arguments=arguments_for(request.arguments, sheet) if intact else [],
                facts=facts.for_request(request) if with_facts else [],
                editable=not runs.edit_refusal(request, sheet),
                policy=judged.get(request.pk, (None, None))[0],
                policy_now=judged.get(request.pk, (None, None))[1],
                kind=request.kind,
                shell=shell,
                patch=patch,
                answerable=request.can_be_answered,
            ),
        )


def _policy_lines(
    requests: list[ApprovalRequest],
) -> dict[int, tuple[policies.Verdict | None, policies.Verdict | None]]:
    """For each request: its verdict at the pause, and for a pending one the verdict of the
    rules as they are now when it differs (rules apply when a run pauses, so a rule added
    since would decide the next such call, not this one). The rules are read once."""
    pending = [request for request in requests if request.is_pending]
    try:
        rules = policies.load_rules() if pending else []
        users = (
            policies.users_facts([request.run.requested_by_id for request in pending])
            if rules
            else {}
        )
    except Exception:  # the page shows the stored verdicts without what the rules say now
        rules, users = [], {}
    lines: dict[int, tuple[policies.Verdict | None, policies.Verdict | None]] = {}
    for request in requests:
        then = policies.Verdict.from_json(request.verdict)
        now = None
        if request.is_pending and rules and request.arguments_intact:
            call = policies.call_for(
                request.agent_name,
                request.tool_name,
                request.arguments,
                request.run.agent_name,
                request.kind,
                request.server,
            )
            now = policies.evaluate(
                rules,
                call,
                users.get(request.run.requested_by_id, policies.User()),
                # What the reviewer reads of it (read with the page's, or now when needed).
                facts=_facts_of(request),
            )
            if then is not None and (now.policy_id, now.action) == (then.policy_id, then.action):
                now = None
        if then is not None and not (then.policy_name or then.failed or rules):
            then = None  # no rule then, none now: nothing to say
        lines[request.pk] = (then, now)
    return lines


def _facts_of(request: ApprovalRequest) -> policies.FactsReader:
    def read(call: policies.Call) -> facts.Facts:
        return facts.for_request(request)

    return read


def for_request(request: ApprovalRequest) -> Explanation:
    """`request` explained, now unless `attach` did already."""
    if not hasattr(request, ATTRIBUTE):
        attach([request])
    explanation: Explanation = getattr(request, ATTRIBUTE)
    return explanation
