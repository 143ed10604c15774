"""Edit, then approve (`engine/runs/edits.py`). A form generated from the
tool's JSON schema, prefilled with the model's arguments and checked against the schema; the
tool runs once with the edited arguments; the session, the trace and the audit show them; and
the signature, argument-hash and exactly-once checks hold for edited calls."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from django import forms
from django.test import Client
from django.urls import reverse

from approvals.forms import ArgumentsForm
from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalStatus,
    DecisionKind,
    arguments_hash,
)
from conversations.models import SessionItem
from conversations.session import DjangoSession
from engine import registry, runs
from engine.models import AgentRun, RunStatus
from tests import scripted
from tests.factories import make_reviewer, make_user
from tracing.models import Span

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_registry", "submitted"),
]

ASKED = {"account": "acme", "amount": 80}
EDITED = {"account": "acme", "amount": 50}


@registry.review(risk="irreversible", editable=False)
@function_tool(needs_approval=True)
def locked_wire(account: str, amount: int) -> str:
    """Send money; its author forbids edits."""
    scripted.EXECUTED.append(("locked_wire", (account, amount)))
    return f"sent {amount} to {account}"


def text(response: Any) -> str:
    return str(response.content.decode())


def paused(
    settings: Any, tool: Any = scripted.wire_money, owner: Any = None
) -> tuple[AgentRun, ApprovalRequest, ScriptedModel]:
    model = ScriptedModel(
        [
            [function_call(tool.name, ASKED, call_id="call_e1")],
            [assistant_message("Sent.", item_id="msg_e1")],
        ]
    )
    agent = Agent(name="Wire", model=model, tools=[tool])
    run = scripted.executed(scripted.start(settings, agent, "send 80 to acme", owner))
    return run, run.approval_requests.get(), model


def post_edit(client: Client, request: ApprovalRequest, **arguments: Any) -> Any:
    data = {"action": "approve_edited", "seen_hash": request.arguments_hash}
    data.update({f"arg-{name}": value for name, value in arguments.items()})
    return client.post(reverse("inbox_decide", args=[request.pk]), data)


def calls(items: list[Any], call_id: str = "call_e1") -> list[Any]:
    return [
        json.loads(item["arguments"])
        for item in items
        if isinstance(item, dict)
        and item.get("type") == "function_call"
        and item.get("call_id") == call_id
    ]


def test_the_tool_runs_once_with_the_edited_arguments_and_everything_shows_them(
    client: Client, settings: Any, traces: Any
) -> None:
    run, request, model = paused(settings)
    rita = make_reviewer()
    client.force_login(rita)
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    # The form comes from the tool's schema, prefilled with the model's arguments.
    assert 'name="arg-account" value="acme"' in page
    assert 'type="number" name="arg-amount" value="80"' in page
    assert "Approve with these arguments" in page

    assert post_edit(client, request, account="acme", amount="50").status_code == 302
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.kind, decision.approved, decision.reviewer) == (
        DecisionKind.EDITED,
        True,
        rita,
    )
    # The audit: the model's arguments (on the request) and their hash, the reviewer's and theirs.
    assert ApprovalRequest.objects.get(pk=request.pk).arguments == ASKED
    assert decision.arguments_hash == arguments_hash(ASKED) == request.arguments_hash
    assert decision.edited_arguments == EDITED
    assert decision.edited_arguments_hash == arguments_hash(EDITED)
    assert len(decision.edit_signature) == 64
    # The saved state is untouched: it still verifies, and still holds the model's call.
    stored = AgentRun.objects.get(pk=run.pk)
    assert stored.state_signature == runs.sign_state(stored.state)
    # While it resumes, the chat says what was approved: the call as it will run.
    client.force_login(run.conversation.owner)
    chat = text(client.get(reverse("chat", args=[run.conversation.session_id])))
    assert "amount=50" in chat
    assert "amount=80" not in chat
    client.force_login(rita)

    asyncio.run(runs.resume(run.pk))
    done = AgentRun.objects.get(pk=run.pk)
    assert done.status == RunStatus.COMPLETED, done.error
    assert scripted.EXECUTED == [("wire_money", ("acme", 50))]
    # The model's next input holds the call that ran, and its output.
    assert calls(list(model.last_call.input)) == [EDITED]
    assert "sent 50 to acme" in json.dumps(model.last_call.input)
    # The conversation's history shows the call that ran, once.
    history = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    assert calls(history) == [EDITED]
    outputs = [i for i in history if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == ["sent 50 to acme"]
    assert history[-1]["role"] == "assistant"

    traces.flush()
    functions = Span.objects.filter(trace_id=run.trace_id, span_type="function")
    # The model's call as it paused (no output), then the call that ran: the edited one.
    ran = [(json.loads(f.span_data["input"]), f.span_data["output"]) for f in functions]
    assert len(ran) == 2 and (ASKED, None) in ran and (EDITED, "sent 50 to acme") in ran
    [span] = Span.objects.filter(trace_id=run.trace_id, name="approval decision")
    assert span.data["decision"] == "edit and approve"
    assert span.data["arguments_hash"] == arguments_hash(ASKED)
    assert span.data["edited_arguments_hash"] == arguments_hash(EDITED)
    assert span.data["edited_arguments"] == EDITED

    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert "Arguments edited by rita" in page
    # (In the order stored: PostgreSQL's jsonb keeps its own.)
    ran_with = page[page.index("data-edited-call") :].split("</code>")[0]
    assert "amount=50" in ran_with and "account=&quot;acme&quot;" in ran_with
    assert "The model asked" in page and "amount=80" in page
    listing = text(client.get(reverse("inbox_history")))
    assert ">edited</span>" in listing and "amount=50" in listing


def test_edits_that_do_not_fit_the_schema_are_refused_and_decide_nothing(
    client: Client, settings: Any
) -> None:
    run, request, _ = paused(settings)
    rita = make_reviewer()
    client.force_login(rita)
    wrong = post_edit(client, request, account="acme", amount="a lot")
    assert wrong.status_code == 400 and "Enter a whole number." in text(wrong)
    missing = post_edit(client, request, account="acme")
    assert missing.status_code == 400 and "This field is required." in text(missing)
    row = client.post(
        reverse("inbox_decide", args=[request.pk]),
        {"action": "approve_edited", "seen_hash": request.arguments_hash, "arg-amount": "x"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET=f"request-{request.pk}",
    )
    assert "Enter a whole number." in text(row)

    # The engine checks the schema itself, whoever calls it.
    for bad in ({"account": "acme", "amount": "50"}, {**EDITED, "to": "me"}, {"amount": 5}):
        with pytest.raises(runs.DecisionRefused, match="do not fit the tool"):
            runs.decide(request, rita, runs.Decision.edit(bad))
    assert not ApprovalDecision.objects.exists()
    assert ApprovalRequest.objects.get(pk=request.pk).is_pending
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.WAITING


def test_unchanged_arguments_are_a_plain_approval(client: Client, settings: Any) -> None:
    run, request, _ = paused(settings)
    client.force_login(make_reviewer())
    assert post_edit(client, request, account="acme", amount="80").status_code == 302
    decision = ApprovalDecision.objects.get(request=request)
    assert (decision.kind, decision.edited_arguments, decision.edit_signature) == (
        DecisionKind.APPROVED,
        None,
        "",
    )
    asyncio.run(runs.resume(run.pk))
    assert scripted.EXECUTED == [("wire_money", ("acme", 80))]


def test_a_tool_whose_author_forbids_edits_offers_no_form_and_refuses_one(
    client: Client, settings: Any
) -> None:
    run, request, _ = paused(settings, tool=locked_wire)
    rita = make_reviewer()
    client.force_login(rita)
    page = text(client.get(reverse("inbox_request", args=[request.pk])))
    assert "Approve with these arguments" not in page and 'name="arg-amount"' not in page
    inbox = text(client.get(reverse("inbox")))
    assert "Edit, then approve" not in inbox
    refused = post_edit(client, request, account="acme", amount="50")
    assert refused.status_code == 400 and "cannot be edited" in text(refused)
    with pytest.raises(runs.DecisionRefused, match="cannot be edited"):
        runs.decide(request, rita, runs.Decision.edit(EDITED))
    assert not ApprovalDecision.objects.exists()
    assert scripted.EXECUTED == []


def test_an_edit_by_someone_without_the_permission_executes_nothing(
    client: Client, settings: Any, submitted: list
) -> None:
    run, request, _ = paused(settings)
    mallory = make_user(username="mallory")
    client.force_login(mallory)
    assert post_edit(client, request, account="mallory", amount="5000").status_code == 403
    with pytest.raises(runs.DecisionRefused, match="not allowed"):
        runs.decide(request, mallory, runs.Decision.edit({"account": "mallory", "amount": 5000}))
    # Nor by a reviewer in her own conversation (separation of duties holds for edits).
    rita = make_reviewer()
    own_run, own_request, _ = paused(settings, owner=rita)
    with pytest.raises(runs.NeedsAnotherReviewer):
        runs.decide(own_request, rita, runs.Decision.edit(EDITED))

    assert not ApprovalDecision.objects.exists()
    assert [job for job in submitted if job[0] == "resume"] == []
    asyncio.run(runs.resume(run.pk))  # not decided: not resuming, nothing runs
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.WAITING
    assert scripted.EXECUTED == []


def test_a_replayed_edit_or_a_resume_run_twice_executes_once(
    client: Client, settings: Any, submitted: list
) -> None:
    run, request, _ = paused(settings)
    client.force_login(make_reviewer())
    assert post_edit(client, request, account="acme", amount="50").status_code == 302
    again = post_edit(client, request, account="acme", amount="60")
    assert again.status_code == 302  # back to the page, with the refusal as its message
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert ApprovalDecision.objects.get(request=request).edited_arguments == EDITED
    with pytest.raises(runs.AlreadyDecided):
        runs.decide(request, make_reviewer(), runs.Decision.edit({"account": "acme", "amount": 60}))
    assert [job for job in submitted if job[0] == "resume"] == [("resume", run.pk)]
    saved = AgentRun.objects.filter(pk=run.pk).values("state", "state_signature").get()

    asyncio.run(runs.resume(run.pk))
    asyncio.run(runs.resume(run.pk))
    assert scripted.EXECUTED == [("wire_money", ("acme", 50))]
    # A copy of the paused state written back, and the run set to resume again: refused.
    AgentRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RESUMING, state_consumed=False, finished=None, **saved
    )
    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.FAILED
    assert scripted.EXECUTED == [("wire_money", ("acme", 50))]
    history = asyncio.run(DjangoSession(run.conversation.session_id).get_items())
    assert calls(history) == [EDITED]


@pytest.mark.parametrize("forged_hash", [False, True])
def test_a_tampered_edit_fails_closed(client: Client, settings: Any, forged_hash: bool) -> None:
    run, request, _ = paused(settings)
    client.force_login(make_reviewer())
    assert post_edit(client, request, account="acme", amount="50").status_code == 302
    changed = {"account": "mallory", "amount": 5000}
    tampered: dict[str, Any] = {"edited_arguments": changed}
    if forged_hash:  # the hash recomputed to match: the site's signature still does not
        tampered["edited_arguments_hash"] = arguments_hash(changed)
    ApprovalDecision.objects.filter(request=request).update(**tampered)

    asyncio.run(runs.resume(run.pk))
    failed = AgentRun.objects.get(pk=run.pk)
    assert failed.status == RunStatus.FAILED
    assert "changed outside agentsite" in failed.error and "nothing was executed" in failed.error
    assert scripted.EXECUTED == []


def test_an_edit_moved_to_another_call_fails_closed(client: Client, settings: Any) -> None:
    """A signed edit copied onto another request's decision does not verify there."""
    run, request, _ = paused(settings)
    client.force_login(make_reviewer())
    assert post_edit(client, request, account="acme", amount="50").status_code == 302
    decision = ApprovalDecision.objects.get(request=request)
    # The signature names its request, run, pause, call and reviewer: another reviewer's
    # name on it (the audit rewritten) no longer verifies.
    ApprovalDecision.objects.filter(pk=decision.pk).update(reviewer=make_user(username="eve"))
    asyncio.run(runs.resume(run.pk))
    failed = AgentRun.objects.get(pk=run.pk)
    assert failed.status == RunStatus.FAILED and "changed outside agentsite" in failed.error
    assert scripted.EXECUTED == []
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.APPROVED


# --- the form, from the schema ----------------------------------------------------------------


@function_tool
def ship(
    method: Literal["post", "courier"],
    express: bool,
    note: str,
    order_id: int | None,
    weight: float,
    tags: list[str],
) -> str:
    """Ship a parcel."""
    return "shipped"


def ship_sheet() -> registry.ToolSheet:
    schema = ship.params_json_schema
    return registry.ToolSheet(
        name="ship",
        found=True,
        description="",
        properties=list(schema["properties"].items()),
        review=registry.Review(),
        schema=schema,
    )


SHIPPED = {
    "method": "post",
    "express": False,
    "note": "Leave it\nat the door",
    "order_id": None,
    "weight": 1.5,
    "tags": ["fragile"],
}


def test_the_form_has_a_field_per_property_typed_from_the_schema() -> None:
    form = ArgumentsForm(ship_sheet(), SHIPPED)
    fields = form.fields
    assert list(fields) == ["method", "express", "note", "order_id", "weight", "tags"]
    method = fields["method"]
    assert isinstance(method, forms.TypedChoiceField)
    assert [value for value, _ in method.choices] == ['"post"', '"courier"']
    assert fields["method"].required and fields["express"].required
    assert isinstance(fields["note"].widget, forms.Textarea)  # it has a line break
    assert isinstance(fields["order_id"], forms.IntegerField) and not fields["order_id"].required
    assert isinstance(fields["tags"], forms.JSONField)
    html = form.as_div()
    assert 'name="arg-note"' in html and "Leave it\nat the door</textarea>" in html


def test_the_form_gives_the_edited_arguments_and_checks_them_against_the_schema() -> None:
    data = {
        "arg-method": '"courier"',
        "arg-express": "true",
        "arg-note": "Ring twice\r\nthen wait",
        "arg-order_id": "",
        "arg-weight": "2",
        "arg-tags": '["fragile", "heavy"]',
    }
    form = ArgumentsForm(ship_sheet(), SHIPPED, data=data)
    assert form.is_valid(), form.errors
    assert form.edited == {
        "method": "courier",
        "express": True,
        "note": "Ring twice\nthen wait",
        "order_id": None,
        "weight": 2,
        "tags": ["fragile", "heavy"],
    }
    wrong = ArgumentsForm(ship_sheet(), SHIPPED, data={**data, "arg-tags": '[1, "heavy"]'})
    assert not wrong.is_valid()
    assert "tags.0: 1 is not of type 'string'" in wrong.non_field_errors()
    outside = ArgumentsForm(ship_sheet(), SHIPPED, data={**data, "arg-method": '"drone"'})
    assert not outside.is_valid() and "method" in outside.errors


@pytest.mark.parametrize("encrypted", [False, True])
def test_the_session_gets_the_edited_call_in_place_in_one_transaction(
    client: Client, settings: Any, encrypted: bool
) -> None:
    if encrypted:
        from cryptography.fernet import Fernet

        settings.AGENTSITE_SESSION_ENCRYPTION_KEY = Fernet.generate_key().decode()
    run, request, _ = paused(settings)
    session_id = run.conversation.session_id
    before = list(
        SessionItem.objects.filter(conversation=run.conversation).values_list("pk", flat=True)
    )
    client.force_login(make_reviewer())
    assert post_edit(client, request, account="acme", amount="50").status_code == 302

    # A rewrite that fails half way changes nothing: all of it is one transaction.
    from conversations.session import open_session, rewrite_items

    def fails_late(item: Any) -> Any:
        if item.get("role") == "user":
            raise RuntimeError("the process ends here")
        return {**item, "arguments": "{}"} if item.get("type") == "function_call" else None

    with pytest.raises(RuntimeError):
        asyncio.run(rewrite_items(open_session(session_id), fails_late, 50))
    assert calls(asyncio.run(open_session(session_id).get_items())) == [ASKED]

    asyncio.run(runs.resume(run.pk))
    assert AgentRun.objects.get(pk=run.pk).status == RunStatus.COMPLETED
    history = asyncio.run(open_session(session_id).get_items())
    assert calls(history) == [EDITED]
    # The same rows, in the same order, the call's row rewritten where it was; new rows after.
    after = list(
        SessionItem.objects.filter(conversation=run.conversation).values_list("pk", flat=True)
    )
    assert after[: len(before)] == before
    if encrypted:
        stored = SessionItem.objects.filter(conversation=run.conversation).values_list(
            "payload", flat=True
        )
        assert all("acme" not in json.dumps(payload) for payload in stored)
