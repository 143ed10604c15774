"""The reviewers' inbox through the Django test client: who may see it, what it shows, and
how decisions go through `runs.decide`."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Q
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from conversations.models import SessionItem
from demo.models import Order
from demo.seed import seed_orders
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.approvals.test_views_bulk import confirmation_data
from tests.factories import (
    make_decision,
    make_request,
    make_reviewer,
    make_run,
    make_user,
    pause_run,
)
from tests.plans import explain

pytestmark = pytest.mark.django_db

XSS = "<script>alert(1)</script>"
HTMX = {"HTTP_HX_REQUEST": "true"}


# --- data -----------------------------------------------------------------------------------


def decide_data(request: ApprovalRequest, action: str, **extra: str) -> dict[str, str]:
    return {"action": action, "seen_hash": request.arguments_hash, **extra}


def text(response: Any) -> str:
    return str(response.content.decode())


# --- who may see it -------------------------------------------------------------------------


def inbox_urls(request: ApprovalRequest) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("get", reverse("inbox"), {}),
        ("get", reverse("inbox_rows"), {}),
        ("get", reverse("inbox_history"), {}),
        ("get", reverse("inbox_request", args=[request.pk]), {}),
        ("post", reverse("inbox_decide", args=[request.pk]), decide_data(request, "approve")),
        ("post", reverse("inbox_bulk_decide"), {"action": "approve", "ids": [request.pk]}),
    ]


def test_it_sends_visitors_to_log_in_and_refuses_end_users(client: Client) -> None:
    request = make_request()
    alice = make_user(username="alice")
    for method, url, data in inbox_urls(request):
        response = getattr(client, method)(url, data)
        assert response.status_code == 302, url
        assert response.url.startswith("/accounts/login/?next="), url

    client.force_login(alice)
    for method, url, data in inbox_urls(request):
        assert getattr(client, method)(url, data).status_code == 403, url
    assert ApprovalDecision.objects.count() == 0


def test_it_lets_reviewers_in(client: Client, rita: Any) -> None:
    request = make_request()
    for method, url, data in inbox_urls(request):
        response = getattr(client, method)(url, data)
        # GETs render, and so does a bulk decision's first step (its confirmation); the
        # decision POST decides and redirects back.
        bulk = url == reverse("inbox_bulk_decide")
        assert response.status_code == (200 if method == "get" or bulk else 302), url


def test_the_nav_and_home_lead_reviewers_to_the_inbox(client: Client, rita: Any) -> None:
    response = client.get("/", follow=True)
    assert response.redirect_chain[-1][0] == reverse("inbox")
    assert 'href="/inbox/"' in text(response)


# --- the pending list -----------------------------------------------------------------------


def test_it_lists_pending_requests_newest_first_with_escaped_arguments(
    client: Client, rita: Any
) -> None:
    now = timezone.now()
    bob = make_user(username="bob")
    old = make_request(
        tool_name="issue_refund", arguments={"amount": 80}, created=now - timedelta(hours=2)
    )
    new = make_request(
        tool_name="send_email",
        arguments={"to": "x@example.com", "body": XSS},
        run=make_run(requested_by=bob),
        created=now - timedelta(minutes=1),
    )
    decided = make_request(tool_name="lookup_order", status=ApprovalStatus.APPROVED)
    overdue = make_request(tool_name="wire_money", expires_at=now - timedelta(seconds=1))

    response = client.get(reverse("inbox"))

    assert response.status_code == 200
    html = text(response)
    assert html.index(f'id="request-{new.pk}"') < html.index(f'id="request-{old.pk}"')
    assert f'id="request-{decided.pk}"' not in html
    assert f'id="request-{overdue.pk}"' not in html
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "asked by <strong>bob</strong>" in html
    assert "asked by <strong>" + old.run.conversation.owner.username in html
    assert 'data-title-count="2"' in html
    assert '<div class="inbox" hx-ext="ws" ws-connect="/ws/inbox/?show=pending">' in html
    assert 'hx-trigger="resync from:body"' in html
    assert "1 min ago" in html and "2 h ago" in html and "expires in 23 h" in html


@pytest.mark.django_db(transaction=True)
def test_a_paused_demo_run_shows_up_with_who_asked_and_the_call(
    paused_run: AgentRun, client: Client, rita: Any
) -> None:
    run = paused_run
    request = run.approval_requests.get()

    html = text(client.get(reverse("inbox")))

    assert f'id="request-{request.pk}"' in html
    assert "asked by <strong>alice</strong>" in html
    assert ">cancel_order</a>" in html
    assert "&quot;order_id&quot;: 42" in html or '"order_id": 42' in html
    assert "“cancel order 42”" in html
    assert f'name="seen_hash" value="{request.arguments_hash}"' in html


def test_it_filters_by_agent_and_tool(client: Client, rita: Any) -> None:
    refund = make_request(agent_name="Billing", tool_name="issue_refund", arguments={"amount": 80})
    cancel = make_request(agent_name="Support desk", tool_name="cancel_order")
    email = make_request(agent_name="Support desk", tool_name="send_email", arguments={"to": "a"})

    html = text(client.get(reverse("inbox"), {"agent": "Support desk"}))
    assert f'id="request-{cancel.pk}"' in html and f'id="request-{email.pk}"' in html
    assert f'id="request-{refund.pk}"' not in html
    # The count is of everything pending; the socket and the resync keep the filter.
    assert 'data-title-count="3"' in html
    assert 'ws-connect="/ws/inbox/?show=pending&amp;agent=Support+desk"' in html
    assert 'hx-get="/inbox/rows/?agent=Support+desk"' in html

    html = text(client.get(reverse("inbox"), {"agent": "Support desk", "tool": "send_email"}))
    assert f'id="request-{email.pk}"' in html and f'id="request-{cancel.pk}"' not in html

    html = text(client.get(reverse("inbox_rows"), {"tool": "issue_refund"}))
    assert f'id="request-{refund.pk}"' in html and f'id="request-{cancel.pk}"' not in html

    # A well-formed filter that matches nothing is an empty list, not an error.
    response = client.get(reverse("inbox"), {"tool": "no_such_tool"})
    assert response.status_code == 200
    assert "Nothing pending for this filter." in text(response)
    assert '<option value="no_such_tool" selected>' in text(response)


def test_a_malformed_filter_is_a_clear_400(client: Client, rita: Any) -> None:
    make_request()
    response = client.get(reverse("inbox"), {"tool": "x" * 201})
    assert response.status_code == 400
    assert "This filter is not valid" in text(response)
    assert "at most 200 characters" in text(response)
    assert client.get(reverse("inbox_rows"), {"agent": "x" * 101}).status_code == 400
    assert client.get(reverse("inbox_history"), {"decision": "maybe"}).status_code == 400
    assert client.get(reverse("inbox_history"), {"page": "two"}).status_code == 400


def test_the_rows_fragment_holds_the_rows_the_count_and_the_filter_choices(
    client: Client, rita: Any
) -> None:
    request = make_request()
    make_request(agent_name="Billing", tool_name="issue_refund", arguments={"amount": 80})
    html = text(client.get(reverse("inbox_rows"), {"tool": "cancel_order"}, **HTMX))
    assert html.lstrip().startswith(f'<li id="request-{request.pk}" class="row row-pending">')
    assert '<span id="pending-count"' in html and 'hx-swap-oob="true"' in html
    assert "<html" not in html
    # The choices of every pending request, not only the rows shown: a request that arrived
    # while the socket was down may have brought one.
    choices = html.split('<div id="filter-fields" class="filter-fields" hx-swap-oob="true">')[1]
    assert '<option value="Billing">' in choices and '<option value="issue_refund">' in choices
    assert '<option value="cancel_order" selected>' in choices


# --- one request ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_request_page_shows_the_conversation_escaped_and_the_buttons(
    paused_run: AgentRun, client: Client, rita: Any
) -> None:
    run = paused_run
    request = run.approval_requests.get()
    SessionItem.objects.create(
        conversation=run.conversation, payload={"role": "user", "content": f"also {XSS}"}
    )

    response = client.get(reverse("inbox_request", args=[request.pk]))

    assert response.status_code == 200
    html = text(response)
    assert "cancel order 42" in html
    assert 'class="line line-call is-current"' in html
    assert "cancel_order(order_id=42)" in html
    assert XSS not in html and "also &lt;script&gt;" in html
    assert f'ws-connect="/ws/inbox/?show=request&amp;request={request.pk}"' in html
    for label in ("Approve", "Approve always", "Reject"):
        assert f">{label}" in html
    assert '<textarea name="message"' in html
    assert f'hx-post="/inbox/{request.pk}/decide/"' in html
    assert f'action="/inbox/{request.pk}/decide/"' in html  # works without JavaScript


def test_the_request_page_of_a_decided_request_shows_the_decision(
    client: Client, rita: Any
) -> None:
    request = make_request()
    runs.decide(request, rita, runs.Decision.reject(f"no {XSS}"))
    html = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert "Rejected" in html and "by <strong>rita</strong>" in html
    assert XSS not in html and "no &lt;script&gt;" in html
    assert "<textarea" not in html


def test_an_unknown_request_is_a_404(client: Client, rita: Any) -> None:
    assert client.get(reverse("inbox_request", args=[999999])).status_code == 404
    post = client.post(reverse("inbox_decide", args=[999999]), {"action": "approve"})
    assert post.status_code == 404


# --- deciding -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_approve_goes_through_the_engine_and_the_run_resumes(
    paused_run: AgentRun, client: Client, rita: Any, submitted: list
) -> None:
    run = paused_run
    request = run.approval_requests.get()

    response = client.post(
        reverse("inbox_decide", args=[request.pk]),
        decide_data(request, "approve", next="/inbox/?tool=cancel_order"),
        follow=True,
    )

    assert response.redirect_chain == [("/inbox/?tool=cancel_order", 302)]
    assert "Approved cancel_order(order_id=42)." in text(response)
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.reviewer, decision.approved, decision.always) == (rita, True, False)
    assert decision.arguments_hash == request.arguments_hash
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED and request.decided_by == rita
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.RESUMING
    assert submitted[-1] == ("resume", run.pk)

    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    assert Order.objects.get(number=42).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_reject_with_a_message_over_htmx_tells_the_agent(
    paused_run: AgentRun, client: Client, rita: Any
) -> None:
    run = paused_run
    request = run.approval_requests.get()

    response = client.post(
        reverse("inbox_decide", args=[request.pk]),
        decide_data(request, "reject", message="It already shipped; offer a return."),
        HTTP_HX_TARGET=f"decision-{request.pk}",
        **HTMX,
    )

    assert response.status_code == 200
    html = text(response)
    assert html.lstrip().startswith(f'<section id="decision-{request.pk}"')
    assert "Rejected" in html and "It already shipped; offer a return." in html
    assert 'data-title-count="0"' in html
    decision = ApprovalDecision.objects.get(request=request)
    assert decision.approved is False and decision.message == "It already shipped; offer a return."

    asyncio.run(runs.resume(run.pk))
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert Order.objects.get(number=42).status == "placed"


def test_approve_always_from_a_row_answers_with_the_decided_row(
    client: Client, rita: Any, django_capture_on_commit_callbacks: Any
) -> None:
    request = make_request()
    other = make_request()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(
            reverse("inbox_decide", args=[request.pk]),
            decide_data(request, "approve_always"),
            HTTP_HX_TARGET=f"request-{request.pk}",
            **HTMX,
        )
    assert callbacks  # the events and the resume wait for the commit
    html = text(response)
    assert html.lstrip().startswith(f'<li id="request-{request.pk}" class="row row-decided')
    assert "by rita" in html and "for the rest of this run" in html
    assert 'data-title-count="1"' in html
    assert ApprovalDecision.objects.get(request=request).always is True
    assert ApprovalRequest.objects.get(pk=other.pk).is_pending


def test_a_rows_refused_text_comes_back_in_its_open_box_with_the_error_under_it(
    client: Client, rita: Any
) -> None:
    request = make_request()
    url = reverse("inbox_decide", args=[request.pk])
    row = {"HTTP_HX_TARGET": f"request-{request.pk}", **HTMX}

    html = text(client.post(url, decide_data(request, "respond", response="  "), **row))
    assert html.lstrip().startswith(f'<li id="request-{request.pk}" class="row row-pending">')
    assert '<details class="row-respond" data-respond-box open>' in html
    assert (
        f'data-respond-text aria-invalid="true" aria-describedby="row-response-error-{request.pk}">'
        "  </textarea>"
    ) in html
    assert f'<p class="field-error" id="row-response-error-{request.pk}">Write the result' in html
    assert "row-notice" not in html  # said under the box, not elsewhere

    too_long = "x" * (runs.MAX_MESSAGE_CHARS + 1)
    html = text(client.post(url, decide_data(request, "reject", message=too_long), **row))
    assert f'id="reject-box-{request.pk}" role="group"' in html
    assert "data-reject-box hidden" not in html  # open
    assert f'aria-describedby="row-message-error-{request.pk}">{too_long}</textarea>' in html
    assert "at most 2000 characters" in html and "row-notice" not in html
    assert ApprovalDecision.objects.count() == 0


def test_a_second_click_is_told_who_decided_first(client: Client, rita: Any) -> None:
    request = make_request()
    url = reverse("inbox_decide", args=[request.pk])
    first = client.post(url, decide_data(request, "approve"))
    assert first.status_code == 302

    again = client.post(url, decide_data(request, "reject"), follow=True)
    assert again.redirect_chain == [(reverse("inbox_request", args=[request.pk]), 302)]
    assert "Already approved by rita at " in text(again)

    htmx = client.post(
        url, decide_data(request, "approve"), HTTP_HX_TARGET=f"request-{request.pk}", **HTMX
    )
    assert htmx.status_code == 200
    assert "Already approved by rita at " in text(htmx)
    assert ApprovalDecision.objects.filter(request=request).count() == 1


def test_a_decision_on_changed_arguments_or_an_expired_request_is_refused(
    client: Client, rita: Any
) -> None:
    request = make_request()
    url = reverse("inbox_decide", args=[request.pk])
    stale = client.post(url, {"action": "approve", "seen_hash": "0" * 64}, **HTMX)
    assert "The arguments changed since this request was shown to you" in text(stale)

    expired = make_request(expires_at=timezone.now() - timedelta(minutes=1))
    response = client.post(
        reverse("inbox_decide", args=[expired.pk]), decide_data(expired, "approve"), follow=True
    )
    assert "expired at" in text(response) and "can no longer be decided" in text(response)
    assert ApprovalDecision.objects.count() == 0


def test_a_malformed_decision_is_refused_without_deciding(client: Client, rita: Any) -> None:
    request = make_request()
    url = reverse("inbox_decide", args=[request.pk])
    assert client.post(url, {"action": "approve"}).status_code == 400
    assert (
        client.post(url, {"action": "yes", "seen_hash": request.arguments_hash}).status_code == 400
    )
    too_long = decide_data(request, "reject", message="x" * (runs.MAX_MESSAGE_CHARS + 1))
    response = client.post(url, too_long, **HTMX)
    assert response.status_code == 200 and "at most 2000 characters" in text(response)
    assert ApprovalDecision.objects.count() == 0
    assert client.get(url).status_code == 405


def test_an_unsafe_next_is_ignored(client: Client, rita: Any) -> None:
    request = make_request()
    response = client.post(
        reverse("inbox_decide", args=[request.pk]),
        decide_data(request, "approve", next="https://evil.example/"),
    )
    assert response["Location"] == reverse("inbox")


def test_decisions_need_the_csrf_token(rita: Any) -> None:
    request = make_request()
    client = Client(enforce_csrf_checks=True)
    client.force_login(rita)
    response = client.post(
        reverse("inbox_decide", args=[request.pk]), decide_data(request, "approve")
    )
    assert response.status_code == 403
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending


# --- bulk -----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_bulk_approve_decides_each_request_through_the_engine(
    client: Client, submitted: list
) -> None:
    seed_orders()
    rita = make_reviewer()
    client.force_login(rita)
    paused = [pause_run(text) for text in ("cancel order 42", "cancel order 23", "cancel order 7")]
    requests = [run.approval_requests.get() for run in paused]
    data: dict[str, Any] = {"action": "approve", "ids": [r.pk for r in requests]}
    data.update({f"hash-{r.pk}": r.arguments_hash for r in requests})
    asked = client.post(reverse("inbox_bulk_decide"), data)
    assert ApprovalDecision.objects.count() == 0  # the first step only asks

    response = client.post(
        reverse("inbox_bulk_decide"), confirmation_data(text(asked)), follow=True
    )

    assert "Approved 3 requests." in text(response)
    assert ApprovalDecision.objects.filter(reviewer=rita, approved=True).count() == 3
    assert sorted(run_id for job, run_id in submitted if job == "resume") == sorted(
        run.pk for run in paused
    )
    assert set(AgentRun.objects.values_list("status", flat=True)) == {RunStatus.RESUMING}


def test_bulk_reports_each_outcome_over_htmx(client: Client, rita: Any) -> None:
    first, second, third, gone = make_request(), make_request(), make_request(), make_request()
    data = {"action": "reject", "ids": [first.pk, second.pk, third.pk, gone.pk]}
    asked = client.post(reverse("inbox_bulk_decide"), data, **HTMX)
    # Between the confirmation and its answer: decided by bob, deleted.
    runs.decide(second, make_reviewer("bob"), runs.Decision.approve())
    gone_pk = gone.pk
    gone.run.delete()

    response = client.post(reverse("inbox_bulk_decide"), confirmation_data(text(asked)), **HTMX)

    html = text(response)
    assert "Rejected 2 requests. 2 could not be decided." in html
    assert "Already approved by bob at " in html
    assert f"Request #{gone_pk} does not exist." in html
    for request in (first, third):
        assert (
            f'<li id="request-{request.pk}" class="row row-decided is-rejected" hx-swap-oob="true">'
            in html
        )
    assert 'data-title-count="0"' in html
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.REJECTED


def test_bulk_without_a_selection_says_so(client: Client, rita: Any) -> None:
    response = client.post(reverse("inbox_bulk_decide"), {"action": "approve"}, follow=True)
    assert "Select at least one request." in text(response)
    htmx = client.post(reverse("inbox_bulk_decide"), {"action": "approve", "ids": ["x"]}, **HTMX)
    assert "Requests are chosen by their number." in text(htmx)


# --- history --------------------------------------------------------------------------------


def test_history_lists_decisions_and_filters_them(client: Client, rita: Any) -> None:
    bob = make_reviewer("bob")
    approved = make_request(tool_name="cancel_order")
    rejected = make_request(tool_name="issue_refund", agent_name="Billing", arguments={"a": 1})
    always = make_request(tool_name="send_email", arguments={"body": XSS})
    expired = make_request(tool_name="wire_money", expires_at=timezone.now() - timedelta(seconds=1))
    runs.decide(approved, rita, runs.Decision.approve())
    runs.decide(rejected, bob, runs.Decision.reject(f"not now {XSS}"))
    runs.decide(always, rita, runs.Decision.approve(always=True))
    assert runs.expire_overdue() == 1
    pending = make_request(tool_name="lookup_order")

    def rows(**query: str) -> set[int]:
        response = client.get(reverse("inbox_history"), query)
        assert response.status_code == 200
        html = text(response)
        assert XSS not in html
        return {
            r.pk
            for r in (approved, rejected, always, expired, pending)
            if f"/inbox/{r.pk}/" in html
        }

    assert rows() == {approved.pk, rejected.pk, always.pk, expired.pk}
    assert rows(reviewer="bob") == {rejected.pk}
    assert rows(reviewer="nobody") == set()  # not the expired ones, which have no reviewer
    assert rows(decision="approved") == {approved.pk, always.pk}
    assert rows(decision="rejected") == {rejected.pk}
    assert rows(decision="expired") == {expired.pk}
    assert rows(tool="send_email") == {always.pk}
    assert rows(agent="Billing") == {rejected.pk}
    assert rows(reviewer="rita", tool="issue_refund") == set()

    html = text(client.get(reverse("inbox_history"), {"agent": "Billing"}))
    assert "not now &lt;script&gt;" in html
    assert '<option value="bob">bob</option>' in html or '<option value="bob"' in html
    html = text(client.get(reverse("inbox_history"), {"tool": "send_email"}))
    assert ">always</span>" in html


def test_history_pages_by_fifty(client: Client, rita: Any) -> None:
    requests = [make_request() for _ in range(51)]
    ApprovalDecision.objects.bulk_create(
        ApprovalDecision(request=r, reviewer=rita, approved=True, arguments_hash=r.arguments_hash)
        for r in requests
    )
    first = text(client.get(reverse("inbox_history")))
    assert first.count('id="decision-row-') == 50
    assert "Page 1 of 2 · 51 decisions" in first
    second = text(client.get(reverse("inbox_history"), {"page": 2, "reviewer": "rita"}))
    assert second.count('id="decision-row-') == 1
    assert 'href="?page=1&amp;reviewer=rita"' in second  # the filter stays


def test_history_pages_walk_an_index_newest_first_without_sorting(
    client: Client, rita: Any
) -> None:
    """The page's query reads the decisions in index order (newest first, or one reviewer's
    newest first) and stops after its rows: no scan of the table, no sort of it."""
    bob = make_reviewer("bob")
    run = make_run()
    requests = ApprovalRequest.objects.bulk_create(
        ApprovalRequest(
            run=run,
            pause=1,
            call_id=f"call_history_{i}",
            agent_name="Support desk",
            tool_name="cancel_order",
            arguments={"order_id": i},
            arguments_hash="x",
            status=ApprovalStatus.APPROVED,
        )
        for i in range(3000)
    )
    start = timezone.now() - timedelta(days=30)
    decisions = ApprovalDecision.objects.bulk_create(
        ApprovalDecision(
            request=request,
            reviewer=None if i % 10 == 0 else bob if i % 10 == 5 else rita,
            approved=i % 10 != 0,
            arguments_hash="x",
        )
        for i, request in enumerate(requests)
    )
    # Spread over a month, in an order unlike the ids, with ties broken by id.
    for i, decision in enumerate(decisions):
        decision.created = start + timedelta(minutes=(i * 7919) % 3000 // 2)
    ApprovalDecision.objects.bulk_update(decisions, ["created"], batch_size=500)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE approvals_approvaldecision")

    newest = {"decision_created"}
    by_reviewer = {"decision_reviewer_created", "decision_created"}
    for query, indexes, match in [
        ({}, newest, Q()),
        ({"page": "7"}, newest, Q()),
        ({"reviewer": "bob"}, by_reviewer, Q(reviewer=bob)),
        ({"reviewer": "rita", "page": "2"}, by_reviewer, Q(reviewer=rita)),
        ({"decision": "expired"}, by_reviewer, Q(reviewer=None)),
        ({"decision": "approved"}, newest, Q(approved=True)),
    ]:
        with CaptureQueriesContext(connection) as captured:
            response = client.get(reverse("inbox_history"), query)
        assert response.status_code == 200
        page = int(query.get("page", 1))
        expected = ApprovalDecision.objects.filter(match).order_by("-created", "-pk")
        shown = [d.pk for d in response.context["decisions"]]
        assert shown == [d.pk for d in expected[(page - 1) * 50 : page * 50]], query
        assert shown, query

        [listing] = [
            q["sql"]
            for q in captured.captured_queries
            if 'FROM "approvals_approvaldecision"' in q["sql"]
            and not q["sql"].startswith('SELECT "auth_user"')  # the reviewer suggestions
            and re.search(r"ORDER BY .* LIMIT \d+", q["sql"])
        ]
        plan = explain(listing)
        assert any(index in plan for index in indexes), (query, plan)
        assert "TEMP B-TREE" not in plan and "Sort" not in plan, (query, plan)
        assert not re.search(
            r"\bSCAN approvals_approvaldecision\b(?! USING)|Seq Scan on approvals_approvaldecision",
            plan,
        ), (query, plan)

    if connection.vendor == "sqlite":
        # The agent and tool choices come from an index, not from every request's row.
        with CaptureQueriesContext(connection) as captured:
            client.get(reverse("inbox_history"))
        [choices] = [
            q["sql"]
            for q in captured.captured_queries
            if "DISTINCT" in q["sql"] and "approvals_approvalrequest" in q["sql"]
        ]
        plan = explain(choices)
        assert "COVERING INDEX request_agent_tool" in plan and "TEMP B-TREE" not in plan, plan


# --- bounded queries ------------------------------------------------------------------------


def test_the_pages_read_the_database_a_bounded_number_of_times(
    client: Client, rita: Any, django_assert_max_num_queries: Any
) -> None:
    def count_queries(url: str, **query: str) -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as captured:
            assert client.get(url, query).status_code == 200
        return len(captured)

    make_request()
    few_list = count_queries(reverse("inbox"))
    for _ in range(49):
        make_request(run=make_run(requested_by=make_user()))
    assert ApprovalRequest.objects.pending().count() == 50

    with django_assert_max_num_queries(10):
        html = text(client.get(reverse("inbox")))
    assert html.count('class="row row-pending"') == 50
    assert count_queries(reverse("inbox")) == few_list
    with django_assert_max_num_queries(8):
        client.get(reverse("inbox_rows"))

    for request in ApprovalRequest.objects.all():
        make_decision(
            request=request, reviewer=rita, approved=False, arguments_hash="x", message="m"
        )
    with django_assert_max_num_queries(12):
        html = text(client.get(reverse("inbox_history")))
    assert html.count('id="decision-row-') == 50


def test_history_tells_a_withdrawal_from_a_rejection_and_suggests_who_decided(
    client: Client, rita: Any
) -> None:
    alice = make_user(username="alice")
    make_reviewer("idle")  # may decide, never did
    rejected = make_request(tool_name="issue_refund")
    runs.decide(rejected, rita, runs.Decision.reject("no"))
    run = make_run(owner=alice)
    withdrawn = make_request(run=run, tool_name="cancel_order")
    runs.withdraw(withdrawn, alice)

    def rows(**query: str) -> set[int]:
        html = text(client.get(reverse("inbox_history"), query))
        return {r.pk for r in (rejected, withdrawn) if f"/inbox/{r.pk}/" in html}

    assert rows(decision="rejected") == {rejected.pk}
    assert rows(decision="withdrawn") == {withdrawn.pk}
    assert rows(reviewer="alice") == {withdrawn.pk}
    html = text(client.get(reverse("inbox_history")))
    assert '<option value="withdrawn">Withdrawn by its user</option>' in html
    reviewer_select = html.split('id="filter-reviewer"')[1].split("</select>")[0]
    suggested = set(re.findall(r'<option value="([^"]+)"', reviewer_select))
    assert {"rita", "alice"} <= suggested and "idle" not in suggested
