"""The approvals app's data across its migrations: a rule written before rules could require
that the facts show no warnings (approvals 0020) keeps approving as it did; a new rule requires
it unless told otherwise."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.contenttypes.models import ContentType

from approvals.models import ApprovalPolicy, PolicyAction
from tests.migrations import latest, migrate

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def back_to_latest() -> Iterator[None]:
    yield
    latest()
    ContentType.objects.clear_cache()


@pytest.mark.usefixtures("back_to_latest")
def test_a_rule_from_before_the_upgrade_keeps_approving_despite_warnings() -> None:
    old = migrate([("approvals", "0019_agent_span")])
    old.get_model("approvals", "ApprovalPolicy").objects.create(
        name="earlier", action=PolicyAction.APPROVE, tool_name="issue_refund"
    )

    latest()

    assert ApprovalPolicy.objects.get(name="earlier").requires_no_warnings is False
    later = ApprovalPolicy.objects.create(name="later", action=PolicyAction.APPROVE)
    assert later.requires_no_warnings is True
