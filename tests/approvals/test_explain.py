"""Each request explains itself (`approvals/explain.py`) — the tool's
description, the risk its author declared, the arguments for people, the facts its hook
reads (with warnings) — in the inbox row, a pushed row, the request page and the history."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pytest
from agents import function_tool
from asgiref.sync import sync_to_async
from django.test import Client
from django.urls import reverse

from approvals import explain
from approvals.models import ApprovalOrigin, ApprovalRequest
from demo.models import Order
from engine import facts, registry, runs
from tests.approvals.test_views import XSS
from tests.factories import make_request, make_reviewer, make_run, make_user

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("orders", "fresh_registry", "submitted"),
]

BODY = "Hello Alice,\n\nyour refund of $80.00 is on its way.\n\n— The shop"


def text(response: Any) -> str:
    return str(response.content.decode())


def row_of(html: str, request: ApprovalRequest) -> str:
    row = html[html.index(f'id="request-{request.pk}"') :]
    return row[: row.index("</li>")]


def labels(html: str) -> list[str]:
    """The argument labels of the first arguments list in `html`, in order."""
    arguments = html[html.index('<dl class="arguments') :]
    arguments = arguments[: arguments.index("</dl>")]
    return [label.strip() for label in re.findall(r"<dt(?: title=\"[^\"]*\")?>([^<]+)", arguments)]


def demo_request(user: Any, tool_name: str, arguments: dict[str, Any], **kwargs: Any) -> Any:
    kwargs.setdefault("agent_name", "Support desk")
    return make_request(
        run=make_run(owner=user), tool_name=tool_name, arguments=arguments, **kwargs
    )


def test_for_each_demo_tool_the_row_and_page_explain_the_call(client: Client) -> None:
    alice = make_user(username="alice")
    assert Order.objects.get(number=46).status == "delivered"
    # Stored in another order than the schema's: the labels follow the schema.
    cases = {
        "cancel_order": (
            demo_request(alice, "cancel_order", {"order_id": 46}),
            "Cancel an order that has not been delivered yet.",
            "irreversible",
            ["Order Id"],
            ["46", "has already been delivered, so it cannot be cancelled"],
        ),
        "issue_refund": (
            demo_request(alice, "issue_refund", {"amount": 80.0, "order_id": 999}),
            "Refund part or all of an order",
            "irreversible",
            ["Order Id", "Amount"],
            ["$80.00", "999: not in this user&#x27;s account; nothing will change"],
        ),
        "send_email": (
            demo_request(
                alice,
                "send_email",
                {"order_id": 7, "body": BODY, "subject": "Your refund", "to": "alice@example.com"},
            ),
            "Send an email to the customer, at their own address only.",
            "irreversible",
            ["To", "Subject", "Body", "Order Id"],
            ["7: not in this user&#x27;s account; nothing will change", "your refund of $80.00"],
        ),
        "search_knowledge_base": (
            demo_request(
                alice,
                "search_knowledge_base",
                {"query": "refund policy"},
                agent_name="Researcher",
                origin=ApprovalOrigin.AGENT_AS_TOOL,
            ),
            "Search the internal knowledge base of support articles.",
            "low",
            ["Query"],
            ["refund policy"],
        ),
    }
    client.force_login(make_reviewer())
    inbox = text(client.get(reverse("inbox")))

    for tool, (request, description, risk, expected_labels, shown) in cases.items():
        row = row_of(inbox, request)
        page = text(client.get(reverse("inbox_request", args=[request.pk])))
        card = page[page.index('aria-label="Request"') : page.index('aria-label="Decision"')]
        for html in (row, card):
            assert description in html, tool
            assert f'class="risk risk-{risk}"' in html and f"risk: {risk}</span>" in html, tool
            assert labels(html) == expected_labels, tool
            for value in shown:
                assert value in html, (tool, value)
            # The raw JSON stays one click away.
            assert '<details class="raw-arguments"><summary>Raw arguments (JSON)' in html, tool
        if tool in ("cancel_order", "issue_refund", "send_email"):
            assert 'class="fact-warning"' in row and "<strong>Warning:</strong>" in row, tool
    # The warning of a delivered order is on cancel_order's row, with the order's facts.
    cancel_row = row_of(inbox, cases["cancel_order"][0])
    for fact in ("Delivered", "Alice Martin &lt;alice@example.com&gt;"):
        assert fact in cancel_row
    # A long text is text with its line breaks, not JSON-escaped.
    email = row_of(inbox, cases["send_email"][0])
    assert '<div class="argument arg-long"><dt title="The plain-text body.">Body</dt>' in email
    assert "Hello Alice,\n\nyour refund" in email
    assert "\\n" not in email.split("<details")[0]


def test_a_cancelled_order_and_a_refund_above_what_is_left_are_warned_about(
    client: Client,
) -> None:
    alice = make_user(username="alice")
    Order.objects.filter(number=44).update(status=Order.Status.CANCELLED)
    cancel = demo_request(alice, "cancel_order", {"order_id": 44})
    refund = demo_request(alice, "issue_refund", {"order_id": 44, "amount": 5})
    too_much = demo_request(alice, "issue_refund", {"order_id": 42, "amount": 500})
    fine = demo_request(alice, "issue_refund", {"order_id": 42, "amount": 20})
    client.force_login(make_reviewer())
    inbox = text(client.get(reverse("inbox")))

    assert "Order 44 is already cancelled." in row_of(inbox, cancel)
    assert "Order 44 is already cancelled." in row_of(inbox, refund)
    assert "Cannot refund $500.00 on order 42" in row_of(inbox, too_much)
    assert "fact-warning" not in row_of(inbox, fine)
    assert "$20.00" in row_of(inbox, fine)


def test_arguments_and_facts_are_escaped(client: Client) -> None:
    def hostile(calls: Any) -> list[list[Any]]:
        return [[(XSS, XSS), ("Note", XSS, True)] for _ in calls]

    request = demo_request(make_user(), "wire_money", {"account": XSS, "memo": f"line one\n{XSS}"})
    facts.register("wire_money", hostile)
    try:
        client.force_login(make_reviewer())
        inbox = text(client.get(reverse("inbox")))
        page = text(client.get(reverse("inbox_request", args=[request.pk])))
    finally:
        facts.unregister("wire_money")

    for html in (inbox, page):
        assert XSS not in html
        assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5
    row = row_of(inbox, request)
    # A tool that is not registered (any more): no description, its risk not declared.
    assert "risk: high · not declared" in row
    # No schema to order them: as stored (PostgreSQL's jsonb keeps an order of its own).
    assert sorted(labels(row)) == ["Account", "Memo"]


def test_a_hook_that_raises_or_is_slow_says_facts_unavailable(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(calls: Any) -> list[list[Any]]:
        raise RuntimeError("boom")

    def slow(calls: Any) -> list[list[Any]]:
        time.sleep(1.5)
        return [[("Too", "late")] for _ in calls]

    monkeypatch.setattr(facts, "TIMEOUT_SECONDS", 0.3)
    user = make_user()
    raising = demo_request(user, "wire_money", {"account": "a"})
    sleeping = demo_request(user, "delete_account", {"account": "b"})
    facts.register("wire_money", broken)
    facts.register("delete_account", slow)
    try:
        client.force_login(make_reviewer())
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="engine.facts"):
            inbox = text(client.get(reverse("inbox")))
        took = time.monotonic() - started
        page = text(client.get(reverse("inbox_request", args=[raising.pk])))
    finally:
        facts.unregister("wire_money")
        facts.unregister("delete_account")

    assert took < 1.2  # the slow hook was not waited for
    for request in (raising, sleeping):
        row = row_of(inbox, request)
        assert "Facts unavailable" in row and "Too" not in row
        assert 'name="action" value="approve"' in row  # the row still works
    assert "Facts unavailable" in page
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert "could not be read" in logged and "took longer than 0.3 s" in logged


def test_a_pushed_row_explains_itself_too(client: Client) -> None:
    import asyncio

    from tests.approvals.test_consumers import created, open_socket

    alice = make_user(username="alice")
    rita = make_reviewer()
    request = demo_request(alice, "cancel_order", {"order_id": 46})
    request = ApprovalRequest.objects.select_related("run").get(pk=request.pk)

    async def push() -> str:
        socket, connected = await open_socket(rita)
        assert connected
        await created(request)
        frame = await socket.receive_from(timeout=5)
        await socket.disconnect()
        return str(frame)

    frame = asyncio.run(push())
    assert "Cancel an order that has not been delivered yet." in frame
    assert "risk: irreversible" in frame and labels(frame) == ["Order Id"]
    assert "has already been delivered, so it cannot be cancelled" in frame
    assert "<strong>Warning:</strong>" in frame


def test_the_history_shows_what_each_call_was(client: Client) -> None:
    alice = make_user(username="alice")
    request = demo_request(alice, "issue_refund", {"amount": 80, "order_id": 42})
    runs.decide(request, make_reviewer("bob"), runs.Decision.reject("No."))
    client.force_login(make_reviewer())
    history = text(client.get(reverse("inbox_history")))

    row = history[history.index('id="decision-row-') :]
    row = row[: row.index("</tr>")]
    assert "Refund part or all of an order" in row and "risk: irreversible" in row
    assert labels(row) == ["Order Id", "Amount"] and "$80.00" in row


# --- the registry's API ---------------------------------------------------------------------


def test_review_declares_risk_and_money_and_refuses_what_it_does_not_know() -> None:
    @function_tool
    def pay(account: str, amount: float) -> str:
        """Pay someone."""
        return "paid"

    assert registry.declared_review(pay) == registry.Review()
    assert registry.declared_review(pay).risk == registry.UNDECLARED_RISK == "high"
    assert registry.review(pay, risk="irreversible", money=["amount"], currency="eur") is pay
    declared = registry.declared_review(pay)
    assert (declared.risk, declared.declared, declared.money, declared.currency) == (
        "irreversible",
        True,
        ("amount",),
        "EUR",
    )
    with pytest.raises(ValueError):
        registry.review(pay, risk="catastrophic")
    with pytest.raises(ValueError):
        registry.review(pay, risk="low", money=["amuont"])


def test_money_is_shown_as_money() -> None:
    assert explain.money(80.0, "USD") == "$80.00"
    assert explain.money(1234.5, "EUR") == "€1,234.50"
    assert explain.money(3, "CHF") == "3.00 CHF"
    assert explain.money(-2.005, "USD") == "-$2.01"
    for value in ("lots", float("nan"), None, True, [1]):
        assert explain.money(value, "USD") is None


async def test_a_pushed_row_needs_no_request(client: Client) -> None:
    # `render_row` (what the socket sends) explains a request it loads itself.
    from approvals import views

    alice = await sync_to_async(make_user)(username="alice")
    request = await sync_to_async(demo_request)(
        alice, "issue_refund", {"order_id": 42, "amount": 8}
    )
    loaded = await sync_to_async(
        lambda: views.with_people(ApprovalRequest.objects.all()).get(pk=request.pk)
    )()
    html = await sync_to_async(views.render_row)(loaded, back="/inbox/")
    assert "$8.00" in html and "risk: irreversible" in html


def test_a_description_reads_as_prose() -> None:
    wrapped = "Refund part or all\n    of an order.\n\n    A refund above $50\n    waits."
    assert explain.description_text(wrapped) == (
        "Refund part or all of an order.\n\nA refund above $50 waits."
    )
