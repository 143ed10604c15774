"""The admin of approval requests and decisions (`approvals/admin.py`), beside the runs' own
(tests/engine/test_admin.py): view-only, decided through the engine."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from approvals.models import ApprovalDecision, ApprovalPolicy, ApprovalRequest, ApprovalStatus
from demo.models import OrderEvent
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.approvals.test_views_bulk import confirmation_data
from tests.factories import REVIEWER, grant, make_user, pause_run

# Tools run in worker threads with their own database connections: they must see committed rows.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("orders")]

RUNS = "/admin/engine/agentrun/"
REQUESTS = "/admin/approvals/approvalrequest/"
DECISIONS = "/admin/approvals/approvaldecision/"
BULK = "/inbox/decide/"


def approve_selected(client: Client, *requests: ApprovalRequest, action: str = "approve_selected"):
    """The admin action: its answer is the inbox's bulk confirmation; nothing decided yet."""
    return client.post(
        REQUESTS,
        {"action": action, "_selected_action": [r.pk for r in requests], "index": 0},
    )


def confirm_form_tag(page: str) -> str:
    form = re.search(r"<form[^>]*data-bulk-confirm-form[^>]*>", page)
    assert form, page
    return form.group(0)


def confirm(client: Client, confirmation: Any) -> Any:
    """Press the confirmation's confirm button, as a browser would post it: through htmx
    (its header set) when the form is htmx's."""
    page = confirmation.content.decode()
    headers = {"HX-Request": "true"} if "hx-post=" in confirm_form_tag(page) else {}
    return client.post(BULK, confirmation_data(page), headers=headers)


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_it_renders_the_changelists_and_change_pages(
    admin_client: Client, paused_run: AgentRun
) -> None:
    run = paused_run
    request = run.approval_requests.get()
    reviewer = grant(make_user(username="rita"), REVIEWER)
    runs.decide(request, reviewer, runs.Decision.reject("Not this one."))
    decision = ApprovalDecision.objects.get()

    for url in (RUNS, REQUESTS, DECISIONS):
        assert admin_client.get(url).status_code == 200, url
    assert admin_client.get(RUNS, {"q": run.conversation.session_id}).status_code == 200
    assert (
        admin_client.get(RUNS, {"status": "resuming", "agent_name": "support"}).status_code == 200
    )
    assert admin_client.get(REQUESTS, {"q": request.call_id}).status_code == 200
    assert admin_client.get(REQUESTS, {"tool_name": "cancel_order"}).status_code == 200

    run_page = admin_client.get(f"{RUNS}{run.pk}/change/")
    assert run_page.status_code == 200
    body = run_page.content.decode()
    # The request shows inline, with a link to its own page.
    assert f'href="{REQUESTS}{request.pk}/change/"' in body
    assert "cancel_order(order_id=42)" in body

    request_page = admin_client.get(f"{REQUESTS}{request.pk}/change/")
    assert request_page.status_code == 200
    # Its decision shows inline.
    assert "Not this one." in request_page.content.decode()

    assert admin_client.get(f"{DECISIONS}{decision.pk}/change/").status_code == 200


def test_it_lets_nobody_edit_what_the_engine_owns(
    admin_client: Client, paused_run: AgentRun
) -> None:
    run = paused_run
    request = run.approval_requests.get()

    run_page = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()
    for name in ("status", "state", "state_signature", "agent_fingerprint", "pause_count"):
        assert f'name="{name}"' not in run_page
    assert 'name="_save"' not in run_page
    request_page = admin_client.get(f"{REQUESTS}{request.pk}/change/").content.decode()
    for name in ("status", "arguments", "arguments_hash", "expires_at"):
        assert f'name="{name}"' not in request_page
    assert 'name="_save"' not in request_page

    response = admin_client.post(f"{RUNS}{run.pk}/change/", {"status": "completed"})
    assert response.status_code == 403
    response = admin_client.post(f"{REQUESTS}{request.pk}/change/", {"status": "approved"})
    assert response.status_code == 403
    assert admin_client.get(f"{RUNS}add/").status_code == 403
    assert admin_client.get(f"{REQUESTS}add/").status_code == 403
    run.refresh_from_db()
    request.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert request.status == ApprovalStatus.PENDING


def test_it_keeps_decisions_append_only_even_for_a_superuser(
    admin_client: Client, paused_run: AgentRun
) -> None:
    run = paused_run
    reviewer = grant(make_user(username="rita"), REVIEWER)
    runs.decide(run.approval_requests.get(), reviewer, runs.Decision.approve())
    decision = ApprovalDecision.objects.get()

    assert admin_client.get(f"{DECISIONS}add/").status_code == 403
    assert admin_client.post(f"{DECISIONS}add/", {"approved": "on"}).status_code == 403
    response = admin_client.post(
        f"{DECISIONS}{decision.pk}/change/", {"approved": "", "message": "edited"}
    )
    assert response.status_code == 403
    assert admin_client.get(f"{DECISIONS}{decision.pk}/delete/").status_code == 403
    assert (
        admin_client.post(f"{DECISIONS}{decision.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    page = admin_client.get(f"{DECISIONS}{decision.pk}/change/").content.decode()
    assert 'name="_save"' not in page
    assert "deletelink" not in page
    changelist = admin_client.get(DECISIONS).content.decode()
    assert f"{DECISIONS}add/" not in changelist
    assert "delete_selected" not in changelist

    decision.refresh_from_db()
    assert decision.approved is True
    assert decision.message == ""
    assert ApprovalDecision.objects.count() == 1


def test_it_approves_selected_requests_through_the_engine_after_a_confirmation(
    admin_client: Client, paused_run: AgentRun, submitted: list
) -> None:
    run = paused_run
    request = run.approval_requests.get()

    confirmation = approve_selected(admin_client, request)

    # The action only lists what would run (the inbox's confirmation); nothing is decided.
    assert confirmation.status_code == 200
    page = confirmation.content.decode()
    assert "Approve 1 request?" in page and f"#{request.pk}" in page
    assert ApprovalDecision.objects.count() == 0
    assert submitted[-1] == ("execute", run.pk)

    response = confirm(admin_client, confirmation)

    assert response.status_code == 302 and response["Location"] == REQUESTS
    assert messages_of(response) == ["Approved 1 request."]
    decision = ApprovalDecision.objects.get()
    assert decision.request == request
    assert decision.reviewer is not None and decision.reviewer.username == "admin"
    assert decision.approved is True
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert submitted[-1] == ("resume", run.pk)
    # Approving is not executing: the tool runs only when the run resumes.
    assert OrderEvent.objects.count() == 0


def test_it_comes_back_to_the_filtered_change_list_once_confirmed(
    admin_client: Client, paused_run: AgentRun, submitted: list
) -> None:
    request = paused_run.approval_requests.get()
    filtered = f"{REQUESTS}?status__exact=pending"

    confirmation = admin_client.post(
        filtered,
        {"action": "reject_selected", "_selected_action": [request.pk], "index": 0},
    )
    page = confirmation.content.decode()

    # A page of its own, not the inbox's dialog: its confirm button is a plain form's, which
    # the browser follows to wherever the answer sends it; cancelling goes back the same way.
    assert "hx-post=" not in confirm_form_tag(page)
    assert f'<a class="btn btn-quiet" href="{filtered}">Cancel</a>' in page
    response = confirm(admin_client, confirmation)

    assert response.status_code == 302 and response["Location"] == filtered
    assert messages_of(response) == ["Rejected 1 request."]
    request.refresh_from_db()
    assert request.status == ApprovalStatus.REJECTED
    listed = admin_client.get(response["Location"]).content.decode()
    # Decided, so no longer in the pending list it came back to.
    assert f"/{request.pk}/change/" not in listed


def test_it_sets_a_decided_request_apart_and_decides_nothing_twice(
    admin_client: Client, submitted: list
) -> None:
    first, second = pause_run(), pause_run()
    first_request, second_request = first.approval_requests.get(), second.approval_requests.get()
    confirm(admin_client, approve_selected(admin_client, first_request))
    admin_client.get(REQUESTS)  # shows, and so consumes, that action's message
    resumes = len(submitted)

    confirmation = approve_selected(admin_client, first_request, second_request)

    page = confirmation.content.decode()
    assert "Already approved by admin at " in page
    assert confirmation_data(page)["ids"] == [str(second_request.pk)]
    response = confirm(admin_client, confirmation)
    assert messages_of(response) == ["Approved 1 request."]
    assert ApprovalDecision.objects.filter(request=first_request).count() == 1
    assert ApprovalDecision.objects.filter(request=second_request).count() == 1
    assert submitted[resumes:] == [("resume", second.pk)]


def test_it_rejects_selected_requests(
    admin_client: Client, paused_run: AgentRun, submitted: list
) -> None:
    run = paused_run
    request = run.approval_requests.get()

    response = confirm(
        admin_client, approve_selected(admin_client, request, action="reject_selected")
    )

    assert messages_of(response) == ["Rejected 1 request."]
    decision = ApprovalDecision.objects.get()
    assert decision.approved is False
    request.refresh_from_db()
    assert request.status == ApprovalStatus.REJECTED
    run.refresh_from_db()
    assert run.status == RunStatus.RESUMING
    assert submitted[-1] == ("resume", run.pk)


def test_it_hides_the_actions_from_staff_who_may_not_decide(
    client: Client, paused_run: AgentRun
) -> None:
    run = paused_run
    request = run.approval_requests.get()
    viewer = grant(
        make_user(username="victor", is_staff=True),
        "engine.view_agentrun",
        "approvals.view_approvalrequest",
        "approvals.view_approvaldecision",
    )
    client.force_login(viewer)

    changelist = client.get(REQUESTS)
    assert changelist.status_code == 200
    assert "approve_selected" not in changelist.content.decode()
    assert "reject_selected" not in changelist.content.decode()
    assert client.get(f"{RUNS}{run.pk}/change/").status_code == 200

    # Posting the action anyway decides nothing.
    approve_selected(client, request)
    assert ApprovalDecision.objects.count() == 0
    request.refresh_from_db()
    assert request.status == ApprovalStatus.PENDING

    # The same staff user with the permission sees them.
    grant(viewer, REVIEWER)
    body = client.get(REQUESTS).content.decode()
    assert "approve_selected" in body
    assert "reject_selected" in body


def test_requests_are_listed_and_filtered_by_kind_with_their_server(admin_client: Client) -> None:
    from approvals.models import ToolKind
    from tests.factories import make_request

    restock = make_request(tool_name="restock", kind=ToolKind.MCP, server="warehouse")
    shell = make_request(tool_name="shell", kind=ToolKind.SHELL, arguments={"commands": ["ls"]})
    function = make_request()

    listed = admin_client.get(REQUESTS).content.decode()
    assert "By kind" in listed and "By server" in listed
    assert '<td class="field-kind">MCP server tool</td>' in listed
    assert '<td class="field-server">warehouse</td>' in listed
    assert "restock(order_id=42) · MCP server warehouse" in listed

    shells = admin_client.get(REQUESTS, {"kind__exact": "shell"}).content.decode()
    assert f"/{shell.pk}/change/" in shells
    assert f"/{restock.pk}/change/" not in shells and f"/{function.pk}/change/" not in shells
    by_server = admin_client.get(REQUESTS, {"server": "warehouse"}).content.decode()
    assert f"/{restock.pk}/change/" in by_server and f"/{shell.pk}/change/" not in by_server

    page = admin_client.get(f"{REQUESTS}{restock.pk}/change/").content.decode()
    assert "MCP server tool" in page and "warehouse" in page


def test_a_blank_server_is_a_filter_choice_with_a_name(admin_client: Client) -> None:
    """Django lists a column's empty value as a link with no text: nobody could read it."""
    from approvals.models import ToolKind
    from tests.factories import make_request

    restock = make_request(tool_name="restock", kind=ToolKind.MCP, server="warehouse")
    function = make_request()

    listed = admin_client.get(REQUESTS).content.decode()
    assert '<a href="?server=">(empty)</a>' in listed
    assert '<a href="?server=warehouse">warehouse</a>' in listed
    counted = admin_client.get(REQUESTS, {"_facets": "True"}).content.decode()
    assert "(empty) (1)</a>" in counted and "warehouse (1)</a>" in counted
    blank = admin_client.get(REQUESTS, {"server": ""}).content.decode()
    assert f"/{function.pk}/change/" in blank and f"/{restock.pk}/change/" not in blank


def test_each_rules_enabled_box_in_the_list_is_named_after_its_rule(admin_client: Client) -> None:
    from demo.seed import seed_policies

    seed_policies()
    [name] = ApprovalPolicy.objects.values_list("name", flat=True)
    listed = admin_client.get("/admin/approvals/approvalpolicy/").content.decode()
    assert f'aria-label="{html.escape(name)}: enabled"' in listed
