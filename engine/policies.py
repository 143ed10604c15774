"""Approval policies: rules kept in the database that decide a paused call without a person.

When a run pauses, `verdicts` reads the enabled rules once, in order of precedence
(`ApprovalPolicy.priority`, then age), and gives each call the verdict of the first rule that
matches it: approve, reject, or ask a person (which ends the search: the rules below it do
not apply). A call no rule matches waits for a person, as before there were rules.

A call of a tool that needs no approval of its own (its `needs_approval` is False, or its
callable said no) is still stopped by a rule that asks for a person or rejects it: before
each run, every function tool of its agents that such a rule is about gets a gate (`guard`)
that asks the tool's own setting first and then the rules (as the process read them at most
`RULES_CACHE_SECONDS` ago; at once after a change in the same process). When the first
rule that matches says ask or reject, the call pauses, and the pause takes that verdict
(`gated_verdict`). A gate cannot tell which of several agents sharing one tool object made
the call: a rule naming an agent counts for all the agents that hold the tool (so it may ask
a person once too often, never once too few).

It fails closed. A rule that cannot be evaluated for a call (a condition comparing a number
with a word, text with "at most", an argument the call does not have with "starts with"; or
any error) stops the search there: the call waits for a person, and the request says which
rule failed and why. So does every call of the pause when the rules cannot be read at all.
And no rule approves a call of a tool whose author requires a person
(`registry.review(..., auto_approve=False)`); it may still reject it.

An approving rule may require that the call's facts show no warnings
(`ApprovalPolicy.requires_no_warnings`, the default for a new rule): the facts are those the
reviewer would read (`engine.facts`: the tool's hook, given the call's arguments and the
user the run acts for), read only once such a rule matches. A warning sends the call to a
person, with the warnings as the reason; facts that cannot be read (the hook fails, or is
slower than `facts.TIMEOUT_SECONDS`) fail closed as above. A tool with no facts hook has no
warnings.

The verdict is written on the request when the run pauses, and a deciding verdict is
recorded as a decision by "policy <name>" in the same audit and trace as a person's
(`engine.runs`): what a rule decided stays decided, whatever later happens to the rules.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from agents import Agent, FunctionTool
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save

from agentsite.db.hops import db_hop
from agentsite.db.sql import columns
from approvals.models import (
    MCP_KINDS,
    ApprovalPolicy,
    ConditionOperator,
    ConditionSource,
    PolicyAction,
    PolicyCondition,
    ToolKind,
)
from engine import context as run_context
from engine import registry
from engine.facts import Facts, hook_of
from engine.facts import read as read_facts

logger = logging.getLogger(__name__)


class PolicyError(Exception):
    """A condition that cannot be evaluated for a call; its message says why, for people."""


@dataclass(frozen=True)
class Call:
    """What the rules read of one paused call."""

    agent_name: str
    tool_name: str
    arguments: Any
    # Whether a rule may approve it (the tool's author may require a person).
    auto_approve: bool = True
    # All its author declared (`registry.review`): the pause reads its expiry policy there.
    review: registry.Review = field(default_factory=registry.Review, compare=False)


@dataclass(frozen=True)
class User:
    """What the rules read of the person the run acts for."""

    email: str = ""
    username: str = ""


@dataclass(frozen=True)
class Verdict:
    """What the rules say of one call: `action` is approve, reject or ask (a person decides);
    `policy_id` / `policy_name` the rule that said it (none: no rule applies); `reason` why,
    for people; `failed` when a rule could not be evaluated (so a person decides)."""

    action: str
    reason: str
    policy_id: int | None = None
    policy_name: str = ""
    message: str = ""
    failed: bool = False
    # The rule's expiry policy for a call it sends to a person (`ApprovalPolicy.on_expiry`,
    # empty: the tool's) and the group it escalates to.
    on_expiry: str = ""
    escalate_to: str = ""

    @property
    def decides(self) -> bool:
        return self.action in (PolicyAction.APPROVE, PolicyAction.REJECT)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Verdict | None:
        """The verdict stored on a request; None for a request paused before policies."""
        if not isinstance(data, dict) or data.get("action") not in PolicyAction.values:
            return None
        return cls(
            action=str(data["action"]),
            reason=str(data.get("reason") or ""),
            policy_id=data.get("policy_id") if isinstance(data.get("policy_id"), int) else None,
            policy_name=str(data.get("policy_name") or ""),
            message=str(data.get("message") or ""),
            failed=bool(data.get("failed")),
            on_expiry=str(data.get("on_expiry") or ""),
            escalate_to=str(data.get("escalate_to") or ""),
        )

    def sentence(self) -> str:
        """The verdict for a reviewer: "Policy “small refunds” approves: amount 15 is at most
        20." """
        if self.policy_name and self.failed:
            return (
                f"Policy “{self.policy_name}” could not be evaluated ({self.reason}), "
                "so a person decides."
            )
        if not self.policy_name:
            return f"{self.reason}." if self.reason else "No policy applies: a person decides."
        verb = {
            PolicyAction.APPROVE: "approves",
            PolicyAction.REJECT: "rejects",
            PolicyAction.ASK: "asks a person",
        }[PolicyAction(self.action)]
        return f"Policy “{self.policy_name}” {verb}: {self.reason}."


NO_RULE = "No policy applies: a person decides"


@dataclass(frozen=True)
class Rule:
    """An enabled policy as it was read, with its conditions."""

    id: int
    name: str
    agent_name: str
    tool_name: str
    action: str
    message: str
    conditions: tuple[PolicyCondition, ...]
    on_expiry: str = ""
    escalate_to: str = ""
    requires_no_warnings: bool = False

    def scope(self) -> str:
        tool = self.tool_name or "any tool"
        return f"{tool} of {self.agent_name}" if self.agent_name else tool

    def applies_to(self, call: Call) -> bool:
        return (not self.agent_name or self.agent_name == call.agent_name) and (
            not self.tool_name or self.tool_name == call.tool_name
        )


def load_rules() -> list[Rule]:
    """The enabled rules, in order of precedence, each with its conditions: two plain
    statements (`agentsite.db.sql.Columns`: every pause reads them, and the ORM's prefetch
    cost half a millisecond more)."""
    policies = columns(ApprovalPolicy).filter({"enabled": True}, order_by=("priority", "id"))
    conditions: dict[int, list[PolicyCondition]] = {policy.pk: [] for policy in policies}
    for condition in columns(PolicyCondition).filter(
        {"policy__in": list(conditions)}, order_by=("id",)
    ):
        conditions[condition.policy_id].append(condition)
    return [
        Rule(
            id=policy.pk,
            name=policy.name,
            agent_name=policy.agent_name,
            tool_name=policy.tool_name,
            action=policy.action,
            message=policy.message,
            conditions=tuple(conditions[policy.pk]),
            on_expiry=policy.on_expiry,
            escalate_to=policy.escalate_to,
            requires_no_warnings=policy.requires_no_warnings,
        )
        for policy in policies
    ]


def user_facts(user_id: int | None) -> User:
    return users_facts([user_id]).get(user_id, User())


def users_facts(user_ids: Sequence[int | None]) -> dict[int | None, User]:
    """What the rules read of each of these users, in one query (none for no ids)."""
    ids = {user_id for user_id in user_ids if user_id is not None}
    if not ids:
        return {}
    found = columns(get_user_model()).filter({"pk__in": sorted(ids)})
    return {
        person.pk: User(email=person.email or "", username=str(person.get_username()))
        for person in found
    }


# A call's facts as its reviewer would read them (None: they could not be read).
FactsReader = Callable[[Call], Facts]


def verdicts(calls: Sequence[Call], user_id: int | None) -> list[Verdict]:
    """The verdict on each call of a pause, in order. Never raises: when the rules or the
    user cannot be read, every call waits for a person (logged)."""
    try:
        rules = load_rules()
        user = user_facts(user_id)
    except Exception as exc:
        logger.exception("Approval policies could not be read; every call waits for a person")
        failed = Verdict(
            PolicyAction.ASK, f"the policies could not be read ({type(exc).__name__})", failed=True
        )
        return [failed for _ in calls]
    return [evaluate(rules, call, user, facts_reader(user_id)) for call in calls]


def facts_reader(user_id: int | None) -> FactsReader:
    """What reads a call's facts for a rule, as its reviewer would read them: its tool's hook
    (`engine.facts.hook_of`) given its arguments and the user `user_id` (read once, when first
    needed); no hook, no facts."""
    person: list[Any] = []

    def read(call: Call) -> Facts:
        hook = hook_of(call.review, call.tool_name)
        if hook is None:
            return []
        if not person:
            found = get_user_model().objects.filter(pk=user_id).first() if user_id else None
            person.append(found)
        return read_facts(hook, [(call.arguments, person[0])], call.tool_name)[0]

    return read


def evaluate(
    rules: Sequence[Rule], call: Call, user: User, facts: FactsReader | None = None
) -> Verdict:
    """The verdict of the first rule in `rules` that matches `call`, or of none. `facts` reads
    the call's facts for a rule that approves only when they show no warnings; without it,
    such a rule cannot tell, so it does not approve (the call waits for a person)."""
    for rule in rules:
        if not rule.applies_to(call):
            continue
        try:
            reasons = [_holds(condition, call.arguments, user) for condition in rule.conditions]
        except PolicyError as error:
            return _failed(rule, str(error))
        except Exception as exc:  # a rule must never open a call by failing
            logger.exception("Approval policy %r failed on %s", rule.name, call.tool_name)
            return _failed(rule, f"{type(exc).__name__}: {exc}")
        if not all(holds for holds, _ in reasons):
            continue
        why = "; ".join(text for _, text in reasons) or f"every call of {rule.scope()}"
        if rule.action == PolicyAction.APPROVE and not call.auto_approve:
            return _ask(rule, f"it would approve ({why}), but the tool's author requires a person")
        if rule.action == PolicyAction.APPROVE and rule.requires_no_warnings:
            return _unless_warned(rule, call, why, facts)
        if rule.action == PolicyAction.ASK:
            return _ask(rule, why, rule.message)
        return Verdict(rule.action, why, rule.id, rule.name, rule.message)
    return Verdict(PolicyAction.ASK, NO_RULE)


def _ask(rule: Rule, why: str, message: str = "") -> Verdict:
    """`rule` sends the call to a person (`why`), who decides under the rule's expiry."""
    return Verdict(
        PolicyAction.ASK,
        why,
        rule.id,
        rule.name,
        message,
        on_expiry=rule.on_expiry,
        escalate_to=rule.escalate_to,
    )


def _failed(rule: Rule, why: str) -> Verdict:
    return Verdict(PolicyAction.ASK, why, rule.id, rule.name, failed=True)


UNREADABLE_FACTS = (
    "the facts of the call could not be read, and it approves only when they show no warnings"
)


def _unless_warned(rule: Rule, call: Call, why: str, facts: FactsReader | None) -> Verdict:
    """The verdict of an approving rule that matched `call` (`why`) and requires that its
    facts show no warnings: approve, ask a person when they warn, fail closed when they
    cannot be read."""
    try:
        found = facts(call) if facts is not None else None
    except Exception:
        logger.exception("Approval policy %r: the facts of %s failed", rule.name, call.tool_name)
        found = None
    if found is None:
        return _failed(rule, UNREADABLE_FACTS)
    # Each as the reviewer reads it, label and value; the verdict's sentence ends them.
    warnings = [f"{fact.label}: {fact.value.rstrip('.')}" for fact in found if fact.warning]
    if warnings:
        return _ask(rule, f"it would approve ({why}), but the facts warn: {'; '.join(warnings)}")
    return Verdict(PolicyAction.APPROVE, f"{why}; no warnings", rule.id, rule.name, rule.message)


def _argument(arguments: Any, path: str) -> Any:
    """The argument at `path` (a.b: field b of object argument a); None when the call does
    not have it (an optional argument left out). Arguments that are not an object cannot be
    read."""
    if not isinstance(arguments, dict):
        raise PolicyError("the call's arguments are not an object")
    value: Any = arguments
    for part in path.split("."):
        if value is None:
            return None  # an object argument left out: its fields are not given either
        if not isinstance(value, dict):
            raise PolicyError(f"{path} is not a field of an object")
        value = value.get(part, None)
    return value


def _number(value: Any, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise PolicyError(f"{what} is not a number")
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise PolicyError(f"{what} is not a number") from None
    if not number.is_finite():
        raise PolicyError(f"{what} is not a finite number")
    return number


def _boolean(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise PolicyError(f"{value!r} is not true or false")
    return lowered == "true"


def _same(actual: Any, expected: str, what: str) -> bool:
    """`actual == expected`, `expected` read as the type of `actual` (text ignores case)."""
    if actual is None:
        return expected.strip() == ""
    if isinstance(actual, bool):
        return actual == _boolean(expected)
    if isinstance(actual, (int, float)):
        return _number(actual, what) == _number(expected, f"{expected!r}")
    if isinstance(actual, str):
        return actual.strip().casefold() == expected.strip().casefold()
    raise PolicyError(f"{what} is not a number, text or true/false")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise PolicyError(f"{what} is not text")
    return value.casefold()


def _holds(condition: PolicyCondition, arguments: Any, user: User) -> tuple[bool, str]:
    """Whether `condition` holds for the call, and what it compared, for people."""
    name = condition.argument.strip()
    if not name:
        raise PolicyError("a condition names no argument")
    actual = _argument(arguments, name)
    source = condition.compare_to
    if source == ConditionSource.USER_EMAIL:
        expected, shown = user.email, f"the user's email address ({user.email or 'none'})"
        if not expected:
            raise PolicyError("the user has no email address")
    elif source == ConditionSource.USER_NAME:
        expected, shown = user.username, f"the user's username ({user.username})"
    elif source == ConditionSource.VALUE:
        expected, shown = condition.value, condition.value
    else:
        raise PolicyError(f"unknown comparison {source!r}")
    op = condition.operator
    what = f"{name} ({actual!r})" if actual is not None else f"{name} (not given)"
    if op in (ConditionOperator.EQUALS, ConditionOperator.NOT_EQUALS):
        same = _same(actual, expected, what)
        holds = same if op == ConditionOperator.EQUALS else not same
    elif op in (
        ConditionOperator.LESS,
        ConditionOperator.AT_MOST,
        ConditionOperator.MORE,
        ConditionOperator.AT_LEAST,
    ):
        left, right = _number(actual, what), _number(expected, repr(expected))
        holds = {
            ConditionOperator.LESS: left < right,
            ConditionOperator.AT_MOST: left <= right,
            ConditionOperator.MORE: left > right,
            ConditionOperator.AT_LEAST: left >= right,
        }[ConditionOperator(op)]
    elif op in (ConditionOperator.ONE_OF, ConditionOperator.NOT_ONE_OF):
        options = [part for part in expected.split(",") if part.strip()]
        if not options:
            raise PolicyError(f"the list for {name} is empty")
        found = any(_same(actual, option, what) for option in options)
        holds = found if op == ConditionOperator.ONE_OF else not found
    elif op == ConditionOperator.CONTAINS:
        holds = expected.casefold() in _text(actual, what)
    elif op == ConditionOperator.STARTS_WITH:
        holds = _text(actual, what).startswith(expected.casefold())
    elif op == ConditionOperator.ENDS_WITH:
        holds = _text(actual, what).endswith(expected.casefold())
    else:
        raise PolicyError(f"unknown operator {op!r}")
    label = ConditionOperator(op).label.removesuffix(" (comma-separated)")
    shown_actual = "not given" if actual is None else _shown(actual)
    return holds, f"{name} {shown_actual} {label} {shown}"


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def describe(rule: ApprovalPolicy) -> str:
    """A rule in one line, for people: "approve automatically issue_refund when amount is at
    most 20"."""
    scope = rule.tool_name or "any tool"
    if rule.agent_name:
        scope = f"{scope} of {rule.agent_name}"
    conditions = " and ".join(str(c) for c in rule.conditions.all())
    action = PolicyAction(rule.action).label.lower()
    careful = rule.action == PolicyAction.APPROVE and rule.requires_no_warnings
    return (
        f"{action}: {scope}"
        + (f" when {conditions}" if conditions else "")
        + (", only with no warnings" if careful else "")
    )


def call_for(
    agent_name: str,
    tool_name: str,
    arguments: Any,
    run_agent: str | None,
    kind: str = ToolKind.FUNCTION,
    server: str = "",
) -> Call:
    """The call the rules read, with whether its tool's author lets a rule approve it (a tool
    of an MCP server `server` is none of the agent's: one of the same name declares nothing
    for it; what was declared for the server's tool does)."""
    tool = registry.find_tool(run_agent, agent_name, tool_name, kind)
    review = registry.declared_review(tool) if tool is not None else registry.Review()
    if server and kind in MCP_KINDS:
        review = registry.declared_server_review(server, tool_name)
    return Call(agent_name, tool_name, arguments, review.auto_approve, review)


# --- the gate: rules over tools that need no approval of their own ------------------------------

# How long a process keeps the rules it read for its gates; a change in this process clears
# them at once (the signals below), one in another process is seen within this.
RULES_CACHE_SECONDS = 5.0
_cached: tuple[float, list[Rule]] | None = None


def _fresh_rules() -> list[Rule] | None:
    cached = _cached
    if cached is not None and time.monotonic() - cached[0] < RULES_CACHE_SECONDS:
        return cached[1]
    return None


def cached_rules_sync() -> list[Rule]:
    global _cached
    rules = _fresh_rules()
    if rules is None:
        rules = load_rules()
        _cached = (time.monotonic(), rules)
    return rules


async def cached_rules() -> list[Rule]:
    """`cached_rules_sync` from the loop: no hop while the cache is fresh."""
    rules = _fresh_rules()
    return rules if rules is not None else await db_hop(cached_rules_sync)()


def forget_rules(*_: Any, **__: Any) -> None:
    global _cached
    _cached = None


for _model in (ApprovalPolicy, PolicyCondition):
    post_save.connect(forget_rules, sender=_model, dispatch_uid=f"policies-{_model.__name__}-save")
    post_delete.connect(
        forget_rules, sender=_model, dispatch_uid=f"policies-{_model.__name__}-delete"
    )


class Gate:
    """A function tool's `needs_approval` that asks the tool's own setting, then the rules:
    True (pause) when the tool wants a person, or when the first rule that matches the call
    asks for one or rejects it, or when the rules cannot be evaluated."""

    def __init__(self, tool_name: str, own: Any, agents: set[str]) -> None:
        self.tool_name = tool_name
        setattr(self, registry.OWN_APPROVAL_SETTING, own)
        self.agents = agents

    @property
    def own(self) -> Any:
        return getattr(self, registry.OWN_APPROVAL_SETTING)

    async def __call__(self, ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        own = self.own
        if callable(own):
            answer = own(ctx, params, call_id)
            if inspect.isawaitable(answer):
                answer = await answer
            if answer:
                return True
        elif own:
            return True
        context = getattr(ctx, "context", None)
        if not isinstance(context, run_context.RunContext):
            return False  # not one of agentsite's runs: the tool's own setting alone
        verdict = await self._judge(ctx, params)
        if verdict is None:
            return False
        context.gated[call_id] = verdict
        return True

    async def _judge(self, ctx: Any, params: dict[str, Any]) -> Verdict | None:
        """The verdict that stops the call, or None when it may run without a person."""
        try:
            rules = await cached_rules()
            candidates = [
                rule
                for rule in rules
                if (not rule.tool_name or rule.tool_name == self.tool_name)
                and (not rule.agent_name or rule.agent_name in self.agents)
            ]
            if not candidates:
                return None
            user = User()
            if any(c.compare_to != ConditionSource.VALUE for r in candidates for c in r.conditions):
                found = await run_context.requesting_user(ctx)
                user = User(email=found.email or "", username=found.get_username())
            agent = next(iter(self.agents)) if len(self.agents) == 1 else ""
            # Each rule applies to this call: its agent test was done above, for every holder.
            call = Call(agent, self.tool_name, params)
            rules = [_any_agent(rule) for rule in candidates]
            verdict = evaluate(rules, call, user, _unread)
        except Exception as exc:
            logger.exception("Approval policies: the gate of %s failed; it pauses", self.tool_name)
            return Verdict(
                PolicyAction.ASK,
                f"the policies could not be evaluated ({type(exc).__name__})",
                failed=True,
            )
        if verdict.action == PolicyAction.APPROVE or (
            not verdict.policy_name and not verdict.failed
        ):
            return None
        return verdict


def _any_agent(rule: Rule) -> Rule:
    return replace(rule, agent_name="")


def _unread(call: Call) -> Facts:
    # The gate's calls need no approval of their own: a rule that approves one lets it run
    # as it would without the rule, so its facts need not be read (they would only delay it).
    return []


async def aguard(agent: Agent[Any]) -> None:
    """`guard` with the rules as this process has them (read at most every
    `RULES_CACHE_SECONDS`); when they cannot be read, every tool gets its gate (which tries
    again, and pauses the call if it still cannot)."""
    try:
        rules = await cached_rules()
    except Exception:
        logger.exception("Approval policies could not be read; every tool call of the run waits")
        guard(agent, None)
        return
    guard(agent, rules)


def guard(agent: Agent[Any], rules: Sequence[Rule] | None) -> None:
    """Give each function tool reachable from `agent` whose own `needs_approval` is not True
    a `Gate` while a rule that asks or rejects could match its calls (every tool when
    `rules` is None: they could not be read), and take it away when none could: a gate is
    a callable, and the SDK treats a callable's calls more strictly than a tool that needs
    no approval (arguments it had to coerce wait for a person), so only tools a rule is
    about get one."""
    holders: dict[int, tuple[FunctionTool, set[str]]] = {}
    for reachable in registry.walk(agent):
        for tool in reachable.tools:
            if isinstance(tool, FunctionTool):
                holders.setdefault(id(tool), (tool, set()))[1].add(reachable.name)
    stopping = [
        rule for rule in rules or () if rule.action in (PolicyAction.ASK, PolicyAction.REJECT)
    ]
    for tool, agents in holders.values():
        current = tool.needs_approval
        gate = current if isinstance(current, Gate) else None
        own = gate.own if gate is not None else current
        if own is True:
            continue
        wanted = rules is None or any(
            (not rule.tool_name or rule.tool_name == tool.name)
            and (not rule.agent_name or rule.agent_name in agents)
            for rule in stopping
        )
        if wanted and gate is None:
            tool.needs_approval = Gate(tool.name, own, set(agents))
        elif wanted and gate is not None:
            gate.agents |= agents
        elif not wanted and gate is not None:
            tool.needs_approval = own


def gated_verdict(context: Any, call_id: str) -> Verdict | None:
    """The verdict a gate paused this call with (then the tool itself needs no approval)."""
    gated = getattr(context, "gated", None)
    verdict = gated.pop(call_id, None) if isinstance(gated, dict) else None
    return verdict if isinstance(verdict, Verdict) else None
