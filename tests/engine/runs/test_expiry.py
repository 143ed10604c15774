"""What happens when nobody decides in time (`engine/runs/expiry.py`), per tool
(`registry.review`) and per approval policy rule: reject, escalate (a second group is told, the
request waits once more, then it is rejected), or approve (only where the tool's author allows
it). A reminder goes out once before the deadline. Time moves by setting `expires_at` in the
past, as the sweep's other tests do."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from django.contrib.auth.models import Group
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.forms import PolicyForm
from approvals.models import (
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    ExpiryAction,
    PolicyAction,
)
from approvals.views import render_row
from engine import events, registry, runs, signals
from engine.models import AgentRun, RunStatus
from engine.runs import decisions
from tests import scripted
from tests.factories import make_request, make_reviewer
from webhooks import outbox
from webhooks.models import WebhookDelivery, WebhookEndpoint

REPLY = "Done."
engine_test = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry"),
]


def wire_tool(**review: Any) -> Any:
    """A fresh `wire_money` tool (its own object, so its declarations are its own)."""

    @function_tool(needs_approval=True, name_override="wire_money")
    def wire_money(account: str, amount: int) -> str:
        """Send money."""
        scripted.EXECUTED.append(("wire_money", (account, amount)))
        return f"sent {amount} to {account}"

    if review:
        registry.review(wire_money, risk="high", **review)
    return wire_money


class Paused:
    def __init__(self, run: AgentRun, model: ScriptedModel) -> None:
        self.run = run
        self.model = model

    @property
    def request(self) -> ApprovalRequest:
        return ApprovalRequest.objects.get(run=self.run)

    def overdue(self) -> None:
        """Its deadline passes."""
        ApprovalRequest.objects.filter(run=self.run).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )

    def resume(self) -> AgentRun:
        asyncio.run(runs.resume(self.run.pk))
        return AgentRun.objects.get(pk=self.run.pk)

    def model_read(self) -> str:
        last = self.model.last_call
        return str(last.input if last is not None else "")


def paused(settings: Any, tool: Any) -> Paused:
    """alice's run, whose model calls `tool` once, then replies: run to its pause."""
    model = ScriptedModel(
        [
            [function_call("wire_money", {"account": "acme", "amount": 50}, call_id="call_0")],
            [assistant_message(REPLY, item_id="msg_1")],
        ]
    )
    agent = Agent(name="Wire", model=model, tools=[tool])
    run = scripted.executed(scripted.start(settings, agent, "send money"))
    assert run.status == RunStatus.WAITING
    return Paused(run, model)


@pytest.fixture
def escalated() -> Iterator[list[tuple[int, str]]]:
    """(request id, group) of each `approval_escalated` sent, and it was sent in a
    transaction (its receivers are an outbox)."""
    seen: list[tuple[int, str]] = []
    lock = threading.Lock()

    def receiver(sender: Any, request: ApprovalRequest, group_name: str, **_: Any) -> None:
        with lock:
            seen.append((request.pk, group_name))

    signals.approval_escalated.connect(receiver, dispatch_uid="test-escalated")
    yield seen
    signals.approval_escalated.disconnect(dispatch_uid="test-escalated")


@pytest.fixture
def reminded() -> Iterator[list[int]]:
    seen: list[int] = []
    lock = threading.Lock()

    def receiver(sender: Any, request: ApprovalRequest, **_: Any) -> None:
        with lock:
            seen.append(request.pk)

    signals.approval_reminder.connect(receiver, dispatch_uid="test-reminder")
    yield seen
    signals.approval_reminder.disconnect(dispatch_uid="test-reminder")


# --- the Done-when line ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_it_escalates_at_the_deadline_waits_once_more_then_rejects_and_resumes(
    settings: Any,
    submitted: list[Any],
    escalated: list[tuple[int, str]],
    published: list[Any],
    client: Client,
) -> None:
    settings.AGENTSITE_ESCALATION_SECONDS = 3600
    Group.objects.create(name="Supervisors")
    scene = paused(settings, wire_tool(on_expiry="escalate", escalate_to="Supervisors"))
    request = scene.request
    assert (request.on_expiry, request.escalate_to) == (ExpiryAction.ESCALATE, "Supervisors")

    scene.overdue()
    assert runs.expire_overdue() == 1
    # The second group is told, and the request waits once more with a later deadline.
    assert escalated == [(request.pk, "Supervisors")]
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING and request.is_escalated
    assert request.expires_at > timezone.now() + timedelta(minutes=59)
    assert AgentRun.objects.get(pk=scene.run.pk).status == RunStatus.WAITING
    assert not ApprovalDecision.objects.filter(request=request).exists()
    assert ("resume", scene.run.pk) not in submitted
    # Open pages re-render it in place (an inbox swaps its row by id: no second row).
    [told] = [e for e in published if isinstance(e, events.ApprovalDecided)]
    assert (told.request_id, told.status, told.decided_by) == (request.pk, "pending", None)
    rita = make_reviewer()
    row = render_row(request, oob="true", back="/inbox/", user=rita)
    assert f'id="request-{request.pk}"' in row and "escalated to Supervisors" in row
    # Another sweep before the new deadline does nothing.
    assert runs.expire_overdue() == 0

    # The user reads who it went to and until when; the inbox shows it escalated.
    client.force_login(AgentRun.objects.get(pk=scene.run.pk).conversation.owner)
    chat = client.get(f"/chats/{scene.run.conversation.session_id}/").content.decode()
    assert "escalated to Supervisors, waiting until" in chat
    client.force_login(rita)
    inbox = client.get(reverse("inbox")).content.decode()
    assert "data-escalated" in inbox and "escalated to Supervisors" in inbox
    page = client.get(reverse("inbox_request", args=[request.pk])).content.decode()
    assert "escalated to Supervisors" in page and "waiting for you" in page

    # At the second deadline it is rejected as before, once; the run resumes.
    scene.overdue()
    assert runs.expire_overdue() == 1
    assert runs.expire_overdue() == 0
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.reviewer, decision.approved, decision.kind) == (None, False, "expired")
    assert "Escalated to Supervisors" in decision.note
    assert escalated == [(request.pk, "Supervisors")]  # told once
    assert submitted.count(("resume", scene.run.pk)) == 1
    assert scene.resume().status == RunStatus.COMPLETED
    assert scripted.EXECUTED == []
    assert "nobody decided within" in scene.model_read()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_with_reject_it_fails_closed_as_today(
    settings: Any, submitted: list[Any], escalated: list[tuple[int, str]]
) -> None:
    scene = paused(settings, wire_tool())  # nothing declared: reject
    assert scene.request.on_expiry == ExpiryAction.REJECT
    scene.overdue()
    assert runs.expire_overdue() == 1
    request = scene.request
    assert request.status == ApprovalStatus.EXPIRED and not request.is_escalated
    assert escalated == []
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.approved, decision.kind, decision.note) == (False, "expired", "")
    assert scene.resume().status == RunStatus.COMPLETED
    assert scripted.EXECUTED == []
    assert "so the request expired" in scene.model_read()


# --- approve on expiry ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_approve_on_expiry_runs_the_tool_once_where_its_author_allows_it(
    settings: Any, submitted: list[Any], client: Client
) -> None:
    scene = paused(settings, wire_tool(on_expiry="approve"))
    scene.overdue()
    assert runs.expire_overdue() == 1
    assert runs.expire_overdue() == 0
    request = scene.request
    assert request.status == ApprovalStatus.APPROVED and request.decided_by is None
    assert request.approved_on_expiry and request.decider_display() == "the expiry policy"
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.reviewer, decision.approved) == (None, True)
    assert decision.kind == DecisionKind.EXPIRY_APPROVED and not decision.by_policy
    assert "nobody decided within" in decision.note and "the tool allows it" in decision.note
    assert scene.resume().status == RunStatus.COMPLETED
    assert scripted.EXECUTED == [("wire_money", ("acme", 50))]  # once
    assert "sent 50 to acme" in scene.model_read()

    client.force_login(make_reviewer())
    history = client.get(reverse("inbox_history")).content.decode()
    assert "Approved on expiry" in history
    page = client.get(reverse("inbox_request", args=[request.pk])).content.decode()
    assert "data-expiry-approved" in page
    # A late reviewer reads who decided.
    with pytest.raises(runs.AlreadyDecided, match="Already approved by the expiry policy"):
        runs.decide(request, make_reviewer("bob"), runs.Decision.reject())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_a_rule_that_approves_on_expiry_a_tool_that_does_not_allow_it_rejects_and_says_so(
    settings: Any, submitted: list[Any]
) -> None:
    ApprovalPolicy.objects.create(
        name="wires ask", action=PolicyAction.ASK, tool_name="wire_money", on_expiry="approve"
    )
    scene = paused(settings, wire_tool())
    request = scene.request
    assert request.on_expiry == ExpiryAction.REJECT
    assert "does not allow" in request.expiry_note and "wires ask" in request.expiry_note
    scene.overdue()
    assert runs.expire_overdue() == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED
    decision = ApprovalDecision.objects.get(request=request)
    assert not decision.approved and "does not allow" in decision.note
    assert scene.resume().status == RunStatus.COMPLETED
    assert scripted.EXECUTED == []


def test_review_refuses_an_expiry_policy_it_cannot_keep() -> None:
    with pytest.raises(ValueError, match="escalate_to"):
        wire_tool(on_expiry="escalate")
    with pytest.raises(ValueError, match="expiry_approval=False"):
        wire_tool(on_expiry="approve", expiry_approval=False)
    with pytest.raises(ValueError, match="on_expiry"):
        wire_tool(on_expiry="ignore")
    tool = wire_tool(on_expiry="reject", expiry_approval=True)
    assert registry.declared_review(tool).expiry_approval


# --- a rule's expiry policy ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_a_rules_expiry_policy_is_recorded_at_the_pause_and_a_later_edit_changes_nothing(
    settings: Any, submitted: list[Any], escalated: list[tuple[int, str]]
) -> None:
    Group.objects.create(name="Treasury")
    rule = ApprovalPolicy.objects.create(
        name="wires ask",
        action=PolicyAction.ASK,
        tool_name="wire_money",
        on_expiry="escalate",
        escalate_to="Treasury",
    )
    # The rule wins over the tool's own (reject by default).
    scene = paused(settings, wire_tool(on_expiry="reject"))
    request = scene.request
    assert (request.on_expiry, request.escalate_to) == ("escalate", "Treasury")
    assert request.verdict["on_expiry"] == "escalate"

    rule.on_expiry, rule.escalate_to = "reject", ""
    rule.save()
    scene.overdue()
    assert runs.expire_overdue() == 1
    assert escalated == [(request.pk, "Treasury")]
    assert scene.request.status == ApprovalStatus.PENDING


@pytest.mark.django_db
def test_the_policy_form_checks_the_group_to_escalate_to() -> None:
    base = {"name": "r", "priority": 1, "action": "ask", "tool_name": "issue_refund"}
    form = PolicyForm(data={**base, "on_expiry": "escalate", "escalate_to": ""})
    assert not form.is_valid() and "Name the group" in str(form.errors["escalate_to"])
    form = PolicyForm(data={**base, "on_expiry": "escalate", "escalate_to": "Nobody"})
    assert not form.is_valid() and "no group called" in str(form.errors["escalate_to"])
    form = PolicyForm(data={**base, "action": "reject", "on_expiry": "escalate"})
    assert not form.is_valid() and "on_expiry" in form.errors
    Group.objects.create(name="Supervisors")
    form = PolicyForm(data={**base, "on_expiry": "escalate", "escalate_to": " Supervisors "})
    assert form.is_valid(), form.errors
    assert form.save().escalate_to == "Supervisors"


# --- races ---------------------------------------------------------------------------------


def overdue_escalating(**kwargs: Any) -> ApprovalRequest:
    kwargs.setdefault("on_expiry", ExpiryAction.ESCALATE)
    kwargs.setdefault("escalate_to", "Supervisors")
    return make_request(expires_at=timezone.now() - timedelta(seconds=1), **kwargs)


def at_once(*work: Any) -> list[BaseException | None]:
    """Run each callable on its own thread (its own connection), all starting together;
    what each raised (None: nothing)."""
    barrier = threading.Barrier(len(work))
    raised: list[BaseException | None] = [None] * len(work)

    def worker(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            work[index]()
        except BaseException as error:
            raised[index] = error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    return raised


@pytest.mark.django_db(transaction=True)
def test_sweeps_racing_escalate_each_request_once(
    submitted: list[Any], escalated: list[tuple[int, str]]
) -> None:
    requests = [overdue_escalating() for _ in range(4)]
    raised = at_once(*[runs.expire_overdue for _ in range(4)])
    assert raised == [None] * 4
    assert sorted(escalated) == sorted((r.pk, "Supervisors") for r in requests)
    for request in requests:
        request.refresh_from_db()
        assert request.is_pending and request.is_escalated
        assert request.expires_at > timezone.now()
    assert not ApprovalDecision.objects.exists() and submitted == []


@pytest.mark.django_db(transaction=True)
def test_a_reviewers_decision_racing_the_escalation_is_safe(
    submitted: list[Any], escalated: list[tuple[int, str]]
) -> None:
    rita = make_reviewer()
    request = overdue_escalating()
    # Overdue and not escalated yet: a reviewer is told it is on its way to the group.
    with pytest.raises(runs.RequestExpired, match="being escalated to Supervisors"):
        runs.decide(request, rita, runs.Decision.approve())

    [swept, decided] = at_once(
        runs.expire_overdue, lambda: runs.decide(request, rita, runs.Decision.approve())
    )
    assert swept is None
    assert escalated == [(request.pk, "Supervisors")]  # escalated once, whoever went first
    request.refresh_from_db()
    decisions = list(ApprovalDecision.objects.filter(request=request))
    if decided is None:  # after the escalation: open again, and hers
        assert request.status == ApprovalStatus.APPROVED and len(decisions) == 1
        assert submitted == [("resume", request.run_id)]
    else:  # before it: refused, and it waits for the group
        assert isinstance(decided, runs.RequestExpired)
        assert request.is_pending and decisions == []
        runs.decide(request, rita, runs.Decision.approve())  # escalated: open again
        assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED

    # At the second deadline the sweep and a late reviewer race: one decision, whoever wins.
    other = overdue_escalating()
    assert runs.expire_overdue() == 1
    ApprovalRequest.objects.filter(pk=other.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    [swept, decided] = at_once(
        runs.expire_overdue, lambda: runs.decide(other, rita, runs.Decision.approve())
    )
    assert swept is None and isinstance(decided, runs.RequestExpired)
    assert ApprovalDecision.objects.filter(request=other).count() == 1
    assert ApprovalRequest.objects.get(pk=other.pk).status == ApprovalStatus.EXPIRED


@pytest.mark.django_db
def test_a_decision_that_found_the_request_overdue_while_the_sweep_escalated_it_says_so() -> None:
    """The sweep reads the clock, then escalates; the reviewer's decision reads the clock
    after it, but its update reads the row before the sweep commits: the update finds it
    overdue, and the request read back is open again, escalated before the decision's
    `now`. The full suite on PostgreSQL once said "This request was pending" here."""
    now = timezone.now()
    request = overdue_escalating()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        escalated_at=now - timedelta(milliseconds=5), expires_at=now + timedelta(hours=1)
    )
    with pytest.raises(runs.RequestExpired, match="escalated to Supervisors just now"):
        decisions._refuse(request.pk, now)


@pytest.mark.django_db(transaction=True)
def test_an_escalation_is_announced_to_webhook_endpoints_that_want_it(
    submitted: list[Any],
) -> None:
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hook", events=["approval.escalated"])
    outbox.forget_subscribed()
    request = overdue_escalating()
    assert runs.expire_overdue() == 1
    delivery = WebhookDelivery.objects.get()
    assert delivery.event_type == "approval.escalated"
    assert delivery.payload["data"]["group"] == "Supervisors"
    assert delivery.payload["data"]["request"]["id"] == request.pk


# --- reminders ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_reminder_goes_out_once_before_the_deadline(
    settings: Any, submitted: list[Any], reminded: list[int]
) -> None:
    settings.AGENTSITE_APPROVAL_REMINDER_SECONDS = 3600
    soon = make_request(expires_at=timezone.now() + timedelta(minutes=30))
    later = make_request(expires_at=timezone.now() + timedelta(hours=5))
    assert runs.expire_overdue() == 0
    assert reminded == [soon.pk]
    [first, second] = at_once(runs.send_reminders, runs.send_reminders)
    assert (first, second) == (None, None)
    runs.expire_overdue()
    assert reminded == [soon.pk]  # once
    soon.refresh_from_db()
    later.refresh_from_db()
    assert soon.reminded_at is not None and later.reminded_at is None

    settings.AGENTSITE_APPROVAL_REMINDER_SECONDS = 0  # off
    ApprovalRequest.objects.filter(pk=later.pk).update(
        expires_at=timezone.now() + timedelta(minutes=1)
    )
    assert runs.send_reminders() == 0 and reminded == [soon.pk]


@pytest.mark.django_db
def test_a_decision_that_lost_to_the_escalation_says_so() -> None:
    """The order of the race the test above cannot force: the reviewer's decision began while
    the request was overdue (`now`), and the sweep escalated it before her UPDATE (on
    PostgreSQL her refusal then reads the escalated row: pending, open again). She is told it
    was escalated and waits again, not "This request was pending; it can no longer be
    decided" (seen in a fresh-clone CI run on PostgreSQL)."""
    began = timezone.now()
    request = overdue_escalating()
    ApprovalRequest.objects.filter(pk=request.pk).update(
        escalated_at=began + timedelta(milliseconds=5), expires_at=began + timedelta(days=1)
    )
    request.refresh_from_db()
    refusal = runs.closed_reason(request, began)
    assert isinstance(refusal, runs.RequestExpired)
    assert "escalated to Supervisors just now; it waits again until" in str(refusal)
    # Escalated before her decision began: open, nothing to refuse.
    assert runs.closed_reason(request, began + timedelta(seconds=1)) is None
