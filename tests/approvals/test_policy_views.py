"""The reviewers' policy pages (`approvals/policy_views.py`): approval policies managed by
reviewers who hold `approvals.manage_approvalpolicy`, in the inbox's look. Every change is a
POST, recorded as an admin LogEntry; what a person wrote is escaped; the list reads a bounded
number of queries however many rules there are."""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import pytest
from agents import Agent
from agents.mcp import MCPServerStdio
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from approvals.models import (
    ApprovalDecision,
    ApprovalPolicy,
    ApprovalRequest,
    ConditionOperator,
    PolicyAction,
    PolicyCondition,
)
from engine import mcp
from engine.permissions import MANAGE_POLICIES_PERMISSION, can_manage_policies
from tests import scripted
from tests.agentsite.test_csp import inline_code, policy_of
from tests.factories import grant, make_request, make_reviewer, make_user

pytestmark = pytest.mark.django_db

MANAGE = MANAGE_POLICIES_PERMISSION
MARKUP = '<b id="x">bold</b><script>alert(1)</script>'


@pytest.fixture
def rita(rita: Any) -> Any:
    """rita, signed in, a reviewer who here may also manage the rules."""
    return grant(rita, MANAGE)


def text(response: Any) -> str:
    return response.content.decode()


def make_policy(name: str = "Small refunds go through", **fields: Any) -> ApprovalPolicy:
    fields.setdefault("action", PolicyAction.APPROVE)
    fields.setdefault("tool_name", "issue_refund")
    conditions = fields.pop("conditions", [("amount", ConditionOperator.AT_MOST, "20")])
    policy = ApprovalPolicy.objects.create(name=name, **fields)
    for argument, operator, value in conditions:
        PolicyCondition.objects.create(
            policy=policy, argument=argument, operator=operator, value=value
        )
    return policy


def rule_data(conditions: list[dict[str, str]] | None = None, **fields: str) -> dict[str, str]:
    """What the rule form posts: the rule's fields, then the condition rows (none saved yet)."""
    data = {
        "name": "Small refunds go through",
        "enabled": "on",
        "priority": "10",
        "agent_name": "",
        "tool_name": "issue_refund",
        "action": PolicyAction.APPROVE,
        "message": "",
        "description": "Refunds of $20 or less need nobody.",
        **fields,
    }
    rows = (
        conditions
        if conditions is not None
        else [{"argument": "amount", "operator": "<=", "compare_to": "value", "value": "20"}]
    )
    data.update(
        {
            "conditions-TOTAL_FORMS": str(len(rows)),
            "conditions-INITIAL_FORMS": "0",
            "conditions-MIN_NUM_FORMS": "0",
            "conditions-MAX_NUM_FORMS": "20",
        }
    )
    for index, row in enumerate(rows):
        data.update({f"conditions-{index}-{name}": value for name, value in row.items()})
    return data


def edit_data(policy: ApprovalPolicy, **fields: str) -> dict[str, str]:
    """What the edit page posts back unchanged (its saved conditions first), with `fields`."""
    conditions = list(policy.conditions.all())
    data = {
        "name": policy.name,
        "priority": str(policy.priority),
        "agent_name": policy.agent_name,
        "tool_name": policy.tool_name,
        "action": policy.action,
        "message": policy.message,
        "description": policy.description,
        "conditions-TOTAL_FORMS": str(len(conditions)),
        "conditions-INITIAL_FORMS": str(len(conditions)),
        "conditions-MIN_NUM_FORMS": "0",
        "conditions-MAX_NUM_FORMS": "20",
    }
    if policy.enabled:
        data["enabled"] = "on"
    for index, condition in enumerate(conditions):
        data.update(
            {
                f"conditions-{index}-id": str(condition.pk),
                f"conditions-{index}-policy": str(policy.pk),
                f"conditions-{index}-argument": condition.argument,
                f"conditions-{index}-operator": condition.operator,
                f"conditions-{index}-compare_to": condition.compare_to,
                f"conditions-{index}-value": condition.value,
            }
        )
    data.update(fields)
    return data


def log_of(policy_pk: int) -> list[tuple[int, int, str]]:
    entries = LogEntry.objects.filter(
        content_type__app_label="approvals",
        content_type__model="approvalpolicy",
        object_id=str(policy_pk),
    ).order_by("pk")
    return [(e.user_id, e.action_flag, e.get_change_message()) for e in entries]


# --- access ---------------------------------------------------------------------------------


def urls(policy: ApprovalPolicy) -> list[tuple[str, str]]:
    return [
        ("get", reverse("policies")),
        ("get", reverse("policy_new")),
        ("get", reverse("policy_edit", args=[policy.pk])),
        ("get", reverse("policy_delete", args=[policy.pk])),
        ("post", reverse("policy_new")),
        ("post", reverse("policy_edit", args=[policy.pk])),
        ("post", reverse("policy_toggle", args=[policy.pk])),
        ("post", reverse("policy_delete", args=[policy.pk])),
    ]


def test_it_sends_a_visitor_to_the_login_page(client: Client) -> None:
    policy = make_policy()
    for method, url in urls(policy):
        response = getattr(client, method)(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url
    assert ApprovalPolicy.objects.get().enabled


def test_it_refuses_a_reviewer_without_the_permission_and_a_manager_who_is_no_reviewer(
    client: Client,
) -> None:
    policy = make_policy()
    for user in (make_reviewer("bob"), make_user(perms=[MANAGE], username="nora")):
        client.force_login(user)
        for method, url in urls(policy):
            assert getattr(client, method)(url, rule_data()).status_code == 403, (user, url)
        # Her inbox (if she has one) names no policy page.
        assert not can_manage_policies(user)
    assert list(ApprovalPolicy.objects.values_list("name", "enabled")) == [(policy.name, True)]
    assert not LogEntry.objects.exists()
    client.force_login(make_reviewer("bob"))
    assert 'href="/inbox/policies/"' not in text(client.get(reverse("inbox")))


def test_a_revoked_permission_or_a_deactivated_user_loses_access_at_the_next_request(
    client: Client, rita: Any
) -> None:
    assert client.get(reverse("policies")).status_code == 200
    assert 'href="/inbox/policies/"' in text(client.get(reverse("inbox")))
    permission = Permission.objects.get(
        content_type__app_label="approvals", codename="manage_approvalpolicy"
    )
    rita.user_permissions.remove(permission)
    assert client.get(reverse("policies")).status_code == 403
    assert 'href="/inbox/policies/"' not in text(client.get(reverse("inbox")))

    rita.user_permissions.add(permission)
    assert client.get(reverse("policies")).status_code == 200
    rita.is_active = False
    rita.save()
    response = client.get(reverse("policies"))
    # Django signs an inactive user out: to the login page, never the list.
    assert response.status_code in (302, 403)
    assert b"Approval policies" not in response.content


def test_a_get_changes_nothing_and_a_post_needs_csrf(rita: Any) -> None:
    policy = make_policy()
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(rita)
    for method, url in urls(policy):
        if method == "get":
            assert csrf_client.get(url).status_code == 200, url
        else:
            assert csrf_client.post(url, rule_data()).status_code == 403, url
    assert csrf_client.get(reverse("policy_toggle", args=[policy.pk])).status_code == 405
    assert ApprovalPolicy.objects.get().enabled
    assert ApprovalPolicy.objects.count() == 1
    assert not LogEntry.objects.exists()


# --- the list -------------------------------------------------------------------------------


def test_the_list_shows_the_rules_in_precedence_order_in_words(client: Client, rita: Any) -> None:
    later = make_policy("Later", priority=50, description="Checked after the first.")
    first = make_policy(
        "Never wire money",
        priority=5,
        tool_name="",
        agent_name="Support desk",
        action=PolicyAction.REJECT,
        message="Wiring money is not allowed.",
        conditions=[("to", "!=", ""), ("amount", ">", "100")],
    )
    off = make_policy("Off one", priority=50, enabled=False, conditions=[])
    ApprovalDecision.objects.create(
        request=make_request(), approved=True, policy=later, policy_name=later.name
    )
    html = text(client.get(reverse("policies")))
    ids = re.findall(r'id="policy-(\d+)"', html)
    assert ids == [str(first.pk), str(later.pk), str(off.pk)]  # priority, then age
    first_row = html.split(f'id="policy-{first.pk}"')[1].split("</li>")[0]
    assert "Reject automatically" in first_row
    assert "Support desk" in first_row and ">any<" in first_row  # any tool
    assert "to does not equal empty" in first_row and "amount is more than 100" in first_row
    assert "Wiring money is not allowed." in first_row
    later_row = html.split(f'id="policy-{later.pk}"')[1].split("</li>")[0]
    assert "amount is at most 20" in later_row and "issue_refund" in later_row
    assert "1 decision<" in later_row and "/inbox/history/?decision=policy" in later_row
    assert "Checked after the first." in later_row
    off_row = html.split(f'id="policy-{off.pk}"')[1].split("</li>")[0]
    assert "Off</span>" in off_row and "every call" in off_row and "Turn on" in off_row
    assert '<a href="/inbox/policies/" aria-current="page">Policies</a>' in html
    assert 'href="/inbox/policies/new/"' in html
    assert "2 of 3 rules on" in html


def test_the_empty_list_explains_what_a_rule_is_with_an_example(client: Client, rita: Any) -> None:
    html = text(client.get(reverse("policies")))
    assert "No rules yet" in html
    assert "approve <code>issue_refund</code> when <code>amount is at most 20</code>" in html
    assert 'href="/inbox/policies/new/"' in html


def test_the_list_reads_a_bounded_number_of_queries_with_30_rules(
    client: Client, rita: Any
) -> None:
    make_policy("rule 0")

    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(reverse("policies")).status_code == 200
        return len(captured)

    few = count()
    for n in range(1, 30):
        make_policy(f"rule {n}", updated_by=rita, conditions=[("amount", "<=", str(n))] * 2)
    assert count() == few
    assert few <= 8


def test_the_pages_carry_the_strict_content_security_policy(client: Client, rita: Any) -> None:
    policy = make_policy()
    for url in (
        reverse("policies"),
        reverse("policy_new"),
        reverse("policy_edit", args=[policy.pk]),
        reverse("policy_delete", args=[policy.pk]),
    ):
        response = client.get(url)
        assert policy_of(response)["script-src"] == "'self'"
        assert inline_code(text(response)) == [], url


# --- writing rules --------------------------------------------------------------------------


def test_the_form_suggests_the_known_agents_tools_and_arguments_with_the_models_hints(
    client: Client, rita: Any
) -> None:
    html = text(client.get(reverse("policy_new")))
    assert '<option value="issue_refund">' in html
    assert '<option value="amount">' in html and '<option value="order_id">' in html
    assert 'list="known-tools"' in html and 'list="known-arguments"' in html
    help_text = ApprovalPolicy._meta.get_field("priority").help_text
    assert escape(help_text) in html
    assert 'aria-describedby="id_priority_helptext"' in html
    assert escape(PolicyCondition._meta.get_field("argument").help_text) in html
    # Blank condition rows, so that it works without JavaScript; and the row to copy.
    assert 'name="conditions-1-argument"' in html
    assert 'name="conditions-__prefix__-argument"' in html


def test_a_manager_creates_a_rule_with_conditions(client: Client, rita: Any) -> None:
    data = rule_data(
        [
            {"argument": "amount", "operator": "<=", "compare_to": "value", "value": "20"},
            {"argument": "order_id", "operator": "in", "compare_to": "value", "value": "42, 44"},
            {"argument": "", "operator": "", "compare_to": "value", "value": ""},  # blank row
        ]
    )
    response = client.post(reverse("policy_new"), data)
    policy = ApprovalPolicy.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/inbox/policies/#policy-{policy.pk}"
    assert (policy.name, policy.enabled, policy.priority, policy.tool_name) == (
        "Small refunds go through",
        True,
        10,
        "issue_refund",
    )
    assert policy.updated_by == rita
    assert [(c.argument, c.operator, c.value) for c in policy.conditions.all()] == [
        ("amount", "<=", "20"),
        ("order_id", "in", "42, 44"),
    ]
    [(user_id, flag, message)] = log_of(policy.pk)
    assert (user_id, flag) == (rita.pk, ADDITION)
    assert message.startswith("Added.") and "Added policy condition" in message
    html = text(client.get(response["Location"]))
    assert "Rule “Small refunds go through” created" in html


def test_a_form_that_is_not_valid_keeps_the_input_and_shows_each_error_by_its_field(
    client: Client, rita: Any
) -> None:
    make_policy("Taken")
    data = rule_data(
        [
            {"argument": "amount", "operator": "<=", "compare_to": "value", "value": "twenty"},
            {"argument": "to", "operator": "==", "compare_to": "user.email", "value": ""},
        ],
        name="Taken",
        message="A message for an approving rule.",
        description="Kept when the form comes back.",
    )
    response = client.post(reverse("policy_new"), data)
    assert response.status_code == 400
    html = text(response)
    assert ApprovalPolicy.objects.count() == 1 and not log_of(0)
    assert "The rule was not saved" in html
    # Each error sits in its field's block, after its input.
    name_block = html.split('<label for="id_name">')[1].split('<div class="policy-field')[0]
    assert 'value="Taken"' in name_block and "already exists" in name_block
    message_block = html.split('<label for="id_message">')[1].split("</div>")[0]
    assert "A message for an approving rule." in message_block
    assert "Only a rejecting rule has a message" in message_block
    value_block = html.split('for="id_conditions-0-value"')[1].split("</div>")[0]
    assert 'value="twenty"' in value_block and "compares numbers: write a number" in value_block
    assert 'value="to"' in html and 'value="user.email" selected' in html
    assert "Kept when the form comes back." in html
    assert 'aria-invalid="true"' in html


def test_a_manager_edits_a_rule_and_removes_a_condition(client: Client, rita: Any) -> None:
    policy = make_policy(conditions=[("amount", "<=", "20"), ("order_id", "==", "42")])
    someone = make_user()
    ApprovalPolicy.objects.filter(pk=policy.pk).update(updated_by=someone)
    page = text(client.get(reverse("policy_edit", args=[policy.pk])))
    assert "Edit “Small refunds go through”" in page and 'value="20"' in page

    data = edit_data(
        policy,
        name="Refunds up to 15",
        **{"conditions-0-value": "15", "conditions-1-DELETE": "on"},
    )
    response = client.post(reverse("policy_edit", args=[policy.pk]), data)
    assert response.status_code == 302
    policy.refresh_from_db()
    assert policy.name == "Refunds up to 15" and policy.updated_by == rita
    assert [(c.argument, c.value) for c in policy.conditions.all()] == [("amount", "15")]
    [(user_id, flag, message)] = log_of(policy.pk)
    assert (user_id, flag) == (rita.pk, CHANGE)
    assert "Changed Name" in message and "Deleted policy condition" in message


def test_a_manager_toggles_a_rule_off_and_on(client: Client, rita: Any) -> None:
    policy = make_policy()
    url = reverse("policy_toggle", args=[policy.pk])
    response = client.post(url, {"enabled": "off"})
    assert response.status_code == 302
    assert response["Location"] == f"/inbox/policies/#policy-{policy.pk}"
    policy.refresh_from_db()
    assert not policy.enabled and policy.updated_by == rita
    # Asking again for the same state (a second click, a stale page) changes nothing.
    client.post(url, {"enabled": "off"})
    policy.refresh_from_db()
    assert not policy.enabled
    client.post(url, {"enabled": "on"})
    policy.refresh_from_db()
    assert policy.enabled
    assert [flag for _, flag, _ in log_of(policy.pk)] == [CHANGE, CHANGE]
    assert all(message == "Changed Enabled." for _, _, message in log_of(policy.pk))
    client.post(url, {"enabled": "maybe"})
    policy.refresh_from_db()
    assert policy.enabled and len(log_of(policy.pk)) == 2


def test_deleting_asks_first_and_decisions_keep_the_rules_name(client: Client, rita: Any) -> None:
    policy = make_policy()
    decision = ApprovalDecision.objects.create(
        request=make_request(), approved=True, policy=policy, policy_name=policy.name
    )
    page = text(client.get(reverse("policy_delete", args=[policy.pk])))
    assert "Delete the rule “Small refunds go through”?" in page
    assert "Decisions already taken keep the rule's name" in page
    assert "It took 1 decision." in page
    assert ApprovalPolicy.objects.filter(pk=policy.pk).exists()

    pk = policy.pk
    response = client.post(reverse("policy_delete", args=[pk]))
    assert response.status_code == 302 and response["Location"] == "/inbox/policies/"
    assert not ApprovalPolicy.objects.exists()
    decision.refresh_from_db()
    assert (decision.policy_id, decision.policy_name) == (None, "Small refunds go through")
    [(user_id, flag, _)] = log_of(pk)
    assert (user_id, flag) == (rita.pk, DELETION)
    assert LogEntry.objects.get(object_id=str(pk)).object_repr == "Small refunds go through"
    assert client.get(reverse("policy_edit", args=[pk])).status_code == 404


def test_the_admin_history_of_a_rule_shows_the_reviewers_changes(client: Client, rita: Any) -> None:
    client.post(reverse("policy_new"), rule_data())
    policy = ApprovalPolicy.objects.get()
    client.post(reverse("policy_toggle", args=[policy.pk]), {"enabled": "off"})
    admin = make_user(username="admin", is_staff=True, is_superuser=True)
    client.force_login(admin)
    html = text(client.get(reverse("admin:approvals_approvalpolicy_history", args=[policy.pk])))
    assert html.count("rita") >= 2
    assert "Changed Enabled." in html


# --- the names a rule gives, and the facts' warnings ------------------------------------------


def test_the_form_suggests_every_agent_and_the_tools_of_their_mcp_servers_before_any_request(
    client: Client, rita: Any
) -> None:
    assert not ApprovalRequest.objects.exists()
    html = text(client.get(reverse("policy_new")))
    tools = html.split('<datalist id="known-tools">')[1].split("</datalist>")[0]
    agents = html.split('<datalist id="known-agents">')[1].split("</datalist>")[0]
    arguments = html.split('<datalist id="known-arguments">')[1].split("</datalist>")[0]
    # The demo warehouse's tools are known only once its MCP server lists them: listed now.
    for name in ("issue_refund", "research", "search_knowledge_base", "stock_level", "restock"):
        assert f'<option value="{name}">' in tools, name
    assert "MCP server warehouse" in tools
    for name in ("Support desk", "Billing", "Researcher", "Warehouse"):
        assert f'<option value="{name}">' in agents, name
    assert '<option value="sku">' in arguments and '<option value="quantity">' in arguments


def test_a_tool_no_agent_has_is_refused_with_the_closest_name_and_saved_only_when_confirmed(
    client: Client, rita: Any
) -> None:
    data = rule_data(tool_name="issue_refunds")
    response = client.post(reverse("policy_new"), data)
    assert response.status_code == 400 and not ApprovalPolicy.objects.exists()
    html = text(response)
    tool_block = html.split('<label for="id_tool_name">')[1].split('<div class="policy-field')[0]
    assert "No registered agent has a tool called “issue_refunds”" in tool_block
    assert "Did you mean issue_refund?" in tool_block
    assert 'name="save_anyway"' in html and "Save anyway" in html

    response = client.post(reverse("policy_new"), {**data, "save_anyway": "on"})
    assert response.status_code == 302
    policy = ApprovalPolicy.objects.get()
    assert policy.tool_name == "issue_refunds"
    # The log says what changed on the rule, not that it was confirmed.
    [(_, _, message)] = log_of(policy.pk)
    assert "Save anyway" not in message
    listing = text(client.get(response["Location"]))
    assert "saved although no registered agent has a tool called “issue_refunds”" in listing
    row = listing.split(f'id="policy-{policy.pk}"')[1].split("</li>")[0]
    assert "No registered agent has a tool called “issue_refunds”" in row

    # Edited later with its name unchanged, it is not refused again.
    response = client.post(
        reverse("policy_edit", args=[policy.pk]), edit_data(policy, description="Still waiting.")
    )
    assert response.status_code == 302


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (
            {"agent_name": "Suport desk"},
            "No registered agent is called “Suport desk”: the rule would match no call.",
        ),
        ({"agent_name": "Suport desk"}, "Did you mean Support desk?"),
        ({"agent_name": "support"}, "“support” is the name the agent Support desk is registered"),
        (
            {"agent_name": "Billing", "tool_name": "cancel_order"},
            "Billing has no tool called “cancel_order”",
        ),
        ({"tool_name": "stock_levels"}, "Did you mean stock_level?"),
    ],
)
def test_an_agent_or_tool_that_matches_no_call_is_refused(
    client: Client, rita: Any, fields: dict[str, str], error: str
) -> None:
    response = client.post(reverse("policy_new"), rule_data(**fields))
    assert response.status_code == 400 and not ApprovalPolicy.objects.exists()
    assert escape(error) in text(response)


def test_a_tool_of_an_mcp_server_is_accepted_before_any_request_exists(
    client: Client, rita: Any
) -> None:
    data = rule_data([], name="Ask before restocking", agent_name="Warehouse", tool_name="restock")
    response = client.post(reverse("policy_new"), {**data, "action": PolicyAction.ASK})
    assert response.status_code == 302
    assert ApprovalPolicy.objects.get().tool_name == "restock"


@pytest.mark.usefixtures("fresh_registry")
def test_a_refusal_says_which_mcp_server_did_not_list_its_tools_in_time(
    client: Client, rita: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mcp, "LIST_SECONDS", 0.5)
    silent = MCPServerStdio(
        params={"command": sys.executable, "args": ["-c", "import time; time.sleep(30)"]},
        name="ledger",
    )
    scripted.install(settings, Agent(name="Books", mcp_servers=[silent]))
    started = time.monotonic()
    response = client.post(
        reverse("policy_new"), rule_data([], tool_name="post_entry", action=PolicyAction.ASK)
    )
    assert time.monotonic() - started < 5
    assert response.status_code == 400
    assert "The MCP server ledger did not list its tools just now" in text(response)


def test_a_new_approving_rule_requires_no_warnings_unless_unticked_and_the_list_says_which(
    client: Client, rita: Any
) -> None:
    html = text(client.get(reverse("policy_new")))
    box = (
        html.split('name="requires_no_warnings"')[0].rsplit("<input", 1)[1]
        + html.split('name="requires_no_warnings"')[1].split(">")[0]
    )
    assert "checked" in box

    client.post(reverse("policy_new"), rule_data(requires_no_warnings="on"))
    client.post(reverse("policy_new"), rule_data(name="Any refund up to 20"))
    careful, lax = ApprovalPolicy.objects.order_by("pk")
    assert careful.requires_no_warnings and not lax.requires_no_warnings
    listing = text(client.get(reverse("policies")))
    careful_row = listing.split(f'id="policy-{careful.pk}"')[1].split("</li>")[0]
    lax_row = listing.split(f'id="policy-{lax.pk}"')[1].split("</li>")[0]
    assert "only with no warnings" in careful_row
    assert "even with warnings" in lax_row


# --- escaping -------------------------------------------------------------------------------


def test_what_a_person_wrote_is_escaped_everywhere(client: Client, rita: Any) -> None:
    data = rule_data(
        [{"argument": "to", "operator": "contains", "compare_to": "value", "value": MARKUP}],
        name=MARKUP,
        tool_name="send_email",
        agent_name=MARKUP[:90],
        action=PolicyAction.REJECT,
        message=MARKUP,
        description=MARKUP,
        # No agent is called that: saved anyway (the refusal is below).
        save_anyway="on",
    )
    assert client.post(reverse("policy_new"), data).status_code == 302
    policy = ApprovalPolicy.objects.get()
    pages = [
        client.get(reverse("policies")),
        client.get(reverse("policy_edit", args=[policy.pk])),
        client.get(reverse("policy_delete", args=[policy.pk])),
        # Not valid (a message on an approving rule): the input comes back, escaped too.
        client.post(reverse("policy_new"), {**data, "action": PolicyAction.APPROVE, "name": "x"}),
        # Refused: no agent is called that, and the refusal names it.
        client.post(reverse("policy_new"), {**data, "save_anyway": "", "name": "y"}),
    ]
    for response in pages:
        html = text(response)
        assert "<script>alert(1)</script>" not in html, response.request["PATH_INFO"]
        assert '<b id="x">' not in html
        assert "&lt;b id=&quot;x&quot;&gt;bold&lt;/b&gt;" in html or (
            "&lt;b id=&#x27;x&#x27;&gt;" in html
        )


# --- the demo -------------------------------------------------------------------------------
