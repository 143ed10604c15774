"""The demo's seeding (`demo/seed.py`, `manage.py seed_demo`): its users, their passwords
(printed only with DEBUG on), the reviewers' group and rita's right to manage the rules, the
offline model's price, the demo policy (seeded off) and the shop's orders; seeding again
changes nothing a person changed since."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client, RequestFactory

from approvals.models import (
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalStatus,
    PolicyAction,
    PolicyCondition,
)
from demo.models import Order
from demo.seed import seed_orders, seed_policies
from engine import policies, runs
from engine.permissions import can_manage_policies
from tests.factories import start_run
from tracing.models import ModelPrice

pytestmark = pytest.mark.django_db


def login_request() -> Any:
    """django-axes needs the request in authenticate(); Client.login() passes it on."""
    return RequestFactory().post("/accounts/login/")


def command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


@pytest.mark.usefixtures("orders")
def test_seeding_again_keeps_the_demo_users_passwords_and_sessions(settings: Any) -> None:
    settings.DEBUG = True
    command("seed_demo")
    User = get_user_model()
    alice = Client()
    assert alice.login(request=login_request(), username="alice", password="alice-demo-pass")
    assert alice.get("/chats/").status_code == 200
    rita = User.objects.get(username="rita")
    rita.set_password("rita-own-password")  # changed by hand since
    rita.save()
    hashes = dict(User.objects.values_list("username", "password"))

    out = command("seed_demo")

    assert dict(User.objects.values_list("username", "password")) == hashes
    # The session made before the second seeding is still logged in.
    assert alice.get("/chats/").status_code == 200
    assert Client().login(request=login_request(), username="rita", password="rita-own-password")
    assert "password unchanged" in out
    assert "demo-pass" not in out


@pytest.mark.usefixtures("orders")
def test_seeding_prices_the_offline_model_once_and_keeps_an_operators_price(settings: Any) -> None:
    settings.DEBUG = True
    command("seed_demo")
    price = ModelPrice.objects.get(model="offline-demo")
    assert price.input_per_million > 0 and "Demo only" in price.note
    ModelPrice.objects.filter(pk=price.pk).update(input_per_million=Decimal("9"))
    command("seed_demo")
    assert list(
        ModelPrice.objects.filter(model="offline-demo").values_list("input_per_million", flat=True)
    ) == [Decimal("9")]


def test_seed_demo_is_idempotent_and_prints_passwords_only_in_debug(settings: Any) -> None:
    settings.DEBUG = True
    out = StringIO()
    call_command("seed_demo", stdout=out)
    call_command("seed_demo", stdout=out)
    User = get_user_model()
    assert User.objects.filter(username__in=["alice", "rita", "admin"]).count() == 3
    rita = User.objects.get(username="rita")
    assert rita.groups.filter(name="Reviewers").exists()
    assert User.objects.get(username="admin").is_superuser
    assert not User.objects.get(username="alice").is_staff
    assert "alice-demo-pass" in out.getvalue()
    assert Client().login(
        request=login_request(),
        username="alice",
        password="alice-demo-pass",
    )
    assert Group.objects.filter(name="Reviewers").count() == 1

    settings.DEBUG = False
    quiet = StringIO()
    call_command("seed_demo", stdout=quiet)
    assert "demo-pass" not in quiet.getvalue()


def test_seed_demo_without_debug_sets_unguessable_passwords(settings: Any) -> None:
    settings.DEBUG = False
    call_command("seed_demo", stdout=StringIO())
    assert not Client().login(
        request=login_request(),
        username="admin",
        password="admin-demo-pass",
    )


@pytest.mark.usefixtures("orders")
def test_it_seeds_the_demo_orders_once() -> None:
    assert seed_orders() == 0
    assert Order.objects.count() == 10
    assert Order.objects.get(number=42).customer.username == "alice"
    assert Order.objects.get(number=7).customer.username == "chen"
    assert Order.objects.get(number=42).amount == Decimal("120.00")
    assert Order.objects.get(number=7).status == Order.Status.SHIPPED


@pytest.mark.usefixtures("orders")
def test_it_restores_the_demo_orders_on_reset() -> None:
    Order.objects.filter(number=42).update(status=Order.Status.CANCELLED)

    seed_orders(reset=True)

    assert Order.objects.get(number=42).status == Order.Status.PLACED


def test_seed_demo_lets_rita_manage_the_rules_and_seeds_the_refunds_rule_once(
    settings: Any,
) -> None:
    settings.DEBUG = True
    call_command("seed_demo", stdout=StringIO())
    rita = get_user_model().objects.get(username="rita")
    assert can_manage_policies(rita)
    assert not can_manage_policies(get_user_model().objects.get(username="alice"))
    policy = ApprovalPolicy.objects.get()
    # Seeded off: every cluster is seeded, and the soak benchmark's refunds must wait.
    assert (policy.name, policy.enabled, policy.tool_name, policy.requires_no_warnings) == (
        "Refunds up to $60 go through",
        False,
        "issue_refund",
        True,
    )
    policy.description = "Changed by rita."
    policy.save()
    call_command("seed_demo", stdout=StringIO())
    assert ApprovalPolicy.objects.get().description == "Changed by rita."
    assert PolicyCondition.objects.count() == 1

    # Turned on, it approves a $60 refund and leaves a $80 one to a person.
    ApprovalPolicy.objects.update(enabled=True)
    rules = policies.load_rules()
    user = policies.User(email="alice@example.com", username="alice")
    small = policies.Call("Support desk", "issue_refund", {"order_id": 42, "amount": 60.0})
    large = policies.Call("Support desk", "issue_refund", {"order_id": 42, "amount": 80.0})
    assert policies.evaluate(rules, small, user, facts=lambda call: []).action == "approve"
    assert policies.evaluate(rules, large, user, facts=lambda call: []).action == "ask"


def test_seeding_replaces_the_earlier_example_rule_nobody_touched_and_keeps_a_touched_one() -> None:
    earlier = ApprovalPolicy.objects.create(
        name="Small refunds go through",
        enabled=False,
        priority=10,
        tool_name="issue_refund",
        action=PolicyAction.APPROVE,
        description=EARLIER_DESCRIPTION,
    )
    PolicyCondition.objects.create(policy=earlier, argument="amount", operator="<=", value="20")
    seed_policies()
    assert list(ApprovalPolicy.objects.values_list("name", flat=True)) == [
        "Refunds up to $60 go through"
    ]

    ApprovalPolicy.objects.all().delete()
    earlier = ApprovalPolicy.objects.create(
        name="Small refunds go through",
        enabled=True,  # turned on since: someone counts on it
        tool_name="issue_refund",
        action=PolicyAction.APPROVE,
        description=EARLIER_DESCRIPTION,
    )
    seed_policies()
    assert sorted(ApprovalPolicy.objects.values_list("name", flat=True)) == [
        "Refunds up to $60 go through",
        "Small refunds go through",
    ]


EARLIER_DESCRIPTION = (
    "A refund of $20 or less is approved without a reviewer, even when the order's refunds "
    "are above the $50 that otherwise asks for one."
)


def refund_request(text: str) -> Any:
    """The demo agent run on `text` for alice until it pauses; its one request."""
    run = start_run(text)
    asyncio.run(runs.execute(run.pk))
    return ApprovalRequest.objects.get(run_id=run.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("orders", "fresh_registry", "submitted")
def test_the_seeded_rule_turned_on_approves_what_the_demo_asks_about_unless_the_facts_warn() -> (
    None
):
    seed_policies()
    ApprovalPolicy.objects.update(enabled=True)
    # $60 on order 42 ($120, placed): above the demo's $50, so it pauses; the rule approves it.
    approved = refund_request("refund 60 on order 42")
    assert approved.status == ApprovalStatus.APPROVED
    assert approved.verdict["reason"] == "amount 60 is at most 60; no warnings"
    # $60 on order 46 ($32): the facts warn, so a person decides, and the request says why.
    warned = refund_request("refund 60 on order 46")
    assert warned.is_pending
    assert (
        "but the facts warn: Refund: Cannot refund $60.00 on order 46" in warned.verdict["reason"]
    )
    # $80: more than the rule approves.
    assert refund_request("refund 80 on order 42").is_pending
