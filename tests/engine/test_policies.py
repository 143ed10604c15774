"""Approval policies that outlast a run (`engine/policies.py`).

Rules in the database decide a paused call without a person (approve, reject), or send it to
one (ask); the first enabled rule that matches, by priority, decides. A decision by a rule is
audited and traced as "policy <name>"; a rule that cannot be evaluated fails closed (a person
decides); a change to the rules never changes a decision already taken."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from django.test import Client
from django.urls import reverse

from approvals.models import (
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    PolicyAction,
    PolicyCondition,
    ToolKind,
)
from conversations.session import DjangoSession
from engine import events, facts, policies, registry, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_conversation, make_reviewer, make_user
from tracing.models import Span

REPLY = "Done."


def rule(
    name: str,
    action: str,
    *conditions: tuple[str, str, str],
    tool: str = "wire_money",
    priority: int = 100,
    **fields: Any,
) -> ApprovalPolicy:
    policy = ApprovalPolicy.objects.create(
        name=name, action=action, tool_name=tool, priority=priority, **fields
    )
    for argument, operator, value in conditions:
        PolicyCondition.objects.create(
            policy=policy, argument=argument, operator=operator, value=value
        )
    return policy


def small_refunds(**fields: Any) -> ApprovalPolicy:
    return rule("approve refunds ≤ 20", PolicyAction.APPROVE, ("amount", "<=", "20"), **fields)


def paused(settings: Any, *calls: dict[str, Any], tools: list[Any] | None = None) -> AgentRun:
    """A run whose model calls `wire_money` with each of `calls` at once, then replies: run to
    its pause (or, when policies decide every call, to its resumption)."""
    model = ScriptedModel(
        [
            [
                function_call("wire_money", arguments, call_id=f"call_{i}")
                for i, arguments in enumerate(calls)
            ],
            [assistant_message(REPLY, item_id="msg_1")],
        ]
    )
    agent = Agent(name="Wire", model=model, tools=tools or [scripted.wire_money])
    return scripted.executed(scripted.start(settings, agent, "send money"))


# --- through the engine -------------------------------------------------------------------------

engine_test = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry", "submitted"),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_a_refund_of_15_under_approve_refunds_up_to_20_never_reaches_the_inbox(
    settings: Any, submitted: list[Any], published: list[Any], traces: Any, client: Client
) -> None:
    policy = small_refunds()
    run = paused(settings, {"account": "acme", "amount": 15})

    request = run.approval_requests.get()
    assert request.status == ApprovalStatus.APPROVED and request.decided_by is None
    assert run.status == RunStatus.RESUMING and submitted[-1] == ("resume", run.pk)
    # Never in an inbox: not pending, and no inbox was told of it.
    assert not ApprovalRequest.objects.pending().exists()
    assert not [e for e in published if isinstance(e, events.ApprovalCreated)]
    client.force_login(make_reviewer())
    inbox = client.get(reverse("inbox")).content.decode()
    assert f'id="request-{request.pk}"' not in inbox

    # Audited as decided by the policy, in the same audit as a person's.
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.reviewer, decision.approved, decision.kind) == (None, True, "approved")
    assert (decision.policy, decision.policy_name) == (policy, "approve refunds ≤ 20")
    assert decision.by_policy and str(decision).startswith("policy approve refunds ≤ 20 approved")
    assert "amount 15 is at most 20" in decision.note
    assert request.decider_display() == "policy approve refunds ≤ 20"

    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert scripted.EXECUTED == [("wire_money", ("acme", 15))]  # once

    # The trace shows the decision as it shows a reviewer's.
    traces.flush()
    [span] = Span.objects.filter(trace_id=run.trace_id, name="approval decision")
    assert span.data["reviewer"] == "policy approve refunds ≤ 20"
    assert (span.data["decision"], span.data["policy"]) == ("approve", "approve refunds ≤ 20")

    # The history lists it, decided by the policy.
    history = client.get(reverse("inbox_history")).content.decode()
    assert "policy approve refunds ≤ 20" in history


@pytest.mark.parametrize("amount", [80, 20.01])
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_refund_above_the_rule_reaches_the_inbox(
    settings: Any, amount: float, published: list[Any], client: Client
) -> None:
    small_refunds()
    run = paused(settings, {"account": "acme", "amount": amount})
    request = run.approval_requests.get()
    assert request.is_pending and run.status == RunStatus.WAITING
    assert [e.request_id for e in published if isinstance(e, events.ApprovalCreated)] == [
        request.pk
    ]
    assert not ApprovalDecision.objects.exists() and scripted.EXECUTED == []
    verdict = policies.Verdict.from_json(request.verdict)
    assert verdict is not None and verdict.action == "ask" and not verdict.failed
    # The inbox says why a person decides.
    client.force_login(make_reviewer())
    inbox = client.get(reverse("inbox")).content.decode()
    assert f'id="request-{request.pk}"' in inbox
    assert "No policy applies" in inbox


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_rule_that_raises_fails_closed_the_call_waits_for_a_person(
    settings: Any, monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    small_refunds()

    def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(policies, "_holds", broken)
    run = paused(settings, {"account": "acme", "amount": 15})
    request = run.approval_requests.get()
    assert request.is_pending and run.status == RunStatus.WAITING
    assert scripted.EXECUTED == [] and not ApprovalDecision.objects.exists()
    assert request.verdict["failed"] is True
    assert request.verdict["policy_name"] == "approve refunds ≤ 20"
    client.force_login(make_reviewer())
    page = client.get(reverse("inbox_request", args=[request.pk])).content.decode()
    assert "could not be evaluated (RuntimeError: boom), so a person decides" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_unreadable_rules_fail_closed(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    small_refunds()

    def down() -> Any:
        raise ConnectionError("database gone")

    monkeypatch.setattr(policies, "load_rules", down)
    run = paused(settings, {"account": "acme", "amount": 15})
    request = run.approval_requests.get()
    assert request.is_pending and request.verdict["failed"] is True
    assert "could not be read" in request.verdict["reason"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_rule_rejects_and_the_model_reads_why(settings: Any) -> None:
    rule(
        "no wires to acme",
        PolicyAction.REJECT,
        ("account", "==", "ACME"),
        message="Wires to acme go through finance.",
    )
    run = paused(settings, {"account": "acme", "amount": 5})
    request = run.approval_requests.get()
    assert request.status == ApprovalStatus.REJECTED and run.status == RunStatus.RESUMING
    decision = request.decisions.get()
    assert decision.kind == DecisionKind.REJECTED and decision.policy_name == "no wires to acme"
    asyncio.run(runs.resume(run.pk))
    assert scripted.EXECUTED == []
    stored = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    [output] = [i["output"] for i in stored if i.get("type") == "function_call_output"]
    assert output == (
        "This tool call was rejected by the policy “no wires to acme”; it did not run. "
        "Wires to acme go through finance."
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_pause_with_one_call_decided_by_a_rule_waits_for_the_other_then_runs_both_once(
    settings: Any, client: Client
) -> None:
    small_refunds()
    run = paused(settings, {"account": "a", "amount": 10}, {"account": "b", "amount": 90})
    by_call = {r.call_id: r for r in run.approval_requests.all()}
    assert by_call["call_0"].status == ApprovalStatus.APPROVED
    assert by_call["call_1"].is_pending and run.status == RunStatus.WAITING
    # The chat tells the user which was decided, and by what.
    client.force_login(run.conversation.owner)
    chat = client.get(reverse("chat", args=[run.conversation.session_id])).content.decode()
    assert "Approved by policy approve refunds ≤ 20" in chat
    runs.decide(by_call["call_1"], make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert sorted(scripted.EXECUTED) == [("wire_money", ("a", 10)), ("wire_money", ("b", 90))]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_change_to_the_rules_never_changes_a_decision_already_taken(settings: Any) -> None:
    policy = small_refunds()
    run = paused(settings, {"account": "acme", "amount": 15})
    request = run.approval_requests.get()
    before = ApprovalDecision.objects.filter(request=request).values().get()

    policy.action, policy.name = PolicyAction.REJECT, "renamed"
    policy.save()
    policy.conditions.update(value="1")
    asyncio.run(runs.resume(run.pk))  # resumes with the decision taken, not the rule now
    assert scripted.EXECUTED == [("wire_money", ("acme", 15))]
    policy.delete()
    after = ApprovalDecision.objects.filter(request=request).values().get()
    assert {**before, "policy_id": None} == after
    assert ApprovalRequest.objects.get(pk=request.pk).decider_display() == (
        "policy approve refunds ≤ 20"
    )

    # And a rule added while a call waits does not decide it: it applies from the next pause.
    run = paused(settings, {"account": "acme", "amount": 50})
    waiting = run.approval_requests.get()
    rule("approve all wires", PolicyAction.APPROVE)
    assert ApprovalRequest.objects.get(pk=waiting.pk).is_pending


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_tool_whose_author_requires_a_person_is_never_approved_by_a_rule(
    settings: Any,
) -> None:
    @function_tool(needs_approval=True)
    def wire_money(account: str, amount: int) -> str:
        """Send money."""
        scripted.EXECUTED.append(("wire_money", (account, amount)))
        return "sent"

    registry.review(wire_money, risk="irreversible", auto_approve=False)
    small_refunds()
    run = paused(settings, {"account": "acme", "amount": 15}, tools=[wire_money])
    request = run.approval_requests.get()
    assert request.is_pending and request.verdict["action"] == "ask"
    assert "the tool's author requires a person" in request.verdict["reason"]


# --- the rules themselves -----------------------------------------------------------------------

CALL = policies.Call("Support", "send_email", {"to": "Alice@Example.com", "amount": 15.0})
ALICE = policies.User(email="alice@example.com", username="alice")


def no_facts(call: policies.Call) -> list[Any]:
    """The facts of a call whose tool has no facts hook: none, so no warnings."""
    return []


def verdict(call: policies.Call = CALL, user: policies.User = ALICE) -> policies.Verdict:
    return policies.evaluate(policies.load_rules(), call, user, no_facts)


@pytest.mark.django_db
def test_the_first_enabled_matching_rule_by_priority_decides() -> None:
    rule("later approve", PolicyAction.APPROVE, tool="send_email", priority=20)
    first = rule("first reject", PolicyAction.REJECT, tool="send_email", priority=10)
    assert verdict().policy_name == "first reject"
    first.enabled = False
    first.save()
    assert verdict().policy_name == "later approve"
    # Equal priorities: the older rule first.
    rule("same priority, newer", PolicyAction.REJECT, tool="send_email", priority=20)
    assert verdict().policy_name == "later approve"


@pytest.mark.django_db
def test_an_ask_rule_stops_the_rules_below_it() -> None:
    rule("approve all email", PolicyAction.APPROVE, tool="send_email", priority=50)
    outside = rule("ask for outside addresses", PolicyAction.ASK, tool="send_email", priority=10)
    PolicyCondition.objects.create(
        policy=outside, argument="to", operator="!=", compare_to="user.email"
    )
    # Her own address (whatever its case): the ask rule does not match, the next approves.
    assert verdict().action == "approve"
    other = policies.Call("Support", "send_email", {"to": "mallory@evil.example"})
    found = verdict(other)
    assert (found.action, found.policy_name) == ("ask", "ask for outside addresses")
    assert "the user's email address (alice@example.com)" in found.reason
    # A user without an email address: the comparison cannot be made, so a person decides.
    assert verdict(user=policies.User(username="bob")).failed


@pytest.mark.django_db
def test_rules_match_on_agent_and_tool() -> None:
    rule("billing only", PolicyAction.APPROVE, tool="send_email", agent_name="Billing")
    assert verdict().policy_name == ""
    assert verdict(policies.Call("Billing", "send_email", {})).policy_name == "billing only"
    assert verdict(policies.Call("Billing", "other", {})).policy_name == ""
    rule("any tool of anyone", PolicyAction.REJECT, tool="")
    assert verdict().policy_name == "any tool of anyone"


@pytest.mark.parametrize(
    ("argument", "operator", "value", "holds"),
    [
        ("amount", "<=", "15", True),
        ("amount", "<", "15", False),
        ("amount", ">=", "15.0", True),
        ("amount", ">", "14.99", True),
        ("amount", "==", "15", True),
        ("amount", "!=", "15", False),
        ("amount", "in", "5, 15 ,25", True),
        ("amount", "not in", "5,25", True),
        ("to", "==", "alice@example.COM", True),
        ("to", "ends with", "@example.com", True),
        ("to", "starts with", "bob", False),
        ("to", "contains", "ALICE", True),
        ("to", "in", "bob@example.com,alice@example.com", True),
        ("missing", "==", "", True),
        ("missing", "!=", "x", True),
        ("nested.deep", "==", "", True),
    ],
)
@pytest.mark.django_db
def test_each_operator(argument: str, operator: str, value: str, holds: bool) -> None:
    rule("r", PolicyAction.APPROVE, (argument, operator, value), tool="send_email")
    assert (verdict().policy_name == "r") is holds


@pytest.mark.parametrize(
    ("argument", "operator", "value", "why"),
    [
        ("amount", "<=", "twenty", "'twenty' is not a number"),
        ("to", "<=", "20", "to ('Alice@Example.com') is not a number"),
        ("amount", "==", "fifteen", "'fifteen' is not a number"),
        ("amount", "contains", "1", "amount (15.0) is not text"),
        ("missing", "<", "3", "missing (not given) is not a number"),
        ("missing", "ends with", "x", "missing (not given) is not text"),
        ("amount", "in", " , ", "the list for amount is empty"),
        ("to.x", "==", "1", "to.x is not a field of an object"),
        ("amount", "<=", "NaN", "'NaN' is not a finite number"),
    ],
)
@pytest.mark.django_db
def test_a_condition_that_cannot_be_evaluated_fails_closed_and_stops_the_rules(
    argument: str, operator: str, value: str, why: str
) -> None:
    rule("broken", PolicyAction.REJECT, (argument, operator, value), tool="send_email")
    rule("approve everything", PolicyAction.APPROVE, tool="", priority=200)
    found = verdict()
    assert (found.action, found.failed, found.policy_name) == ("ask", True, "broken")
    assert found.reason == why
    assert (
        found.sentence() == f"Policy “broken” could not be evaluated ({why}), so a person decides."
    )


@pytest.mark.django_db
def test_arguments_that_are_not_an_object_fail_closed_for_a_rule_with_conditions() -> None:
    rule("r", PolicyAction.APPROVE, ("amount", "<=", "20"), tool="send_email")
    found = verdict(policies.Call("Support", "send_email", "not json"))
    assert found.failed and found.reason == "the call's arguments are not an object"


def test_a_stored_verdict_reads_back_and_a_missing_one_is_none() -> None:
    stored = policies.Verdict("approve", "amount 15 is at most 20", 3, "small").as_json()
    assert policies.Verdict.from_json(stored) == policies.Verdict(
        "approve", "amount 15 is at most 20", 3, "small"
    )
    assert policies.Verdict.from_json({}) is None
    assert policies.Verdict.from_json({"action": "drop tables"}) is None


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_registry")
def test_no_rule_approves_a_demo_cancellation_a_person_decides_each() -> None:
    rule("approve everything", PolicyAction.APPROVE, tool="")
    rules = policies.load_rules()
    cancel = policies.call_for("Support desk", "cancel_order", {"order_id": 7}, None)
    refund = policies.call_for("Support desk", "issue_refund", {"order_id": 7, "amount": 5}, None)
    assert not cancel.auto_approve and refund.auto_approve
    assert policies.evaluate(rules, cancel, ALICE, no_facts).action == "ask"
    assert policies.evaluate(rules, refund, ALICE, no_facts).action == "approve"


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_registry")
def test_an_mcp_tool_named_like_one_of_the_agent_s_takes_nothing_of_its_declaration() -> None:
    """The demo's cancel_order lets no rule approve it; a tool of an MCP server that happens to
    be called cancel_order is not that tool (the inbox and the facts say so too)."""
    rule("approve everything", PolicyAction.APPROVE, tool="")
    rules = policies.load_rules()
    own = policies.call_for("Support desk", "cancel_order", {"order_id": 7}, None)
    served = policies.call_for("Support desk", "cancel_order", {"order_id": 7}, None, ToolKind.MCP)
    assert not own.auto_approve and not served.review.declared
    assert served.auto_approve and own.review != served.review
    assert policies.evaluate(rules, served, ALICE, no_facts).action == "approve"


# --- rules that approve only what the facts do not warn about -------------------------------------


def account_facts(calls: Any) -> list[list[Any]]:
    """What a reviewer reads of each wire (`registry.review(facts=...)`): the account, with a
    warning for a closed one; "explode" cannot be read."""
    found = []
    for arguments, user in calls:
        account = arguments.get("account")
        if account == "explode":
            raise RuntimeError("the accounts service is down")
        facts: list[Any] = [("Account", f"{account} (for {user.username if user else 'nobody'})")]
        if account == "closed-co":
            facts.append(("Account", "closed-co was closed last week.", True))
        found.append(facts)
    return found


@registry.review(risk="irreversible", facts=account_facts)
@function_tool(name_override="wire_money", needs_approval=True)
def wire_with_facts(account: str, amount: int) -> str:
    """Send money (its reviewers read the account's facts)."""
    scripted.EXECUTED.append(("wire_money", (account, amount)))
    return f"sent {amount} to {account}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_rule_that_requires_no_warnings_approves_only_calls_the_facts_do_not_warn_about(
    settings: Any, client: Client
) -> None:
    small_refunds(requires_no_warnings=True)
    run = paused(
        settings,
        {"account": "acme", "amount": 15},
        {"account": "closed-co", "amount": 15},
        tools=[wire_with_facts],
    )
    by_call = {r.call_id: r for r in run.approval_requests.all()}
    clean, warned = by_call["call_0"], by_call["call_1"]
    assert clean.status == ApprovalStatus.APPROVED
    assert clean.verdict["reason"] == "amount 15 is at most 20; no warnings"
    assert "no warnings" in ApprovalDecision.objects.get(request=clean).note
    # The facts warn: the rule would approve, so it sends the call to a person, saying why.
    assert warned.is_pending and run.status == RunStatus.WAITING
    verdict = policies.Verdict.from_json(warned.verdict)
    assert verdict is not None
    assert (verdict.action, verdict.policy_name, verdict.failed) == (
        "ask",
        "approve refunds ≤ 20",
        False,
    )
    assert verdict.sentence() == (
        "Policy “approve refunds ≤ 20” asks a person: it would approve (amount 15 is at most "
        "20), but the facts warn: Account: closed-co was closed last week."
    )
    client.force_login(make_reviewer())
    page = client.get(reverse("inbox_request", args=[warned.pk])).content.decode()
    assert "but the facts warn: Account: closed-co was closed last week." in page


@pytest.mark.parametrize("failure", ["raises", "too slow"])
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_rule_that_requires_no_warnings_fails_closed_when_the_facts_cannot_be_read(
    settings: Any, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    if failure == "too slow":
        monkeypatch.setattr(facts, "TIMEOUT_SECONDS", 0.2)

        def slow(calls: Any) -> Any:
            time.sleep(1)
            return [[] for _ in calls]

        hook: Any = slow
    else:
        hook = account_facts
    # Registered for the tool's name: the scripted wire_money declares no hook of its own.
    facts.register("wire_money", hook)
    try:
        small_refunds(requires_no_warnings=True)
        account = "explode" if failure == "raises" else "acme"
        run = paused(settings, {"account": account, "amount": 15})
    finally:
        facts.unregister("wire_money")
    request = run.approval_requests.get()
    assert request.is_pending and scripted.EXECUTED == []
    assert not ApprovalDecision.objects.exists()
    verdict = policies.Verdict.from_json(request.verdict)
    assert verdict is not None and verdict.failed and verdict.action == "ask"
    assert verdict.policy_name == "approve refunds ≤ 20"
    assert "the facts of the call could not be read" in verdict.reason


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_rule_that_does_not_require_it_approves_despite_warnings(settings: Any) -> None:
    small_refunds(requires_no_warnings=False)
    run = paused(settings, {"account": "closed-co", "amount": 15}, tools=[wire_with_facts])
    request = run.approval_requests.get()
    assert request.status == ApprovalStatus.APPROVED
    assert request.verdict["reason"] == "amount 15 is at most 20"


@pytest.mark.django_db
def test_a_rule_requires_no_warnings_unless_told_otherwise() -> None:
    assert ApprovalPolicy(name="new").requires_no_warnings is True
    assert small_refunds().requires_no_warnings is True


@pytest.mark.django_db
def test_without_a_way_to_read_the_facts_a_rule_that_requires_no_warnings_does_not_approve() -> (
    None
):
    rule("approve wires", PolicyAction.APPROVE, requires_no_warnings=True)
    rules = policies.load_rules()
    call = policies.Call("Support", "wire_money", {"account": "acme"})
    assert policies.evaluate(rules, call, ALICE).failed
    assert policies.evaluate(rules, call, ALICE, facts=lambda call: []).action == "approve"
    warned = [facts.Fact("Account", "closed", True)]
    found = policies.evaluate(rules, call, ALICE, facts=lambda call: warned)
    assert (found.action, found.failed) == ("ask", False)
    assert policies.evaluate(rules, call, ALICE, facts=lambda call: None).failed


# --- the admin ----------------------------------------------------------------------------------


def conditions_post(*rows: tuple[str, str, str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {
        "conditions-TOTAL_FORMS": str(len(rows)),
        "conditions-INITIAL_FORMS": "0",
        "conditions-MIN_NUM_FORMS": "0",
        "conditions-MAX_NUM_FORMS": "20",
    }
    for i, (argument, operator, compare_to, value) in enumerate(rows):
        data |= {
            f"conditions-{i}-argument": argument,
            f"conditions-{i}-operator": operator,
            f"conditions-{i}-compare_to": compare_to,
            f"conditions-{i}-value": value,
        }
    return data


@pytest.mark.django_db
def test_staff_manage_rules_in_the_admin_with_conditions_checked(admin_client: Client) -> None:
    add = reverse("admin:approvals_approvalpolicy_add")
    rule_fields = {
        "name": "approve refunds ≤ 20",
        "enabled": "on",
        "priority": "10",
        "tool_name": " issue_refund ",
        "agent_name": "",
        "action": "approve",
        "message": "",
        "description": "",
    }
    # A comparison of numbers with a word cannot be evaluated: refused, nothing saved.
    bad = admin_client.post(add, rule_fields | conditions_post(("amount", "<=", "value", "x")))
    assert bad.status_code == 200 and not ApprovalPolicy.objects.exists()
    assert "compares numbers: write a number" in bad.content.decode()
    # A message on an approving rule means nothing: refused too.
    bad = admin_client.post(add, rule_fields | {"message": "hi"} | conditions_post())
    assert "Only a rejecting rule has a message" in bad.content.decode()

    saved = admin_client.post(add, rule_fields | conditions_post(("amount", "<=", "value", "20")))
    assert saved.status_code == 302
    policy = ApprovalPolicy.objects.get()
    assert policy.tool_name == "issue_refund" and policy.updated_by is not None
    assert [str(c) for c in policy.conditions.all()] == ["amount <= 20"]
    listing = admin_client.get(reverse("admin:approvals_approvalpolicy_changelist"))
    assert "amount &lt;= 20" in listing.content.decode()
    assert policies.describe(policy) == "approve automatically: issue_refund when amount <= 20"


@pytest.mark.django_db
def test_the_admin_refuses_a_tool_no_agent_has_unless_told_to_save_anyway(
    admin_client: Client,
) -> None:
    add = reverse("admin:approvals_approvalpolicy_add")
    fields = {
        "name": "approve refunds ≤ 20",
        "enabled": "on",
        "priority": "10",
        "tool_name": "issue_refunds",
        "agent_name": "",
        "action": "approve",
    } | conditions_post(("amount", "<=", "value", "20"))
    refused = admin_client.post(add, fields)
    assert refused.status_code == 200 and not ApprovalPolicy.objects.exists()
    page = refused.content.decode()
    assert "No registered agent has a tool called “issue_refunds”" in page
    assert "Did you mean issue_refund?" in page
    saved = admin_client.post(add, fields | {"save_anyway": "on"})
    assert saved.status_code == 302
    assert ApprovalPolicy.objects.get().tool_name == "issue_refunds"


@pytest.mark.parametrize(
    ("row", "error"),
    [
        (("amount", "<", "user.email", ""), "are text, not numbers"),
        (("amount", "in", "value", " , "), "separated by commas"),
        (("to", "ends with", "value", ""), "the text to look for"),
        (("to; drop", "==", "value", "x"), "Name an argument as the tool"),
    ],
)
@pytest.mark.django_db
def test_a_condition_the_rules_could_not_evaluate_is_refused(
    admin_client: Client, row: tuple[str, str, str, str], error: str
) -> None:
    response = admin_client.post(
        reverse("admin:approvals_approvalpolicy_add"),
        {"name": "r", "enabled": "on", "priority": "1", "action": "reject"} | conditions_post(row),
    )
    assert response.status_code == 200 and error in response.content.decode()
    assert not ApprovalPolicy.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_the_inbox_shows_what_the_rules_said_and_what_they_would_say_now(
    settings: Any, client: Client
) -> None:
    rule('<b>asks</b> "big"', PolicyAction.ASK, ("amount", ">", "50"))
    run = paused(settings, {"account": "acme", "amount": 60})
    request = run.approval_requests.get()
    client.force_login(make_reviewer())
    row = client.get(reverse("inbox")).content.decode()
    said = (
        "Policy “&lt;b&gt;asks&lt;/b&gt; &quot;big&quot;” asks a person: amount 60 is more than 50"
    )
    assert said in row
    assert "<b>asks</b>" not in row and "data-policy-now" not in row

    # A rule added since (first in precedence) would approve it: the inbox says so, and that
    # the call still waits for a person.
    rule("approve all wires", PolicyAction.APPROVE, priority=1)
    page = client.get(reverse("inbox_request", args=[request.pk])).content.decode()
    assert "Under the rules as they are now: Policy “approve all wires” approves" in page
    assert "this call still waits for a person" in page
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_the_request_page_of_a_call_a_rule_decided_names_the_rule(
    settings: Any, client: Client
) -> None:
    small_refunds()
    run = paused(settings, {"account": "acme", "amount": 15})
    request = run.approval_requests.get()
    client.force_login(make_reviewer())
    page = client.get(reverse("inbox_request", args=[request.pk])).content.decode()
    assert "by <strong data-policy-decided>policy approve refunds ≤ 20</strong>" in page
    assert "amount 15 is at most 20" in page
    # Deciding it again is refused with who decided.
    with pytest.raises(runs.AlreadyDecided, match="Already approved by policy approve refunds"):
        runs.decide(request, make_reviewer(username="rex"), runs.Decision.reject())


# --- the gate: rules over tools that need no approval of their own ------------------------------


@function_tool
def look_up(account: str) -> str:
    """Look an account up (needs no approval of its own)."""
    scripted.EXECUTED.append(("look_up", account))
    return f"{account}: fine"


async def only_big(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
    return bool(params.get("amount", 0) > 1000)


@function_tool(needs_approval=only_big)
def pay(account: str, amount: int) -> str:
    """Pay an account (its own rule: a person looks at amounts above 1000)."""
    scripted.EXECUTED.append(("pay", (account, amount)))
    return "paid"


def looked_up(settings: Any, tool: Any, arguments: dict[str, Any]) -> AgentRun:
    model = ScriptedModel(
        [
            [function_call(tool.name, arguments, call_id="call_g")],
            [assistant_message(REPLY, item_id="msg_g")],
        ]
    )
    name = scripted.install(settings, Agent(name="Desk", model=model, tools=[tool]))
    owner = make_user(username="alice", email="alice@example.com")
    conversation = make_conversation(owner=owner, agent_name=name)
    run = runs.start_run(conversation, "go", owner)
    asyncio.run(runs.execute(run.pk))
    return AgentRun.objects.get(pk=run.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_an_ask_rule_stops_a_tool_that_needs_no_approval_of_its_own(settings: Any) -> None:
    # No rule: the tool runs at once, as its author wants.
    run = looked_up(settings, look_up, {"account": "acme"})
    assert run.status == RunStatus.COMPLETED and not run.approval_requests.exists()
    assert scripted.EXECUTED == [("look_up", "acme")]

    # A rule added now (in this process: at once) sends the next call to a person.
    rule("ask before look-ups of acme", PolicyAction.ASK, ("account", "==", "acme"), tool="look_up")
    run = looked_up(settings, look_up, {"account": "acme"})
    request = run.approval_requests.get()
    assert run.status == RunStatus.WAITING and request.is_pending
    assert request.verdict["policy_name"] == "ask before look-ups of acme"
    assert scripted.EXECUTED == [("look_up", "acme")]  # not again
    runs.decide(request, make_reviewer(), runs.Decision.approve())
    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert scripted.EXECUTED == [("look_up", "acme")] * 2

    # Another account: the rule does not match, the tool runs without a person.
    run = looked_up(settings, look_up, {"account": "zeta"})
    assert run.status == RunStatus.COMPLETED and not run.approval_requests.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_reject_rule_stops_a_tool_that_needs_no_approval_and_decides_it(settings: Any) -> None:
    rule("never look up", PolicyAction.REJECT, tool="look_up", message="Not allowed here.")
    run = looked_up(settings, look_up, {"account": "acme"})
    request = run.approval_requests.get()
    assert request.status == ApprovalStatus.REJECTED and run.status == RunStatus.RESUMING
    assert request.decisions.get().policy_name == "never look up"
    asyncio.run(runs.resume(run.pk))
    assert scripted.EXECUTED == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_the_gate_asks_the_tools_own_callable_first_then_the_rules(settings: Any) -> None:
    outside = rule("ask outside", PolicyAction.ASK, tool="pay")
    PolicyCondition.objects.create(
        policy=outside, argument="account", operator="!=", compare_to="user.username"
    )
    # Her own account, small: neither the tool nor a rule wants a person.
    run = looked_up(settings, pay, {"account": "alice", "amount": 5})
    assert run.status == RunStatus.COMPLETED and not run.approval_requests.exists()
    # Someone else's: the rule asks.
    run = looked_up(settings, pay, {"account": "mallory", "amount": 5})
    assert run.approval_requests.get().verdict["policy_name"] == "ask outside"
    # Big: the tool's own callable asks, and the pause's rules say what they say of it.
    run = looked_up(settings, pay, {"account": "alice", "amount": 5000})
    assert run.approval_requests.get().verdict["action"] == "ask"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry", "submitted")
def test_a_gate_that_cannot_read_the_rules_pauses_the_call(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down() -> Any:
        raise ConnectionError("database gone")

    policies.forget_rules()
    monkeypatch.setattr(policies, "cached_rules_sync", down)
    monkeypatch.setattr(policies, "load_rules", down)
    run = looked_up(settings, look_up, {"account": "acme"})
    request = run.approval_requests.get()
    assert request.is_pending and request.verdict["failed"] is True
    assert scripted.EXECUTED == []


@pytest.mark.django_db
@pytest.mark.usefixtures("fresh_registry")
def test_the_gate_keeps_the_fingerprint_and_leaves_other_runs_alone(settings: Any) -> None:
    from agents import Runner

    model = ScriptedModel(
        [[function_call("look_up", {"account": "acme"}, call_id="c1")], [assistant_message(REPLY)]]
    )
    agent = Agent(name="Desk", model=model, tools=[look_up])
    before = registry.fingerprint(agent)
    policies.guard(agent, policies.load_rules())
    assert look_up.needs_approval is False  # no rule is about it: no gate
    rule("approve look-ups", PolicyAction.APPROVE, tool="look_up")
    policies.guard(agent, policies.load_rules())
    assert look_up.needs_approval is False  # an approving rule stops nothing
    rule("ask every look-up", PolicyAction.ASK, tool="look_up")
    policies.guard(agent, policies.load_rules())
    policies.guard(agent, policies.load_rules())  # once
    assert isinstance(look_up.needs_approval, policies.Gate)
    assert look_up.needs_approval.own is False
    assert registry.fingerprint(agent) == before
    # A run that is not agentsite's (no RunContext): the tool's own setting alone.
    result = asyncio.run(Runner.run(agent, "go"))
    assert result.final_output == REPLY and not result.interruptions
    # The rules gone, the gate goes too.
    ApprovalPolicy.objects.all().delete()
    policies.guard(agent, policies.load_rules())
    assert look_up.needs_approval is False
