"""The reviewers' policy pages: the approval policies (`engine.policies`) in precedence order,
and the forms that write them, for reviewers who also hold `approvals.manage_approvalpolicy`.

The same rules as the admin's (`ApprovalPolicyAdmin`), with the same forms; every change is a
CSRF-protected POST, recorded as an admin `LogEntry` so that the admin's history of a rule shows
the reviewers' changes too. A change applies from the next pause: a decision a rule already
took keeps the rule's name and what it matched then.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import construct_change_message
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.text import capfirst
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.forms import PolicyConditionFormSet, PolicyForm
from approvals.models import (
    ApprovalPolicy,
    ConditionOperator,
    ConditionSource,
    PolicyAction,
    PolicyCondition,
)
from approvals.views import pending_count
from engine import catalogue
from engine.permissions import allowed_only, can_manage_policies

# 403 for a signed-in user who may not write rules (stack under login_required).
manager_required = allowed_only(
    can_manage_policies, "Only reviewers allowed to manage approval policies can open this page."
)

# Blank condition rows under the rule's own: enough for most rules without JavaScript
# (policies.js adds more; a saved rule's edit page offers these again).
BLANK_CONDITIONS = 2


class ConditionRows(PolicyConditionFormSet):  # type: ignore[valid-type,misc]
    """The rule's conditions, a few blank rows to add more, and each row's argument input
    offering the known tools' argument names (a <datalist>)."""

    extra = BLANK_CONDITIONS

    def add_fields(self, form: forms.Form, index: int | None) -> None:
        super().add_fields(form, index)
        form.fields["argument"].widget.attrs["list"] = "known-arguments"
        for name in ("argument", "value"):
            # One hint for every row, above them (see policy_edit.html).
            form.fields[name].widget.attrs["aria-describedby"] = f"condition-{name}-hint"


def _get_policy_for_manager(request: HttpRequest, pk: int) -> ApprovalPolicy:
    """The rule `pk` with its conditions; 404 if there is none. Every manager may change every
    rule, so the access check is the view's `manager_required`."""
    return get_object_or_404(ApprovalPolicy.objects.prefetch_related("conditions"), pk=pk)


def _listed() -> QuerySet[ApprovalPolicy]:
    """Every rule, enabled or not, in the order `engine.policies.load_rules` reads them, with
    what the list shows: a fixed number of queries however many rules there are."""
    return (
        ApprovalPolicy.objects.select_related("updated_by")
        .prefetch_related("conditions")
        .annotate(decision_count=Count("decisions"))
        .order_by("priority", "id")
    )


def condition_words(condition: PolicyCondition) -> str:
    """A condition for people: "amount is at most 20", "to does not equal the user's email
    address"."""
    operator = ConditionOperator(condition.operator).label.removesuffix(" (comma-separated)")
    if condition.compare_to == ConditionSource.VALUE:
        compared = condition.value or "empty"
    else:
        compared = condition.get_compare_to_display()
    return f"{condition.argument} {operator} {compared}"


def _log(user: Any, policy: ApprovalPolicy, flag: int, message: str | list[Any] = "") -> None:
    """A row of the admin's history of `policy`, as `ModelAdmin.log_addition`/`log_change`/
    `log_deletions` write it (a list `message` is the admin's structured change message)."""
    LogEntry.objects.log_actions(
        user_id=user.pk,
        queryset=[policy],
        action_flag=flag,
        change_message=message,
        single_object=True,
    )


def _header_context() -> dict[str, Any]:
    return {
        "pending_count": pending_count(),
        "socket_query": urlencode({"show": "count"}),
        "tab": "policies",
    }


def _suggestions() -> dict[str, Any]:
    """What the forms suggest: every agent reachable from the registered ones, and the tools
    and argument names of each, their MCP servers' included (`engine.catalogue`)."""
    known = catalogue.catalogue()
    tools: dict[str, str] = {}
    arguments: dict[str, list[str]] = {}
    for tool in known.tools:
        # The server first: the page shortens a long description.
        served = f"MCP server {tool.server}" if tool.server else ""
        described = ": ".join(part for part in (served, tool.description) if part)
        tools.setdefault(tool.tool_name, described)
        for argument in tool.arguments:
            used_by = arguments.setdefault(argument, [])
            if tool.tool_name not in used_by:
                used_by.append(tool.tool_name)
    return {
        "known_agents": list(known.agents),
        "known_tools": sorted(tools.items()),
        "known_arguments": sorted((name, ", ".join(used)) for name, used in arguments.items()),
        "unlisted_servers": known.unlisted,
    }


def _unknown_in(rules: list[ApprovalPolicy]) -> dict[int, list[str]]:
    """For each rule that names an agent or tool no call carries (saved anyway, or gone
    since), why it matches no call. The MCP servers are asked only when a name is not found
    without them."""
    named = [rule for rule in rules if rule.agent_name or rule.tool_name]
    if not named:
        return {}
    found = catalogue.unknown_in([(rule.agent_name, rule.tool_name) for rule in named])
    return {
        rule.pk: [problem.message for problem in problems]
        for rule, problems in zip(named, found, strict=True)
    }


# --- the list -------------------------------------------------------------------------------


@require_GET
@login_required
@manager_required
def policy_list(request: HttpRequest) -> HttpResponse:
    """Every rule in precedence order, each in words, with its switch."""
    rules = list(_listed())
    unknown = _unknown_in(rules)
    for rule in rules:
        rule.condition_words = [condition_words(c) for c in rule.conditions.all()]  # type: ignore[attr-defined]
        rule.unknown_names = unknown.get(rule.pk, [])  # type: ignore[attr-defined]
    context = {
        "rules": rules,
        "enabled_count": sum(1 for rule in rules if rule.enabled),
        "history_url": reverse("inbox_history") + "?" + urlencode({"decision": "policy"}),
        **_header_context(),
    }
    return render(request, "approvals/policies.html", context)


class ToggleForm(forms.Form):
    # The state the button asks for, not a flip: a second click (or a stale page) repeats it.
    enabled = forms.TypedChoiceField(choices=[("on", "on"), ("off", "off")], coerce=str)


@require_POST
@login_required
@manager_required
def policy_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    """Switch a rule on or off; it applies from the next pause."""
    policy = _get_policy_for_manager(request, pk)
    form = ToggleForm(request.POST)
    back = reverse("policies") + f"#policy-{policy.pk}"
    if not form.is_valid():
        messages.error(request, "Say whether to turn the rule on or off.")
        return HttpResponseRedirect(back)
    enabled = form.cleaned_data["enabled"] == "on"
    if policy.enabled != enabled:
        with transaction.atomic():
            policy.enabled = enabled
            policy.updated_by = request.user  # type: ignore[assignment]
            policy.save(update_fields=["enabled", "updated", "updated_by"])
            label = capfirst(ApprovalPolicy._meta.get_field("enabled").verbose_name)
            _log(request.user, policy, CHANGE, [{"changed": {"fields": [str(label)]}}])
    state = "on: it applies from the next pause" if enabled else "off: it is never evaluated"
    messages.success(request, f"Rule “{policy.name}” is {state}.")
    return HttpResponseRedirect(back)


# --- writing a rule -------------------------------------------------------------------------


def _edit(request: HttpRequest, policy: ApprovalPolicy | None) -> HttpResponse:
    adding = policy is None
    # Its name as saved, for the page's title: a form that is not valid has already written
    # the input onto `instance`.
    saved_name = policy.name if policy else ""
    instance = policy or ApprovalPolicy()
    if request.method == "POST":
        form = PolicyForm(request.POST, instance=instance)
        if form.is_valid():
            instance = form.save(commit=False)
        formset = ConditionRows(request.POST, instance=instance, prefix="conditions")
        # Both validated, so every error shows at once.
        if form.is_valid() and formset.is_valid():
            with transaction.atomic():
                instance.updated_by = request.user  # type: ignore[assignment]
                instance.save()
                formset.instance = instance
                formset.save()
                # A ModelForm, as the admin passes it (django-stubs asks for a Form).
                change = construct_change_message(form, [formset], adding)  # type: ignore[arg-type]
                _log(request.user, instance, ADDITION if adding else CHANGE, change)
            verb = "created" if adding else "saved"
            when = "from the next pause" if instance.enabled else "once it is turned on"
            if form.unknown_names:
                # Saved anyway: the list says so too, beside the rule.
                missing = " and ".join(problem.missing for problem in form.unknown_names)
                messages.warning(
                    request,
                    f"Rule “{instance.name}” saved although {missing}: it matches no call "
                    "until one does.",
                )
            else:
                messages.success(request, f"Rule “{instance.name}” {verb}: it applies {when}.")
            return HttpResponseRedirect(reverse("policies") + f"#policy-{instance.pk}")
        status = 400
    else:
        initial = {} if policy else {"action": PolicyAction.APPROVE}
        form = PolicyForm(instance=instance, initial=initial)
        formset = ConditionRows(instance=instance, prefix="conditions")
        status = 200
    form.fields["agent_name"].widget.attrs["list"] = "known-agents"
    form.fields["tool_name"].widget.attrs["list"] = "known-tools"
    decisions = policy.decisions.count() if policy else 0
    context = {
        "form": form,
        "formset": formset,
        "policy": policy,
        "saved_name": saved_name,
        "adding": adding,
        "decision_count": decisions,
        "condition_hints": {
            name: formset.empty_form.fields[name].help_text for name in ("argument", "value")
        },
        **_suggestions(),
        **_header_context(),
    }
    return render(request, "approvals/policy_edit.html", context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
@manager_required
def policy_new(request: HttpRequest) -> HttpResponse:
    """A new rule: its scope, its conditions, what it does."""
    return _edit(request, None)


@require_http_methods(["GET", "POST"])
@login_required
@manager_required
def policy_edit(request: HttpRequest, pk: int) -> HttpResponse:
    """Change a rule; decisions it already took stay as they were."""
    return _edit(request, _get_policy_for_manager(request, pk))


# --- deleting a rule ------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
@manager_required
def policy_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET: what deleting the rule means; POST: delete it."""
    policy = _get_policy_for_manager(request, pk)
    if request.method == "POST":
        name = policy.name
        with transaction.atomic():
            _log(request.user, policy, DELETION)  # before the row goes, as the admin logs it
            policy.delete()
        messages.success(
            request, f"Rule “{name}” deleted. Decisions it took keep its name in the history."
        )
        return HttpResponseRedirect(reverse("policies"))
    context = {
        "policy": policy,
        "conditions": [condition_words(c) for c in policy.conditions.all()],
        "decision_count": policy.decisions.count(),
        **_header_context(),
    }
    return render(request, "approvals/policy_delete.html", context)
