"""Conversations as sessions, for operators (`tracing/session_views.py`): one conversation's
turns in order with their approvals, tokens, cost, times, outcome and feedback, totals at the
top; the list of conversations; who may see them; bounded queries."""

from __future__ import annotations

import re
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from conversations.models import Conversation, TurnUsage
from engine.models import AgentRun, RunStatus
from tests.agentsite.test_csp import inline_code
from tests.factories import (
    T0,
    make_conversation,
    make_decision,
    make_request,
    make_reviewer,
    make_run,
    make_span,
    make_staff,
    make_trace,
    make_user,
    make_viewer,
)
from tracing import pricing, session_views
from tracing.models import Feedback, ModelPrice, Span, Trace, TraceOutcome

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
CARD = "4111 1111 1111 1111"


def price(model: str = "gpt-test") -> ModelPrice:
    # $1 a million input tokens, $2 a million output tokens.
    return ModelPrice.objects.create(
        model=model,
        input_per_million=Decimal("1"),
        output_per_million=Decimal("2"),
        valid_from=date(2026, 1, 1),
    )


def turn(
    conversation: Conversation,
    text: str,
    *,
    at: Any,
    status: str = RunStatus.COMPLETED,
    reply: str = "",
    error: str = "",
    model: str = "gpt-test",
    tokens: tuple[int, int] = (100, 20),
    active: float = 1.0,
    seconds: float = 2.0,
    outcome: str = TraceOutcome.COMPLETED,
    reason: str = "",
    tools: tuple[str, ...] = (),
) -> Any:
    """A run of `conversation` with its trace: one generation (`tokens` in and out) and a
    function span per tool, `seconds` long of which `active` were working."""
    run = make_run(
        conversation=conversation,
        input=text,
        status=status,
        final_output=reply,
        error=error,
        pause_count=0,
        trace_id=f"trace_{conversation.pk:08x}{at.timestamp():024.0f}",
        finished=at + timedelta(seconds=seconds),
    )
    type(run).objects.filter(pk=run.pk).update(created=at)
    run.refresh_from_db()
    trace = make_trace(
        trace_id=run.trace_id,
        group_id=conversation.session_id,
        run=run,
        started_at=at,
        ended_at=at + timedelta(seconds=seconds),
        total_tokens=sum(tokens),
        active_seconds=active,
        outcome=outcome,
        outcome_reason=reason,
    )
    root = make_span(trace, "task", "task", start=0, end=active)
    spans = [
        root,
        make_span(
            trace,
            "generation",
            "generation",
            parent=root,
            model=model,
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            total_tokens=sum(tokens),
        ),
    ]
    spans += [make_span(trace, "function", name, parent=root, start=0.2) for name in tools]
    Span.objects.bulk_create(spans)
    return run


@pytest.fixture
def three_turns() -> dict[str, Any]:
    """alice's three turns with the support desk: a plain reply; a cancellation that rita
    approved after five minutes; a failure on a model nobody priced."""
    price()
    alice = make_user(username="alice")
    rita = make_reviewer()
    conversation = make_conversation(owner=alice, agent_name="support", title="Order help")
    first = turn(conversation, "hello", at=T0, reply="Hi! How can I help?", active=1.5)
    second = turn(
        conversation,
        f"cancel order 42, my card is {CARD}",
        at=T0 + timedelta(minutes=1),
        reply="Order 42 is cancelled.",
        tokens=(200, 30),
        active=3.0,
        seconds=303.0,
        outcome=TraceOutcome.APPROVED,
        reason="cancel_order: approved by rita",
        tools=("lookup_order", "cancel_order"),
    )
    second.pause_count = 1
    second.save(update_fields=["pause_count"])
    asked = T0 + timedelta(minutes=1, seconds=1)
    request = make_request(
        run=second,
        pause=1,
        tool_name="cancel_order",
        arguments={"order_id": 42},
        created=asked,
        status=ApprovalStatus.APPROVED,
        decided_by=rita,
        decided_at=asked + timedelta(minutes=5),
    )
    decision = make_decision(request=request, reviewer=rita, kind=DecisionKind.APPROVED)
    ApprovalDecision.objects.filter(pk=decision.pk).update(created=asked + timedelta(minutes=5))
    third = turn(
        conversation,
        "and order 44?",
        at=T0 + timedelta(minutes=7),
        status=RunStatus.FAILED,
        error="The model provider timed out.",
        model="mystery-model",
        tokens=(50, 0),
        active=0.8,
        seconds=1.0,
        outcome=TraceOutcome.FAILED,
        reason="The model provider timed out.",
    )
    Feedback.objects.create(run=first, user=alice, score=1)
    Feedback.objects.create(run=second, user=alice, score=-1, comment=f"charged {CARD} {XSS}")
    return {"conversation": conversation, "runs": [first, second, third], "alice": alice}


def olga() -> Client:
    client = Client()
    client.force_login(make_viewer())
    return client


def page_of(conversation: Conversation, client: Client | None = None) -> str:
    client = client or olga()
    response = client.get(reverse("trace_conversation", args=[conversation.session_id]))
    assert response.status_code == 200
    return response.content.decode()


def text_of(html: str, attribute: str) -> list[str]:
    """The text of each element carrying `attribute`, tags stripped, spaces collapsed."""
    found = re.findall(rf'<(\w+)[^>]*\s{attribute}(?:="[^"]*")?[^>]*>(.*?)</\1>', html, re.S)
    texts = [" ".join(re.sub(r"<[^>]+>", " ", inner).split()) for _, inner in found]
    return [re.sub(r" ([;,])", r"\1", text) for text in texts]


def total(html: str, name: str) -> str:
    return text_of(html, f'data-total="{name}"')[0]


# --- the done-when --------------------------------------------------------------------------


def test_it_shows_the_three_turns_the_approvals_wait_and_the_totals(
    three_turns: dict[str, Any],
) -> None:
    html = page_of(three_turns["conversation"])

    assert [int(n) for n in re.findall(r'id="turn-(\d+)"', html)] == [1, 2, 3]
    runs = three_turns["runs"]
    assert re.findall(r'data-run="(\d+)"', html) == [str(run.pk) for run in runs]
    assert text_of(html, "data-input") == [
        "hello",
        "cancel order 42, my card is [card]",
        "and order 44?",
    ]
    assert CARD not in html  # masked, in the input and in the comment
    assert text_of(html, "data-reply") == ["Hi! How can I help?", "Order 42 is cancelled."]
    assert text_of(html, "data-failure") == ["The model provider timed out."]

    # The approval: rita approved cancel_order five minutes after it was asked for.
    assert text_of(html, 'data-approval="cancel_order"') == [
        "cancel_order(order_id=42) Approved rita 5 min 00 s"
    ]
    assert text_of(html, "data-waited") == ["5 min 00 s"]
    assert text_of(html, 'data-tool="cancel_order"') == ["cancel_order needed approval"]
    assert text_of(html, 'data-tool="lookup_order"') == ["lookup_order"]

    # Per turn: tokens, cost (tokens × price; none for the unpriced model), times, outcome.
    assert text_of(html, "data-tokens") == ["120", "230", "50"]
    assert text_of(html, "data-cost") == [
        "$0.000140",
        "$0.000260",
        "no price for mystery-model",
    ]
    assert text_of(html, "data-active") == ["1.50 s", "3.00 s", "800 ms"]
    assert text_of(html, "data-waiting") == ["500 ms", "5 min 00 s", "200 ms"]
    assert re.findall(r'class="outcome[^"]*" data-outcome="(\w+)"', html) == [
        "completed",
        "approved",
        "failed",
    ]
    assert "cancel_order: approved by rita" in html
    # Feedback: alice's thumbs up and her masked, escaped thumbs down.
    assert re.findall(r'<li data-score="(-?1)">', html) == ["1", "-1"]
    assert XSS not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html

    # The totals.
    assert total(html, "user") == "alice"
    assert total(html, "agent") == "support"
    assert total(html, "turns") == "3"
    assert total(html, "tokens") == "400"
    assert total(html, "cost") == "$0.000400; no price for mystery-model"
    assert total(html, "active") == "5.30 s"  # 1.5 + 3 + 0.8
    assert total(html, "waiting") == "5 min 01 s"  # 0.5 + 300 + 0.2
    assert total(html, "approvals") == "1"
    assert total(html, "errors") == "1"
    assert total(html, "feedback") == "thumbs up 1 · thumbs down 1"
    assert total(html, "first") == "2026-11-30 09:00:00"
    assert total(html, "last") == "2026-11-30 09:07:01"  # the failure ended a second after 9:07
    # Each turn links to its trace.
    for run in runs:
        assert f'href="/traces/{run.trace_id}/"' in html


def test_its_cost_equals_the_pricing_modules(three_turns: dict[str, Any]) -> None:
    conversation = three_turns["conversation"]
    cost = pricing.total_cost(Span.objects.filter(trace__group_id=conversation.session_id))
    assert cost.amount() == Decimal("0.000400")
    assert cost.missing == ["mystery-model"]


def test_it_says_how_long_a_pending_request_has_been_waiting() -> None:
    conversation = make_conversation(owner=make_user())
    run = make_run(conversation=conversation, input="cancel order 42", trace_id="trace_" + "a" * 32)
    make_request(run=run, created=T0)
    turns, totals = session_views.conversation_turns(
        conversation, price_links=False, now=T0 + timedelta(minutes=5, seconds=10)
    )
    [approval] = turns[0].approvals
    assert approval.pending and approval.waited == "waiting for 5 min"
    assert approval.decision == "waiting" and approval.who == ""
    assert totals.approvals == 1 and totals.pending == 1
    # No trace row yet: its outcome is read from the run's status.
    assert turns[0].outcome == TraceOutcome.WAITING and turns[0].cost.calls == 0


def test_a_rejections_reason_is_shown_masked_and_an_escalation_named() -> None:
    conversation = make_conversation(owner=make_user())
    run = make_run(conversation=conversation, status=RunStatus.COMPLETED)
    rejected = make_request(
        run=run, status=ApprovalStatus.REJECTED, escalate_to="leads", escalated_at=T0
    )
    make_decision(
        request=rejected,
        approved=False,
        kind=DecisionKind.REJECTED,
        message=f"Not for card {CARD}",
        note="internal: never shown",
    )
    html = page_of(conversation)
    assert text_of(html, "data-message") == ["Not for card [card]"]
    assert "escalated to leads" in html
    assert "internal: never shown" not in html


def test_it_names_policies_the_expiry_and_withdrawals_as_deciders() -> None:
    user = make_user()
    conversation = make_conversation(owner=user)
    run = make_run(conversation=conversation, status=RunStatus.COMPLETED)
    by_policy = make_request(run=run, status=ApprovalStatus.APPROVED)
    make_decision(request=by_policy, reviewer=None, policy_name="small refunds")
    expired = make_request(run=run, status=ApprovalStatus.EXPIRED)
    make_decision(request=expired, reviewer=None, approved=False, kind=DecisionKind.EXPIRED)
    withdrawn = make_request(run=run, status=ApprovalStatus.WITHDRAWN)
    make_decision(
        request=withdrawn, reviewer=user, approved=False, withdrawn=True, kind="withdrawn"
    )
    turns, _ = session_views.conversation_turns(conversation, price_links=False)
    assert [(a.decision, a.who) for a in turns[0].approvals] == [
        ("Approved", "policy small refunds"),
        ("Expired", "the expiry"),
        ("Withdrawn", f"{user.username} (withdrew it)"),
    ]


def test_an_unpriced_model_is_linked_to_the_price_form_only_for_who_may_add_prices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cost = pricing.Cost(unpriced={"mystery-model": 50}, calls=1)
    monkeypatch.setattr(pricing, "add_price_url", lambda model: f"/add?model={model}")
    assert pricing.shown(cost, links=True).missing == [
        ("mystery-model", "/add?model=mystery-model")
    ]
    assert pricing.shown(cost, links=False).missing == [("mystery-model", "")]
    assert str(pricing.shown(cost, links=False)) == "no price for mystery-model"
    # Never 0 for what nobody priced, and "—" when there was nothing to price.
    assert "$0.00" not in str(pricing.shown(cost, links=False))
    assert str(pricing.shown(pricing.Cost(), links=False)) == "—"
    viewer, staff = make_viewer(), make_staff()
    assert not pricing.may_add_prices(viewer)
    assert not pricing.may_add_prices(staff)  # staff, but without the permission
    from tests.factories import grant

    assert pricing.may_add_prices(grant(staff, "tracing.add_modelprice"))


def test_it_reads_the_same_number_of_queries_for_3_turns_as_for_12() -> None:
    price()

    def conversation_of(turns: int) -> Conversation:
        conversation = make_conversation(owner=make_user())
        for n in range(turns):
            run = turn(
                conversation, f"message {n}", at=T0 + timedelta(minutes=n), tools=("lookup",)
            )
            make_decision(request=make_request(run=run, status=ApprovalStatus.APPROVED))
            Feedback.objects.create(run=run, user=conversation.owner, score=1)
        return conversation

    small, large = conversation_of(3), conversation_of(12)
    client = olga()
    counts = []
    for conversation in (small, large):
        with CaptureQueriesContext(connection) as queries:
            html = page_of(conversation, client)
        counts.append(len(queries))
        assert (
            html.count('class="panel turn-card')
            == Conversation.objects.get(pk=conversation.pk).runs.count()
        )
    assert counts[0] == counts[1], counts
    # The session and the user, two permission checks, the conversation, then the turns:
    # runs (with their versions), the session's usage of their turns, traces, requests,
    # decisions, tool spans, prices, usage, feedback.
    assert counts[0] <= 14, counts


def stored_usage(run: Any, branch: str, number: int, tokens: tuple[int, int]) -> None:
    """What the session stored for the turn `number` of `branch`, by `run`."""
    TurnUsage.objects.create(
        conversation=run.conversation,
        branch=branch,
        turn=number,
        run=run,
        requests=2,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        total_tokens=sum(tokens),
        input_tokens_details={"cached_tokens": 40, "cache_write_tokens": 0},
        output_tokens_details={"reasoning_tokens": 7},
    )


def test_each_turns_session_tokens_and_an_edited_conversations_versions_are_shown() -> None:
    price()
    conversation = make_conversation(owner=make_user(), current_branch="edit-1")
    first = turn(conversation, "hello", at=T0)
    second = turn(conversation, "where is order 7", at=T0 + timedelta(minutes=1))
    edited = turn(conversation, "where is order 8", at=T0 + timedelta(minutes=2))
    AgentRun.objects.filter(pk=edited.pk).update(branch="edit-1")
    stored_usage(first, "main", 1, (100, 20))
    stored_usage(second, "main", 2, (300, 30))
    stored_usage(edited, "edit-1", 2, (310, 31))

    html = page_of(conversation)

    assert text_of(html, "data-turn-version") == [
        "Original, message 1",
        "Original, message 2",
        "Edit 1, message 2",
    ]
    assert text_of(html, "data-input-tokens") == [
        "100 (40 cached)",
        "300 (40 cached)",
        "310 (40 cached)",
    ]
    assert text_of(html, "data-output-tokens")[2] == "31 (7 reasoning)"
    assert text_of(html, "data-requests") == ["2", "2", "2"]
    assert text_of(html, "data-version-tokens") == ["450", "341"]
    assert "shown to the user" in text_of(html, 'data-version="edit-1"')[0]


def test_a_conversation_never_edited_shows_no_versions_but_its_turns_tokens() -> None:
    conversation = make_conversation(owner=make_user())
    stored_usage(turn(conversation, "hello", at=T0), "main", 1, (100, 20))
    html = page_of(conversation)
    assert 'data-testid="versions"' not in html and "data-turn-version" not in html
    assert text_of(html, "data-input-tokens") == ["100 (40 cached)"]


# --- the page is safe -----------------------------------------------------------------------


def test_what_people_and_models_wrote_is_escaped_and_there_is_no_inline_code() -> None:
    conversation = make_conversation(owner=make_user(), title=XSS)
    turn(conversation, XSS, at=T0, reply=XSS, tools=(XSS,))
    html = page_of(conversation)
    assert XSS not in html
    assert inline_code(html) == []
    html = olga().get(reverse("trace_conversations")).content.decode()
    assert XSS not in html and inline_code(html) == []


# --- who may see them -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["trace_conversations", "trace_conversation"])
def test_only_operators_see_conversations(name: str) -> None:
    conversation = make_conversation(owner=make_user())
    make_run(conversation=conversation)
    url = reverse(name, args=[conversation.session_id] if name == "trace_conversation" else [])

    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")

    client = Client()
    client.force_login(conversation.owner)  # her own conversation, but she is no operator
    assert client.get(url).status_code == 403

    for operator in (make_viewer(), make_staff()):
        client = Client()
        client.force_login(operator)
        assert client.get(url).status_code == 200


def test_an_unknown_conversation_is_a_404() -> None:
    response = olga().get(reverse("trace_conversation", args=["conv_nope"]))
    assert response.status_code == 404


# --- the list -------------------------------------------------------------------------------


def test_the_list_shows_each_conversation_with_its_user_turns_tokens_cost_and_last_outcome(
    three_turns: dict[str, Any],
) -> None:
    other = make_conversation(owner=make_user(username="bob"), agent_name="support")
    turn(other, "hi", at=T0 + timedelta(hours=1), reply="Hello", tokens=(10, 5))
    make_conversation(owner=make_user(username="carl"))  # no run: not listed
    html = olga().get(reverse("trace_conversations")).content.decode()

    # bob's is the newer activity.
    sessions = re.findall(r'data-session="([^"]+)"', html)
    assert sessions == [other.session_id, three_turns["conversation"].session_id]
    row = html[html.index(f'data-session="{three_turns["conversation"].session_id}"') :]
    row = row[: row.index("</tr>")]
    assert text_of(row, "data-turns") == ["3"]
    assert text_of(row, "data-tokens") == ["400"]
    assert text_of(row, "data-cost") == ["$0.000400; no price for mystery-model"]
    assert 'data-outcome="failed"' in row
    assert text_of(row, "data-feedback") == ["thumbs up 1 thumbs down 1"]
    assert ">alice</a>" in row and "Order help" in row
    assert reverse("trace_conversation", args=[three_turns["conversation"].session_id]) in row


def test_the_list_is_ordered_by_last_activity_and_filtered_by_user() -> None:
    alice, bob = make_user(username="alice"), make_user(username="bob")
    made = []
    for n, owner in enumerate([alice, bob, alice]):
        conversation = make_conversation(owner=owner)
        make_run(conversation=conversation)
        Conversation.objects.filter(pk=conversation.pk).update(updated=T0 + timedelta(hours=n))
        made.append(conversation.session_id)
    client = olga()
    html = client.get(reverse("trace_conversations")).content.decode()
    assert re.findall(r'data-session="([^"]+)"', html) == made[::-1]
    html = client.get(reverse("trace_conversations"), {"user": "alice"}).content.decode()
    assert re.findall(r'data-session="([^"]+)"', html) == [made[2], made[0]]
    html = client.get(reverse("trace_conversations"), {"user": "nobody"}).content.decode()
    assert "No conversation matches this filter." in html


def test_the_list_pages_by_keyset_50_at_a_time() -> None:
    owner = make_user()
    for n in range(53):
        conversation = make_conversation(owner=owner)
        make_run(conversation=conversation)
        Conversation.objects.filter(pk=conversation.pk).update(updated=T0 + timedelta(minutes=n))
    client = olga()
    first = client.get(reverse("trace_conversations")).content.decode()
    assert len(re.findall(r'data-session="', first)) == 50
    older = re.search(r'href="([^"]+)" rel="next"', first)
    assert older is not None
    second = client.get(older.group(1).replace("&amp;", "&")).content.decode()
    assert len(re.findall(r'data-session="', second)) == 3
    assert not set(re.findall(r'data-session="([^"]+)"', first)) & set(
        re.findall(r'data-session="([^"]+)"', second)
    )
    assert 'rel="next"' not in second
    bad = client.get(reverse("trace_conversations"), {"older": "not-a-cursor"})
    assert bad.status_code == 400


def test_the_admins_conversation_page_links_to_the_operators_view() -> None:
    conversation = make_conversation(owner=make_user())
    admin = make_user(username="root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    url = reverse("admin:conversations_conversation_change", args=[conversation.pk])
    html = client.get(url).content.decode()
    assert reverse("trace_conversation", args=[conversation.session_id]) in html


def test_a_trace_of_the_conversation_counts_in_its_row_once() -> None:
    # Guard against a join that would count a trace's tokens once per span.
    conversation = make_conversation(owner=make_user())
    turn(conversation, "hi", at=T0, tools=("a", "b", "c"))
    rows, _ = session_views.conversation_rows(Q(pk=conversation.pk), None, price_links=False)
    assert [(row.turns, row.tokens) for row in rows] == [(1, 120)]
    assert Trace.objects.filter(group_id=conversation.session_id).count() == 1
    assert ApprovalRequest.objects.count() == 0


def test_the_list_filters_by_feedback(three_turns: dict[str, Any]) -> None:
    praised = make_conversation(owner=make_user())
    run = turn(praised, "hi", at=T0, reply="Hello")
    Feedback.objects.create(run=run, user=praised.owner, score=1)
    make_run(conversation=make_conversation(owner=make_user()))  # not rated
    client = olga()

    def listed(**query: str) -> list[str]:
        html = client.get(reverse("trace_conversations"), query).content.decode()
        return re.findall(r'data-session="([^"]+)"', html)

    ours = three_turns["conversation"].session_id
    assert listed(feedback="down") == [ours]
    assert listed(feedback="up") == [praised.session_id, ours]
    assert listed(feedback="any") == [praised.session_id, ours]
    assert len(listed()) == 3
    assert client.get(reverse("trace_conversations"), {"feedback": "meh"}).status_code == 400


def test_filtered_by_user_the_list_totals_her_conversations(three_turns: dict[str, Any]) -> None:
    second = make_conversation(owner=three_turns["alice"])
    turn(second, "hi again", at=T0 + timedelta(hours=1), reply="Hello", tokens=(1000, 500))
    other = make_conversation(owner=make_user(username="bob"))
    turn(other, "hi", at=T0, reply="Hello", tokens=(5, 5))
    client = olga()
    html = client.get(reverse("trace_conversations"), {"user": "alice"}).content.decode()
    assert total(html, "conversations") == "2"
    assert total(html, "turns") == "4"
    assert total(html, "tokens") == "1900"  # 400 + 1,500
    # $0.000400 + 1000 × $1 + 500 × $2 a million: $0.002400.
    assert total(html, "cost") == "$0.002400; no price for mystery-model"
    assert (
        'data-testid="filter-totals"'
        not in client.get(reverse("trace_conversations")).content.decode()
    )
