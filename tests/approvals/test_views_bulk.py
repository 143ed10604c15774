"""Bulk decisions in the inbox (`approvals/views.py`), through the Django test client: a bulk
decision is two POSTs. The first answers with a confirmation that lists, from the database,
exactly the selected requests (tool, arguments, risk) and decides nothing; only the second,
carrying the same ids and hashes and the confirmation's token, decides. Whatever changed in
between is reported per row."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, arguments_hash
from engine import runs
from tests.factories import make_request, make_reviewer, make_run

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
URL = "/inbox/decide/"


def text(response: Any) -> str:
    return str(response.content.decode())


def selection(action: str, *requests: ApprovalRequest, **extra: Any) -> dict[str, Any]:
    """What the inbox's bulk form posts: the ticked ids and the hashes shown beside them."""
    data: dict[str, Any] = {"action": action, "ids": [r.pk for r in requests], **extra}
    data.update({f"hash-{r.pk}": r.arguments_hash for r in requests})
    return data


def listed_ids(html: str) -> list[int]:
    """The requests a confirmation says will be decided, in its order."""
    return [int(pk) for pk in re.findall(r'id="confirm-request-(\d+)"', html)]


def set_aside_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'id="set-aside-(\d+)"', html)]


def confirmation_data(html: str) -> dict[str, Any]:
    """The fields of the confirmation's form, as a browser would post them."""
    form = re.search(r"<form[^>]*data-bulk-confirm-form.*?</form>", html, re.S)
    assert form, html
    data: dict[str, Any] = {"ids": []}
    for name, value in re.findall(
        r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form.group(0)
    ):
        if name == "ids":
            data["ids"].append(value)
        else:
            data[name] = value
    return data


def refunds(count: int) -> list[ApprovalRequest]:
    return [
        make_request(tool_name="issue_refund", arguments={"order_id": 40 + n, "amount": 80})
        for n in range(count)
    ]


def test_it_asks_to_confirm_exactly_the_selected_requests_and_decides_nothing_yet(
    client: Client, rita: Any
) -> None:
    refund, other_refund = refunds(2)
    email = make_request(
        tool_name="send_email", arguments={"to": "a@example.com", "subject": "Hi", "body": "x"}
    )
    cancel = make_request(tool_name="cancel_order", arguments={"order_id": 46})

    response = client.post(URL, selection("approve", refund, email, cancel))

    assert response.status_code == 200
    html = text(response)
    # As selected, no other row, in the inbox's order (newest first).
    assert listed_ids(html) == [cancel.pk, email.pk, refund.pk]
    assert other_refund.pk not in listed_ids(html)
    assert "Approve 3 requests?" in html
    # What will run, for people: the tool, its labelled arguments, its risk.
    block = html[html.index(f'id="confirm-request-{refund.pk}"') :]
    assert "issue_refund" in block
    assert "$80.00" in block[: block.index("</li>")]
    assert "risk: " in block[: block.index("</li>")]
    assert ApprovalDecision.objects.count() == 0
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {"pending"}


def test_confirming_decides_each_listed_request_through_the_engine(
    client: Client, rita: Any
) -> None:
    first, second, third = refunds(3)
    html = text(client.post(URL, selection("approve", first, third)))

    response = client.post(URL, confirmation_data(html), follow=True)

    assert "Approved 2 requests." in text(response)
    approved = ApprovalDecision.objects.filter(reviewer=rita, approved=True)
    assert sorted(approved.values_list("request_id", flat=True)) == [first.pk, third.pk]
    assert ApprovalRequest.objects.get(pk=second.pk).is_pending
    # A second click on the same confirmation decides nothing twice: it is reported.
    again = client.post(URL, confirmation_data(html), follow=True)
    assert "Already approved by rita" in text(again)
    assert ApprovalDecision.objects.count() == 2


def test_the_confirmed_ids_must_be_exactly_the_listed_ones(client: Client, rita: Any) -> None:
    first, second, third = refunds(3)
    data = confirmation_data(text(client.post(URL, selection("approve", first, second))))

    for ids in ([first.pk, second.pk, third.pk], [first.pk]):
        tampered = {**data, "ids": ids, f"hash-{third.pk}": third.arguments_hash}
        response = client.post(URL, tampered)
        html = text(response)
        assert response.status_code == 200
        assert "does not match the requests it listed" in html
        # A fresh confirmation of what was posted, which still needs confirming.
        assert listed_ids(html) == sorted(ids, reverse=True)
    # The action is part of what was confirmed, and the hashes too.
    assert "does not match" in text(client.post(URL, {**data, "action": "reject"}))
    swapped = {**data, f"hash-{first.pk}": arguments_hash({"order_id": 1})}
    assert "does not match" in text(client.post(URL, swapped))
    assert "does not match" in text(client.post(URL, {**data, "confirm": data["confirm"] + "x"}))
    assert ApprovalDecision.objects.count() == 0


def test_another_reviewers_confirmation_decides_nothing(client: Client, rita: Any) -> None:
    first = refunds(1)[0]
    data = confirmation_data(text(client.post(URL, selection("approve", first))))
    client.force_login(make_reviewer("bob"))

    assert "does not match" in text(client.post(URL, data))
    assert ApprovalDecision.objects.count() == 0


def test_a_request_decided_elsewhere_between_the_two_steps_is_reported(
    client: Client, rita: Any
) -> None:
    first, second = refunds(2)
    data = confirmation_data(text(client.post(URL, selection("approve", first, second))))
    runs.decide(second, make_reviewer("bob"), runs.Decision.reject("Too much."))

    response = client.post(URL, data, **HTMX)

    assert response.status_code == 200
    html = text(response)
    assert "Approved 1 request. 1 could not be decided." in html
    assert "Already rejected by bob at " in html
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.APPROVED
    assert ApprovalRequest.objects.get(pk=second.pk).status == ApprovalStatus.REJECTED
    assert not ApprovalDecision.objects.filter(request=second, reviewer=rita).exists()


def test_a_request_whose_arguments_changed_between_the_two_steps_is_not_decided(
    client: Client, rita: Any
) -> None:
    first, second = refunds(2)
    data = confirmation_data(text(client.post(URL, selection("approve", first, second))))
    changed = {"order_id": second.arguments["order_id"], "amount": 8000}
    ApprovalRequest.objects.filter(pk=second.pk).update(
        arguments=changed, arguments_hash=arguments_hash(changed)
    )

    response = client.post(URL, data, follow=True)

    assert "The arguments changed since this request was shown to you" in text(response)
    assert ApprovalRequest.objects.get(pk=second.pk).is_pending
    assert ApprovalRequest.objects.get(pk=first.pk).status == ApprovalStatus.APPROVED


def test_what_changed_before_the_confirmation_is_set_apart_not_listed(
    client: Client, rita: Any
) -> None:
    fine, changed, decided, own = refunds(4)
    ApprovalRequest.objects.filter(pk=own.pk).update(run=make_run(owner=rita))
    data = selection("approve", fine, changed, decided, own)
    data["ids"].append(999999)
    data[f"hash-{changed.pk}"] = arguments_hash({"order_id": 1})  # not what the inbox shows now
    runs.decide(decided, make_reviewer("bob"), runs.Decision.approve())

    html = text(client.post(URL, data))

    assert listed_ids(html) == [fine.pk]
    assert set_aside_ids(html) == [own.pk, decided.pk, changed.pk, 999999]
    assert "Approve 1 request?" in html
    assert "4 of the 5 selected will not be approved" in html
    assert "changed since the inbox showed" in html
    assert "Already approved by bob" in html
    assert "another reviewer must approve" in html
    assert "Request #999999 does not exist." in html
    assert confirmation_data(html)["ids"] == [str(fine.pk)]
    assert ApprovalDecision.objects.filter(reviewer=rita).count() == 0


def test_a_request_answered_as_the_tool_is_set_apart_in_the_engine_s_words(
    client: Client, rita: Any
) -> None:
    fine, answered = refunds(2)
    runs.decide(answered, make_reviewer("bob"), runs.Decision.respond("Refund issued by hand."))

    html = text(client.post(URL, selection("approve", fine, answered)))

    assert listed_ids(html) == [fine.pk]
    assert set_aside_ids(html) == [answered.pk]
    assert "Already answered as the tool by bob" in html


def test_her_own_request_is_refused_per_row_in_the_result(
    client: Client, rita: Any, settings: Any
) -> None:
    other = refunds(1)[0]
    own = make_request(run=make_run(owner=rita), tool_name="issue_refund")
    # Listed while self-approval was allowed, confirmed after it was turned off.
    settings.AGENTSITE_SELF_APPROVAL = True
    data = confirmation_data(text(client.post(URL, selection("approve", other, own))))
    settings.AGENTSITE_SELF_APPROVAL = False

    response = client.post(URL, data, **HTMX)

    assert response.status_code == 200
    assert "Approved 1 request. 1 could not be decided." in text(response)
    assert "another reviewer must approve" in text(response)
    assert ApprovalRequest.objects.get(pk=own.pk).is_pending


def test_a_bulk_rejection_carries_a_message_for_the_agent_and_a_note_for_reviewers(
    client: Client, rita: Any
) -> None:
    first, second = refunds(2)
    own = make_request(run=make_run(owner=rita), tool_name="issue_refund")
    html = text(client.post(URL, selection("reject", first, second, own)))
    # She may reject her own call; the confirmation asks for the message and the note.
    assert listed_ids(html) == [own.pk, second.pk, first.pk]
    assert "Reject 3 requests?" in html
    assert "Message to the agent" in html
    assert "Internal note" in html

    data = confirmation_data(html)
    data.update(message="  Refunds above 50 need a manager.  ", note="Fraud wave, see #ops.")
    response = client.post(URL, data, follow=True)

    assert "Rejected 3 requests." in text(response)
    decisions = ApprovalDecision.objects.filter(reviewer=rita)
    assert decisions.count() == 3
    assert {(d.approved, d.message, d.note) for d in decisions} == {
        (False, "Refunds above 50 need a manager.", "Fraud wave, see #ops.")
    }


def test_over_htmx_the_confirmation_is_a_fragment_and_the_result_updates_the_rows(
    client: Client, rita: Any
) -> None:
    first, second = refunds(2)

    asked = client.post(URL, selection("approve", first, second), **HTMX)

    html = text(asked)
    assert "<html" not in html
    assert asked.headers["HX-Retarget"] == "#bulk-confirm"  # the inbox's dialog
    assert listed_ids(html) == [second.pk, first.pk]
    assert "data-bulk-cancel" in html  # cancelling closes the dialog; nothing is posted
    decided = text(client.post(URL, confirmation_data(html), **HTMX))
    assert "Approved 2 requests." in decided
    for request in (first, second):
        assert f'<li id="request-{request.pk}" class="row row-decided is-approved"' in decided


def test_without_javascript_the_confirmation_is_a_page_with_a_way_back(
    client: Client, rita: Any
) -> None:
    first = refunds(1)[0]
    response = client.post(URL, selection("approve", first, next="/inbox/?tool=issue_refund"))
    html = text(response)
    assert "<html" in html
    assert 'href="/inbox/?tool=issue_refund">Cancel</a>' in html
    assert listed_ids(html) == [first.pk]


def test_a_stale_confirmation_is_asked_again(
    client: Client, rita: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = refunds(1)[0]
    data = confirmation_data(text(client.post(URL, selection("approve", first))))
    monkeypatch.setattr("approvals.forms.CONFIRM_MAX_AGE", -1)

    html = text(client.post(URL, data))

    assert "This confirmation is too old" in html
    assert listed_ids(html) == [first.pk]
    assert ApprovalDecision.objects.count() == 0
