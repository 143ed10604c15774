"""A decision is one typed value (`runs.Decision`), validated once: which texts go with which
action (`runs.FIELDS`), what each action is in the audit, and the one rule on whether a
call may be edited (`runs.edit_refusal`), as the inbox's form, the API and the engine read
them."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from approvals.models import (
    REQUEST_STATUS,
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    ToolKind,
)
from engine import runs
from tests.api.test_endpoints import post, token_for
from tests.factories import make_request, make_reviewer

pytestmark = pytest.mark.django_db

Action = runs.Action


@pytest.mark.parametrize(
    ("action", "kind", "approves", "always"),
    [
        (Action.APPROVE, DecisionKind.APPROVED, True, False),
        (Action.APPROVE_ALWAYS, DecisionKind.APPROVED, True, True),
        (Action.REJECT, DecisionKind.REJECTED, False, False),
        (Action.RESPOND, DecisionKind.RESPONDED, False, False),
        (Action.APPROVE_EDITED, DecisionKind.APPROVED, True, False),
    ],
)
def test_each_action_is_one_kind_in_the_audit(
    action: Action, kind: DecisionKind, approves: bool, always: bool
) -> None:
    given = {"response": "done", "arguments": {"order_id": 7}}
    needed = {name: value for name, value in given.items() if name in runs.FIELDS[action]}
    decision = runs.Decision.of(action, **needed)
    assert (decision.kind, decision.approves, decision.always) == (kind, approves, always)
    assert kind.approves == approves


def test_every_kind_gives_its_request_one_status() -> None:
    assert set(REQUEST_STATUS) == set(DecisionKind)
    assert {kind: kind.status for kind in DecisionKind} == {
        DecisionKind.APPROVED: ApprovalStatus.APPROVED,
        DecisionKind.EDITED: ApprovalStatus.APPROVED,
        DecisionKind.EXPIRY_APPROVED: ApprovalStatus.APPROVED,
        DecisionKind.REJECTED: ApprovalStatus.REJECTED,
        DecisionKind.RESPONDED: ApprovalStatus.RESPONDED,
        DecisionKind.WITHDRAWN: ApprovalStatus.WITHDRAWN,
        DecisionKind.EXPIRED: ApprovalStatus.EXPIRED,
    }
    assert [kind for kind in DecisionKind if kind.approves] == [
        DecisionKind.APPROVED,
        DecisionKind.EDITED,
        DecisionKind.EXPIRY_APPROVED,
    ]


@pytest.mark.parametrize(
    ("action", "given", "said"),
    [
        (Action.APPROVE, {"message": "fine"}, "`message` goes with reject only."),
        (Action.RESPOND, {"arguments": {"a": 1}, "response": "x"}, "`arguments` goes with"),
        (Action.REJECT, {"response": "x"}, "`response` goes with respond only."),
        (Action.APPROVE_EDITED, {}, "approve_edited needs the edited `arguments`."),
        (Action.RESPOND, {}, "respond needs the `response` the agent reads."),
        ("maybe", {}, "'maybe' is not a decision"),
        (Action.APPROVE_EDITED, {"arguments": [1]}, "The edited `arguments` are an object"),
    ],
)
def test_a_decision_whose_texts_do_not_fit_its_action_is_refused(
    action: str, given: dict[str, Any], said: str
) -> None:
    with pytest.raises(runs.UnfitDecision) as refused:
        runs.Decision.of(action, **given)
    assert str(refused.value).startswith(said)


def test_a_form_posting_every_box_keeps_only_what_goes_with_the_button() -> None:
    posted = {"message": "no, wait", "note": "checked with the warehouse", "response": ""}
    decision = runs.Decision.of(Action.APPROVE, strict=False, **posted)
    assert (decision.message, decision.note, decision.response) == (
        "",
        "checked with the warehouse",
        "",
    )
    rejection = runs.Decision.of(Action.REJECT, strict=False, **posted)
    assert (rejection.message, rejection.note) == ("no, wait", "checked with the warehouse")


def test_an_answer_as_the_tool_is_neither_empty_nor_too_long_and_texts_are_trimmed() -> None:
    with pytest.raises(runs.InvalidDecision, match="it is empty"):
        runs.Decision.respond("  \n ")
    with pytest.raises(runs.InvalidDecision, match="too long"):
        runs.Decision.respond("x" * (runs.MAX_RESPONSE_CHARS + 1))
    assert runs.Decision.respond("  done \n").response == "done"
    long = runs.Decision.reject("m" * (runs.MAX_MESSAGE_CHARS + 5), note="  n  ")
    assert (len(long.message), long.note) == (runs.MAX_MESSAGE_CHARS, "n")


def test_the_inbox_keeps_a_note_with_an_approval_and_no_message_the_agent_never_reads(
    client: Client,
) -> None:
    request = make_request()
    client.force_login(make_reviewer())
    response = client.post(
        reverse("inbox_decide", args=[request.pk]),
        {
            "action": "approve",
            "seen_hash": request.arguments_hash,
            "message": "typed before choosing to approve",
            "note": "checked with the warehouse",
        },
    )
    assert response.status_code == 302
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.kind, decision.message, decision.note) == (
        DecisionKind.APPROVED,
        "",
        "checked with the warehouse",
    )


def test_the_api_takes_a_note_with_any_action_and_a_message_with_a_rejection_only(
    client: Client,
) -> None:
    secret = token_for(make_reviewer())
    request = make_request()
    path = f"/requests/{request.pk}/decide"
    refused = post(
        client,
        path,
        {"action": "approve", "seen_hash": request.arguments_hash, "message": "fine"},
        secret,
    )
    # Invalid by the API's schema (one per action), said in the engine's words.
    assert refused.status_code == 422
    assert refused.json()["detail"] == "`message` goes with reject only."
    assert refused.json()["code"] == "invalid"
    assert refused.json()["errors"][0]["type"] == "extra_forbidden"
    lacking = post(client, path, {"action": "respond", "seen_hash": request.arguments_hash}, secret)
    assert lacking.status_code == 422
    assert lacking.json()["detail"] == "respond needs the `response` the agent reads."
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending

    approved = post(
        client,
        path,
        {"action": "approve", "seen_hash": request.arguments_hash, "note": "called the customer"},
        secret,
    )
    assert approved.status_code == 200, approved.content
    assert (approved.json()["kind"], approved.json()["note"]) == ("approved", "called the customer")


def test_whether_a_call_may_be_edited_is_one_rule() -> None:
    function = make_request()
    assert runs.edit_refusal(function) == ""

    mcp = make_request(kind=ToolKind.MCP, server="warehouse")
    assert runs.edit_refusal(mcp) == (
        "The arguments of cancel_order, a tool of the MCP server “warehouse”, can be edited "
        "only once the deployment declares the tool (review(server, tool_name=...)): approve "
        "or reject the call as it is."
    )
    shell = make_request(kind=ToolKind.SHELL)
    assert runs.edit_refusal(shell).startswith("Only a function tool's arguments can be edited")
    tampered = make_request()
    ApprovalRequest.objects.filter(pk=tampered.pk).update(arguments={"order_id": 43})
    assert "changed outside agentsite" in runs.edit_refusal(
        ApprovalRequest.objects.select_related("run").get(pk=tampered.pk)
    )
    # The demo's cancel_order lets reviewers edit; a tool whose author forbids it does not.
    forbidden = make_request(tool_name="no_such_tool")
    assert "cannot be edited (its author does not allow it)" in runs.edit_refusal(forbidden)
