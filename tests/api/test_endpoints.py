"""The JSON API (`api/endpoints.py`): per-user tokens, and decisions through the same engine
call and the same audit as the inbox's, with the same messages mapped to status codes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest
from agents import Agent
from agents.testing import ScriptedModel, assistant_message, function_call
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from api.models import ApiToken, Scope
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, DecisionKind
from conversations.models import SessionItem
from engine import runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import (
    make_conversation,
    make_request,
    make_reviewer,
    make_run,
    make_user,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("submitted")]

API = "/api/v1"


def token_for(user: Any, scope: str = Scope.DECIDE, **kwargs: Any) -> str:
    return ApiToken.issue(user, "test", scope, **kwargs)[1]


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def get(client: Client, path: str, secret: str | None = None, **params: Any) -> Any:
    return client.get(API + path, params, headers=bearer(secret) if secret else {})


def post(client: Client, path: str, body: Any, secret: str | None = None, **headers: Any) -> Any:
    data = body if isinstance(body, str) else json.dumps(body)
    if secret:
        headers.update(bearer(secret))
    return client.post(API + path, data, content_type="application/json", headers=headers)


def approve(client: Client, request: ApprovalRequest, secret: str, **body: Any) -> Any:
    body = {"action": "approve", "seen_hash": request.arguments_hash, **body}
    return post(client, f"/requests/{request.pk}/decide", body, secret)


# --- the Done-when line ---------------------------------------------------------------------


def test_it_lists_reads_and_approves_with_a_token_in_the_inbox_audit(client: Client) -> None:
    rita = make_reviewer()
    secret = token_for(rita)
    older = make_request(created=timezone.now() - timedelta(minutes=5))
    request = make_request(arguments={"order_id": 42, "reason": "changed my mind"})

    listed = get(client, "/requests", secret)
    assert listed.status_code == 200
    assert [item["id"] for item in listed.json()["items"]] == [request.pk, older.pk]
    # The call as the inbox shows it (in the order stored: PostgreSQL's jsonb keeps its own).
    stored = ApprovalRequest.objects.get(pk=request.pk)
    assert listed.json()["items"][0]["call"] == stored.call_display()

    detail = get(client, f"/requests/{request.pk}", secret).json()
    assert detail["arguments"] == {"order_id": 42, "reason": "changed my mind"}
    assert detail["arguments_hash"] == request.arguments_hash
    assert detail["tool"] == "cancel_order" and detail["risk"]
    assert (detail["kind"], detail["server"]) == ("function", "")
    assert {a["name"] for a in detail["labelled_arguments"]} == {"order_id", "reason"}
    assert detail["allowed"] == {
        "decidable": True,
        "editable": detail["allowed"]["editable"],
        "answerable": True,
        "needs_another_reviewer": False,
    }
    assert detail["run"]["id"] == request.run_id and detail["asked_by"]

    done = approve(client, request, secret)
    assert done.status_code == 200, done.json()
    assert done.json()["kind"] == "approved" and done.json()["reviewer"] == "rita"
    # The inbox's audit: the same row, the same history page.
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.reviewer, decision.approved) == (rita, True)
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED
    client.force_login(rita)
    history = client.get(reverse("inbox_history")).content.decode()
    assert "cancel_order" in history and f'href="/inbox/{request.pk}/"' in history
    client.logout()
    audit = get(client, f"/requests/{request.pk}/decisions", secret).json()
    assert [d["id"] for d in audit] == [decision.pk]
    one = get(client, f"/requests/{request.pk}/decisions/{decision.pk}", secret)
    assert one.json()["reviewer"] == "rita"

    again = approve(client, request, secret)
    assert again.status_code == 409
    assert again.json()["detail"].startswith("Already approved by rita at ")
    assert again.json()["code"] == "already_decided"
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    # A decided request has left the pending list.
    assert [i["id"] for i in get(client, "/requests", secret).json()["items"]] == [older.pk]


def test_a_token_without_the_decide_scope_reads_but_gets_403_on_decide(client: Client) -> None:
    secret = token_for(make_reviewer(), Scope.READ)
    request = make_request()
    assert get(client, f"/requests/{request.pk}", secret).status_code == 200
    refused = approve(client, request, secret)
    assert refused.status_code == 403 and refused.json()["code"] == "scope"
    assert not ApprovalDecision.objects.exists()


@pytest.mark.parametrize(
    "header",
    [
        "Bearer agt_" + "x" * 43,  # well-formed, unknown
        "Bearer nonsense",
        "Bearer ",
        "Basic cml0YTpzZWNyZXQ=",
        "agt_" + "x" * 43,
    ],
)
def test_an_unknown_or_malformed_token_is_401_with_www_authenticate(
    client: Client, header: str
) -> None:
    make_reviewer()
    response = client.get(API + "/requests", headers={"Authorization": header})
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert response["Content-Type"].startswith("application/json")
    assert "x" * 43 not in response.content.decode()


def test_a_revoked_or_expired_token_is_401_and_nothing_is_decided(client: Client) -> None:
    rita = make_reviewer()
    token, secret = ApiToken.issue(rita, "ci", Scope.DECIDE)
    request = make_request()
    assert get(client, "/requests", secret).status_code == 200
    token.revoke()
    refused = approve(client, request, secret)
    assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
    assert secret not in refused.content.decode()
    expired = token_for(rita, expires_at=timezone.now() - timedelta(seconds=1))
    assert get(client, "/requests", expired).status_code == 401
    bare = get(client, "/requests")  # no credentials at all
    assert bare.status_code == 401 and bare["WWW-Authenticate"] == 'Bearer realm="api"'
    assert not ApprovalDecision.objects.exists()


def test_a_deactivated_users_token_stops_working(client: Client) -> None:
    rita = make_reviewer()
    secret = token_for(rita)
    assert get(client, "/requests", secret).status_code == 200
    rita.is_active = False
    rita.save()
    assert get(client, "/requests", secret).status_code == 401


def test_a_reviewer_who_lost_the_decide_permission_gets_403(client: Client) -> None:
    rita = make_reviewer()
    secret = token_for(rita)
    request = make_request()
    rita.user_permissions.remove(Permission.objects.get(codename="decide_approvalrequest"))
    refused = approve(client, request, secret)
    assert refused.status_code == 403 and refused.json()["code"] == "not_allowed"
    assert get(client, "/requests", secret).status_code == 403
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending


def test_the_secret_is_stored_only_as_its_hash_and_shown_once(client: Client) -> None:
    alice = make_user(username="alice")
    client.force_login(alice)
    created = client.post(reverse("api_tokens"), {"name": "laptop", "scope": "read"})
    assert created.status_code == 201
    page = created.content.decode()
    secret = page.split("<code data-token>")[1].split("</code>")[0]
    assert secret.startswith("agt_") and len(secret) == 47
    row = ApiToken.objects.values().get(user=alice)
    assert secret not in json.dumps(row, default=str)
    assert row["token_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert row["prefix"] == secret[:12]
    # Listed by its prefix; the secret is never on the page again.
    again = client.get(reverse("api_tokens")).content.decode()
    assert secret[:12] in again and secret not in again
    assert get(Client(), "/conversations", secret).status_code == 200
    # Revoked by its owner; another user's token is a 404 to her.
    other = ApiToken.issue(make_user(), "other", Scope.READ)[0]
    assert client.post(reverse("api_token_revoke", args=[other.pk])).status_code == 404
    token = ApiToken.objects.get(user=alice)
    assert client.post(reverse("api_token_revoke", args=[token.pk])).status_code == 302
    assert get(Client(), "/conversations", secret).status_code == 401
    assert ApiToken.objects.get(pk=other.pk).revoked_at is None


def test_staff_see_tokens_in_admin_without_any_secret(client: Client) -> None:
    secret = token_for(make_user(username="alice"))
    client.force_login(make_user(username="admin", is_staff=True, is_superuser=True))
    listing = client.get(reverse("admin:api_apitoken_changelist")).content.decode()
    assert secret[:12] in listing and secret not in listing
    token = ApiToken.objects.get()
    assert token.token_hash not in listing
    done = client.post(
        reverse("admin:api_apitoken_changelist"),
        {"action": "revoke", "_selected_action": [token.pk]},
    )
    assert done.status_code == 302
    assert ApiToken.objects.get().revoked_at is not None


# --- the engine's refusals, as status codes -------------------------------------------------


def test_each_refusal_has_its_status_and_the_engines_message(client: Client) -> None:
    rita = make_reviewer()
    secret = token_for(rita)
    stale = approve(client, make_request(), secret, seen_hash="0" * 64)
    assert stale.status_code == 409 and stale.json()["code"] == "stale_arguments"
    assert "changed since this request was shown" in stale.json()["detail"]

    overdue = make_request(expires_at=timezone.now() - timedelta(minutes=1))
    expired = approve(client, overdue, secret)
    assert expired.status_code == 410 and expired.json()["code"] == "expired"

    withdrawn = make_request()
    runs.withdraw(withdrawn, withdrawn.run.conversation.owner)
    gone = approve(client, withdrawn, secret)
    assert gone.status_code == 410 and gone.json()["detail"].startswith("Withdrawn by")

    own = make_request(run=make_run(owner=rita))
    mine = approve(client, own, secret)
    assert mine.status_code == 403 and mine.json()["code"] == "needs_another_reviewer"
    # She may still reject it, with a message for the agent and a note for reviewers.
    body = {"action": "reject", "seen_hash": own.arguments_hash, "message": "no", "note": "n"}
    rejected = post(client, f"/requests/{own.pk}/decide", body, secret)
    assert rejected.status_code == 200 and rejected.json()["kind"] == "rejected"
    assert (rejected.json()["message"], rejected.json()["note"]) == ("no", "n")

    # An empty answer is invalid by the schema itself (`Respond.response`), before the engine.
    empty = {"action": "respond", "seen_hash": "x", "response": " \t\n"}
    answered = post(client, f"/requests/{make_request().pk}/decide", empty, secret)
    assert answered.status_code == 422 and answered.json()["code"] == "invalid"
    assert answered.json()["errors"][0]["loc"][-1] == "response"
    # A field of another action is invalid by the schema too.
    body = {"action": "approve", "seen_hash": "x", "message": "why"}
    mixed = post(client, f"/requests/{make_request().pk}/decide", body, secret)
    assert mixed.status_code == 422 and mixed.json()["code"] == "invalid"
    assert mixed.json()["errors"][0]["loc"][-1] == "message"
    assert get(client, "/requests/999999", secret).status_code == 404
    assert approve(client, ApprovalRequest(pk=999999, arguments_hash="x"), secret).status_code == (
        404
    )


def test_invalid_input_is_422_never_500(client: Client) -> None:
    secret = token_for(make_reviewer())
    request = make_request()
    path = f"/requests/{request.pk}/decide"
    for body in (
        "{not json",
        "[]",
        {"action": "approve"},  # no seen_hash
        {"action": "maybe", "seen_hash": "x"},
        {"action": "approve_edited", "seen_hash": "x"},  # no arguments
        {"action": "approve", "seen_hash": "x", "response": "y"},
        {"action": "reject", "seen_hash": "bad\x00hash"},
    ):
        response = post(client, path, body, secret)
        assert response.status_code == 422, (body, response.content)
        assert response.json()["code"] in ("invalid", "invalid_json")
    assert get(client, "/requests", secret, cursor="not a cursor").status_code == 422
    assert get(client, "/requests", secret, limit=101).status_code == 422
    assert get(client, "/requests/0", secret).status_code == 422
    assert get(client, f"/requests/{2**70}", secret).status_code == 422
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending


def test_an_invalid_body_is_located_where_the_caller_wrote_it(client: Client) -> None:
    """Under "body" alone: not under the handler's parameter as well (django-ninja reads a
    lone body parameter as {name: body}), nor under the decision's action (pydantic's tag for
    a member of the union)."""
    secret = token_for(make_reviewer())
    path = f"/requests/{make_request().pk}/decide"

    missing = post(client, path, {"action": "approve"}, secret).json()
    assert missing["detail"] == "body.seen_hash: Field required"
    assert missing["errors"] == [
        {"loc": ["body", "seen_hash"], "msg": "Field required", "type": "missing"}
    ]
    empty = post(client, path, {"action": "reject", "seen_hash": ""}, secret).json()
    assert empty["detail"] == "body.seen_hash: String should have at least 1 character"
    action = post(client, path, {"action": "maybe", "seen_hash": "x"}, secret).json()
    assert action["errors"][0]["loc"] == ["body"]
    assert action["detail"].startswith("body: Input tag 'maybe' found using 'action'")
    # The engine's words for a field of another action, or one the action needs, as before.
    mixed = post(client, path, {"action": "approve", "seen_hash": "x", "message": "m"}, secret)
    assert mixed.json()["detail"] == "`message` goes with reject only."
    assert mixed.json()["errors"][0]["loc"] == ["body", "message"]
    answer = post(client, path, {"action": "respond", "seen_hash": "x"}, secret).json()
    assert answer["detail"] == "respond needs the `response` the agent reads."
    assert answer["errors"][0]["loc"] == ["body", "response"]
    # A message to start a run: its body is read the same way.
    conversation = make_conversation(owner=make_user())
    runs_path = f"/conversations/{conversation.session_id}/runs"
    text = post(client, runs_path, {"text": ""}, token_for(conversation.owner)).json()
    assert text["errors"][0]["loc"] == ["body", "text"]
    assert text["detail"] == "body.text: String should have at least 1 character"
    # Elsewhere than the body, as django-ninja says it.
    limit = get(client, "/requests", secret, limit=101).json()
    assert limit["errors"][0]["loc"] == ["query", "limit"]


# --- paging ---------------------------------------------------------------------------------


def test_keyset_paging_is_stable_under_inserts(client: Client) -> None:
    secret = token_for(make_reviewer())
    start = timezone.now() - timedelta(hours=1)
    made = [make_request(created=start + timedelta(minutes=i)) for i in range(5)]
    # Two with the same instant: the id breaks the tie.
    made.append(make_request(created=made[-1].created))
    newest_first = sorted(made, key=lambda r: (r.created, r.pk), reverse=True)

    first = get(client, "/requests", secret, limit=4).json()
    assert [i["id"] for i in first["items"]] == [r.pk for r in newest_first[:4]]
    for _ in range(3):  # new requests arrive between the pages
        make_request()
    second = get(client, "/requests", secret, limit=4, cursor=first["next_cursor"]).json()
    assert [i["id"] for i in second["items"]] == [r.pk for r in newest_first[4:]]
    assert second["next_cursor"] is None
    agent = get(client, "/requests", secret, tool="nothing-like-it").json()
    assert agent == {"items": [], "next_cursor": None}


# --- runs and conversations -----------------------------------------------------------------


def test_it_starts_a_run_in_the_callers_conversation_once_at_a_time(
    client: Client, settings: Any
) -> None:
    alice = make_user(username="alice")
    secret = token_for(alice)
    conversation = make_conversation(owner=alice)
    others = make_conversation(owner=make_user(username="bob"))
    listed = get(client, "/conversations", secret).json()
    assert [c["id"] for c in listed["items"]] == [conversation.session_id]

    path = f"/conversations/{conversation.session_id}/runs"
    started = post(client, path, {"text": "where is order 42?"}, secret)
    assert started.status_code == 202, started.content
    run = AgentRun.objects.get(pk=started.json()["id"])
    assert (run.conversation, run.requested_by, run.input) == (
        conversation,
        alice,
        "where is order 42?",
    )
    assert started.json()["status"] == RunStatus.QUEUED and started.json()["output"] is None
    busy = post(client, path, {"text": "and order 7?"}, secret)
    assert busy.status_code == 409 and busy.json()["code"] == "busy"

    read = get(client, f"/runs/{run.pk}", secret)
    assert read.status_code == 200 and read.json()["conversation"] == conversation.session_id
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.COMPLETED, final_output="It ships today.", finished=timezone.now()
    )
    assert get(client, f"/runs/{run.pk}", secret).json()["output"] == "It ships today."

    # Another user's conversation and run are 404, answered as for ones that do not exist.
    theirs = post(client, f"/conversations/{others.session_id}/runs", {"text": "hi"}, secret)
    missing = post(client, "/conversations/conv_nope/runs", {"text": "hi"}, secret)
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json() == missing.json()
    their_run = AgentRun.objects.create(conversation=others, agent_name="support", input="x")
    assert get(client, f"/runs/{their_run.pk}", secret).status_code == 404

    # The message rate limit: 429 with Retry-After.
    settings.AGENTSITE_MESSAGES_PER_MINUTE = 1
    fresh = make_conversation(owner=alice)
    limited = post(client, f"/conversations/{fresh.session_id}/runs", {"text": "hi"}, secret)
    assert limited.status_code == 429 and int(limited["Retry-After"]) >= 1
    assert "too fast" in limited.json()["detail"]
    # A read token may not start runs.
    reader = token_for(alice, Scope.READ)
    assert post(client, path, {"text": "hi"}, reader).status_code == 403
    # One run started, of the one message taken.
    assert list(AgentRun.objects.filter(requested_by=alice)) == [run]


def test_the_session_works_too_and_needs_csrf_for_post() -> None:
    client = Client(enforce_csrf_checks=True)
    rita = make_reviewer()
    request = make_request()
    client.force_login(rita)
    assert get(client, "/requests").status_code == 200
    body = {"action": "approve", "seen_hash": request.arguments_hash}
    refused = post(client, f"/requests/{request.pk}/decide", body)
    assert refused.status_code == 403 and refused.json()["code"] == "csrf_failed"
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending
    client.get(reverse("api_tokens"))  # sets the CSRF cookie
    csrf = client.cookies["csrftoken"].value
    done = post(client, f"/requests/{request.pk}/decide", body, **{"X-CSRFToken": csrf})
    assert done.status_code == 200
    # A token needs no CSRF token, even beside a session.
    other = make_request()
    assert approve(client, other, token_for(rita)).status_code == 200


# --- through the engine, with real runs ----------------------------------------------------


def paused_wire(settings: Any) -> tuple[AgentRun, ApprovalRequest]:
    model = ScriptedModel(
        [
            [function_call("wire_money", {"account": "acme", "amount": 80}, call_id="call_a1")],
            [assistant_message("Done.", item_id="msg_a1")],
        ]
    )
    agent = Agent(name="Wire", model=model, tools=[scripted.wire_money])
    run = scripted.executed(scripted.start(settings, agent, "send 80 to acme"))
    return run, run.approval_requests.get()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_edit_then_approve_runs_the_tool_once_with_the_edit(client: Client, settings: Any) -> None:
    run, request = paused_wire(settings)
    secret = token_for(make_reviewer())
    detail = get(client, f"/requests/{request.pk}", secret).json()
    assert detail["allowed"]["editable"] is True
    assert "amount" in detail["arguments_schema"]["properties"]
    path = f"/requests/{request.pk}/decide"
    wrong = {"action": "approve_edited", "seen_hash": request.arguments_hash}
    refused = post(
        client, path, {**wrong, "arguments": {"account": "acme", "amount": "50"}}, secret
    )
    assert refused.status_code == 422 and "do not fit the tool" in refused.json()["detail"]
    edited = post(client, path, {**wrong, "arguments": {"account": "acme", "amount": 50}}, secret)
    assert edited.status_code == 200 and edited.json()["kind"] == DecisionKind.EDITED
    assert edited.json()["edited_arguments"] == {"account": "acme", "amount": 50}
    asyncio.run(runs.resume(run.pk))
    asyncio.run(runs.resume(run.pk))
    assert scripted.EXECUTED == [("wire_money", ("acme", 50))]
    done = get(client, f"/runs/{run.pk}", secret).json()
    assert done["status"] == RunStatus.COMPLETED and done["output"] == "Done."
    assert [r["status"] for r in done["requests"]] == [ApprovalStatus.APPROVED]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_registry")
def test_an_answer_as_the_tool_never_runs_it(client: Client, settings: Any) -> None:
    run, request = paused_wire(settings)
    secret = token_for(make_reviewer())
    body = {"action": "respond", "seen_hash": request.arguments_hash, "response": "Sent by hand."}
    answered = post(client, f"/requests/{request.pk}/decide", body, secret)
    assert answered.status_code == 200 and answered.json()["kind"] == DecisionKind.RESPONDED
    asyncio.run(runs.resume(run.pk))
    assert scripted.EXECUTED == []
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED


def test_the_conversations_list_titles_each_as_the_chats_list_does(client: Client) -> None:
    """A conversation the owner never named reads as its first message, as on the chats
    page (it read "" before); a named one by its name; an empty one ""."""
    alice = make_user(username="alice")
    secret = token_for(alice)
    named = make_conversation(owner=alice, title="Order 42")
    talked = make_conversation(owner=alice)
    SessionItem.objects.create(
        conversation=talked, payload={"role": "user", "content": "Where is order 7? " * 10}
    )
    SessionItem.objects.create(
        conversation=talked, payload={"role": "user", "content": "And order 8?"}
    )
    empty = make_conversation(owner=alice)
    listed = {c["id"]: c["title"] for c in get(client, "/conversations", secret).json()["items"]}
    assert listed[named.session_id] == "Order 42"
    assert listed[talked.session_id].startswith("Where is order 7? Where is order 7?")
    assert len(listed[talked.session_id]) <= 80
    assert listed[empty.session_id] == ""
