"""The reviewers' inbox: pending tool calls, one request with its conversation, the history.

Every decision is a CSRF-protected POST through `runs.decide`, never a websocket message; the
socket only pushes hints (see `consumers.py`). Every page works without JavaScript: htmx
swaps fragments when it runs, plain forms redirect with a message when it does not.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import reswap, retarget

from approvals import explain
from approvals.forms import (
    ArgumentsForm,
    BulkDecisionForm,
    DecisionForm,
    HistoryFilterForm,
    InboxFilterForm,
    confirmation_token,
)
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, ToolKind
from common.http import HtmxHttpRequest
from conversations.items import format_call
from conversations.rendering import review_lines
from conversations.session import open_session
from engine import registry, runs
from engine.permissions import allowed_only, is_reviewer

PENDING_LIMIT = 100
HISTORY_PAGE_SIZE = 50
TRANSCRIPT_ITEMS = 60


# --- queries, shared with the consumer ------------------------------------------------------


def open_requests() -> QuerySet[ApprovalRequest]:
    """Requests a reviewer can still decide."""
    return ApprovalRequest.objects.open()


def with_people(requests: QuerySet[ApprovalRequest]) -> QuerySet[ApprovalRequest]:
    """Everything a row shows, in the same query: who asked, who decided, whose conversation
    it is (who may not approve it: `runs.needs_another_reviewer`)."""
    return requests.select_related("run__requested_by", "run__conversation__owner", "decided_by")


def pending_count() -> int:
    return open_requests().count()


def inbox_url(query: str = "") -> str:
    return reverse("inbox") + (f"?{query}" if query else "")


def filter_query(form: InboxFilterForm) -> str:
    """The form's non-empty values as a query string, for links and the socket."""
    data = getattr(form, "cleaned_data", {})
    return urlencode({name: data[name] for name in InboxFilterForm.COLUMNS if data.get(name)})


def render_row(approval: ApprovalRequest, **context: Any) -> str:
    """One row of the pending list, in whatever state the request is now, for a push.

    A pushed row has no CSRF token field: its forms post through htmx, which sends the page's
    token in a header (`hx-headers` on <body>). `user` is the reviewer it is rendered for
    (None: any reviewer who did not start its conversation).
    """
    return render_to_string(
        "approvals/inbox.html#row", {"approval": approval, "user": None, **context}, request=None
    )


def filter_fields(form: InboxFilterForm) -> dict[str, Any]:
    """What the pending list's filter selects (`inbox.html#filter-fields`) need: the values
    the open requests have now, and the ones `form` chose."""
    return {"form": form, **_filter_choices(form, open_requests())}


def render_filters(form: InboxFilterForm) -> str:
    """The filter selects, out of band, for a push: a new request may bring an agent or a
    tool the page's selects do not offer yet (inbox.js merges them, keeping what is chosen)."""
    context = {**filter_fields(form), "filters_oob": True}
    return render_to_string("approvals/inbox.html#filter-fields", context, request=None)


# --- access ---------------------------------------------------------------------------------


# 403 for a signed-in user who may not decide tool calls (stack under login_required).
reviewer_required = allowed_only(is_reviewer, "Only reviewers can open the inbox.")


def _get_request_for_reviewer(request: HttpRequest, pk: int) -> ApprovalRequest:
    """The request `pk` with the people it shows; 404 if there is none. Every reviewer sees
    every request, so the access check is the view's `reviewer_required`."""
    return get_object_or_404(with_people(ApprovalRequest.objects.all()), pk=pk)


def _errors_text(form: forms.Form, but: tuple[str, ...] = ()) -> str:
    """The form's errors as one text, but those of the fields `but` (shown at their field)."""
    return " ".join(
        str(error) for name, errors in form.errors.items() if name not in but for error in errors
    )


# The fields a row shows its errors at, under their boxes (the others go in its notice).
ROW_FIELDS = ("message", "note", "response")


def _safe_next(request: HttpRequest, value: str | None, default: str) -> str:
    if value and url_has_allowed_host_and_scheme(
        value, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return value
    return default


# --- the pending list -----------------------------------------------------------------------


def _pending_rows(form: InboxFilterForm) -> list[ApprovalRequest]:
    rows = with_people(open_requests().filter(form.request_filter())).order_by("-created", "-pk")
    pending = list(rows[:PENDING_LIMIT])
    explain.attach(pending)  # each call for people, and what it would touch, for the page at once
    return pending


def _filter_choices(form: InboxFilterForm, requests: QuerySet[ApprovalRequest]) -> dict[str, Any]:
    """The values each filter offers: those the requests have, and the one chosen. The kind
    and server filters are offered once there is more than function tools to tell apart."""
    rows = set(
        requests.order_by().values_list("agent_name", "tool_name", "kind", "server").distinct()
    )
    data = getattr(form, "cleaned_data", {}) or {}
    offered: dict[str, set[str]] = {}
    for index, field in enumerate(InboxFilterForm.COLUMNS):
        chosen = {data[field]} if data.get(field) else set()
        offered[field] = {row[index] for row in rows if row[index]} | chosen
    kinds = [(value, label) for value, label in ToolKind.choices if value in offered["kind"]]
    return {
        "agent_choices": sorted(offered["agent"]),
        "tool_choices": sorted(offered["tool"]),
        "kind_choices": kinds if len(kinds) > 1 or data.get("kind") else [],
        "server_choices": sorted(offered["server"]),
    }


@require_GET
@login_required
@reviewer_required
def inbox(request: HttpRequest) -> HttpResponse:
    """The pending requests, newest first, live (see `consumers.InboxConsumer`)."""
    form = InboxFilterForm(request.GET)
    valid = form.is_valid()
    rows = _pending_rows(form) if valid else []
    query = filter_query(form) if valid else ""
    count = pending_count()
    context = {
        "form": form,
        "rows": rows,
        "pending_count": count,
        "more": valid and len(rows) == PENDING_LIMIT,
        "query": query,
        "back": inbox_url(query),
        # A page with a broken filter shows no rows, so its socket brings none either.
        "socket_query": urlencode({"show": "pending" if valid else "count"})
        + (f"&{query}" if query else ""),
        "tab": "pending",
        **filter_fields(form),
    }
    return render(request, "approvals/inbox.html", context, status=200 if valid else 400)


@require_GET
@login_required
@reviewer_required
def inbox_rows(request: HttpRequest) -> HttpResponse:
    """The pending rows alone, re-read whenever the page's socket (re)connects, with the
    filter's choices (out of band: what arrived while the socket was down may bring new ones)."""
    form = InboxFilterForm(request.GET)
    if not form.is_valid():
        return HttpResponse("That filter is not valid.", status=400)
    query = filter_query(form)
    context = {
        "rows": _pending_rows(form),
        "pending_count": pending_count(),
        "back": inbox_url(query),
        **filter_fields(form),
    }
    return render(request, "approvals/inbox.html#rows-refresh", context)


# --- one request ----------------------------------------------------------------------------


def _latest_decision(approval: ApprovalRequest) -> ApprovalDecision | None:
    return approval.decisions.select_related("reviewer").order_by("-created", "-pk").first()


def arguments_form(approval: ApprovalRequest, data: Any = None) -> ArgumentsForm | None:
    """The form to edit the call's arguments before approving, prefilled with the model's;
    None when they cannot be edited (not a function tool's call or a declared MCP server
    tool's, the tool's author forbids it, the tool is gone, or the stored arguments were
    changed outside agentsite)."""
    sheet = registry.request_sheet(approval.run.agent_name, approval)
    if runs.edit_refusal(approval, sheet):
        return None
    return ArgumentsForm(sheet, approval.arguments, data=data)


def panel_context(
    approval: ApprovalRequest,
    form: DecisionForm | None = None,
    edit_form: ArgumentsForm | None = None,
) -> dict[str, Any]:
    """What the decision panel (`request_detail.html#decision-panel`) needs, for the page, a
    decision and a push alike."""
    decision = None if approval.is_pending else _latest_decision(approval)
    next_request = None
    if not approval.is_pending:
        next_request = open_requests().exclude(pk=approval.pk).order_by("-created", "-pk").first()
    return {
        "approval": approval,
        "decision": decision,
        # An edit, then approval: the page shows the call as it ran, beside the model's.
        "ran_with": (
            explain.ran_with(approval, decision.edited_arguments)
            if decision is not None and decision.is_edit
            else None
        ),
        "decision_form": form or DecisionForm(initial={"seen_hash": approval.arguments_hash}),
        "next_request": next_request,
        "expired": approval.is_overdue(),
        "arguments_form": edit_form or (arguments_form(approval) if approval.is_pending else None),
    }


def _detail_context(
    approval: ApprovalRequest,
    form: DecisionForm | None = None,
    edit_form: ArgumentsForm | None = None,
) -> dict[str, Any]:
    conversation = approval.run.conversation
    session = open_session(conversation.session_id)
    items = async_to_sync(session.get_items)(TRANSCRIPT_ITEMS + 1)
    return {
        **panel_context(approval, form, edit_form),
        "conversation": conversation,
        "lines": review_lines(items[-TRANSCRIPT_ITEMS:], approval.call_id),
        "earlier": len(items) > TRANSCRIPT_ITEMS,
        "pending_count": pending_count(),
        "socket_query": urlencode({"show": "request", "request": str(approval.pk)}),
        "tab": "pending",
    }


@require_GET
@login_required
@reviewer_required
def request_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One request: the conversation so far, the full arguments, and the decision."""
    approval = _get_request_for_reviewer(request, pk)
    return render(request, "approvals/request_detail.html", _detail_context(approval))


# --- deciding -------------------------------------------------------------------------------


def _decided_message(approval: ApprovalRequest, decision: runs.Decision) -> str:
    if decision.action == runs.Action.RESPOND:
        return f"Answered {approval.call_display()} as the tool; it did not run."
    if decision.arguments is not None:
        shown = format_call(approval.tool_name, decision.arguments)
        return f"Approved with edited arguments: {shown}."
    verb = "Approved" if decision.approves else "Rejected"
    suffix = " for the rest of this run" if decision.always else ""
    return f"{verb} {approval.call_display()}{suffix}."


@require_POST
@login_required
@reviewer_required
def decide_request(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Approve, approve always (this run), reject, answer as the tool, or edit the
    arguments and approve, one request."""
    approval = _get_request_for_reviewer(request, pk)
    form = DecisionForm(request.POST)
    in_row = bool(request.htmx) and request.htmx.target == f"request-{pk}"
    detail_url = reverse("inbox_request", args=[pk])
    edit_form: ArgumentsForm | None = None
    valid = form.is_valid()
    if valid and form.edits:
        edit_form = arguments_form(approval, request.POST)
        if edit_form is None:
            form.add_error("action", "The arguments of this call cannot be edited.")
            valid = False
        elif not edit_form.is_valid():
            valid = False
    if not valid:
        if request.htmx:
            # htmx swaps only 2xx answers; the reviewer must see what to fix.
            return _decision_fragment(request, approval, in_row, form=form, edit_form=edit_form)
        context = _detail_context(approval, form, edit_form)
        return render(request, "approvals/request_detail.html", context, status=400)

    decision = form.decided(edit_form.edited if edit_form is not None else None)
    try:
        runs.decide(approval, request.user, decision, seen_hash=form.cleaned_data["seen_hash"])
    except runs.DecisionRefused as refusal:
        notice, ok = str(refusal), False
    else:
        notice, ok = _decided_message(approval, decision), True

    if request.htmx:
        approval = _get_request_for_reviewer(request, pk)
        return _decision_fragment(request, approval, in_row, notice=notice, ok=ok)
    if ok:
        messages.success(request, notice)
        return HttpResponseRedirect(_safe_next(request, form.cleaned_data["next"], inbox_url()))
    messages.warning(request, notice)
    return HttpResponseRedirect(detail_url)


def _decision_fragment(
    request: HtmxHttpRequest,
    approval: ApprovalRequest,
    in_row: bool,
    *,
    form: DecisionForm | None = None,
    edit_form: ArgumentsForm | None = None,
    notice: str = "",
    ok: bool = True,
) -> HttpResponse:
    context: dict[str, Any] = {"notice": notice, "ok": ok, "pending_count": pending_count()}
    if in_row:
        if form is not None:
            # A box's error goes under it, the box open with what was typed (`row_form`).
            errors = _errors_text(form, but=ROW_FIELDS)
            errors += " " + _errors_text(edit_form) if edit_form else ""
            context.update(notice=errors.strip(), ok=False, row_form=form)
        context.update(approval=approval, back=inbox_url())
        return render(request, "approvals/inbox.html#row-decided", context)
    context.update(panel_context(approval, form, edit_form))
    return render(request, "approvals/request_detail.html#decision-response", context)


@require_POST
@login_required
@reviewer_required
def bulk_decide(request: HtmxHttpRequest) -> HttpResponse:
    """Approve or reject the selected requests, in two steps: without a confirmation, list
    what would be decided (`_bulk_confirmation`) and decide nothing; with the confirmation
    those ids were listed with, decide each through `runs.decide`."""
    form = BulkDecisionForm(request.POST, user=request.user)
    back = _safe_next(request, request.POST.get("next"), inbox_url())
    if not form.is_valid():
        errors = _errors_text(form)
        if request.htmx:
            context = {"outcomes": [], "summary": errors, "ok": False}
            context["pending_count"] = pending_count()
            response = render(request, "approvals/inbox.html#bulk-result", context)
            # The first step's answer goes to the confirmation dialog; an error to the flash.
            return retarget(reswap(response, "innerHTML"), "#flash")
        messages.error(request, errors)
        return HttpResponseRedirect(back)
    if not form.is_confirmed():
        return _bulk_confirmation(request, form, back)

    ids: list[int] = form.cleaned_data["ids"]
    found = {a.pk: a for a in ApprovalRequest.objects.filter(pk__in=ids)}
    outcomes: list[dict[str, Any]] = []
    decided = 0
    decision = form.decided()
    for pk in ids:
        approval = found.get(pk)
        if approval is None:
            outcomes.append({"pk": pk, "ok": False, "text": f"Request #{pk} does not exist."})
            continue
        try:
            # The hash the confirmation showed (its token covers it): what changed since is
            # refused by the engine, as is what was decided or expired in between.
            runs.decide(approval, request.user, decision, seen_hash=form.seen_hash(pk))
        except runs.DecisionRefused as refusal:
            text = f"{approval.call_display()}: {refusal}"
            outcomes.append({"pk": pk, "ok": False, "text": text})
        else:
            decided += 1
            outcomes.append({"pk": pk, "ok": True, "text": approval.call_display()})
    verb = "Approved" if form.approve else "Rejected"
    summary = f"{verb} {decided} request{'' if decided == 1 else 's'}."
    refused = [o for o in outcomes if not o["ok"]]
    if refused:
        summary += f" {len(refused)} could not be decided."

    if request.htmx:
        rows = with_people(ApprovalRequest.objects.filter(pk__in=list(found)))
        by_pk = {row.pk: row for row in rows}
        for outcome in outcomes:
            outcome["approval"] = by_pk.get(outcome["pk"])
        context = {
            "outcomes": outcomes,
            "summary": summary,
            "ok": not refused,
            "pending_count": pending_count(),
            "back": back,
        }
        return render(request, "approvals/inbox.html#bulk-result", context)
    if decided:
        messages.success(request, summary)
    for outcome in refused:
        messages.warning(request, outcome["text"])
    return HttpResponseRedirect(back)


def _set_aside_reason(
    approval: ApprovalRequest, form: BulkDecisionForm, user: Any, now: Any
) -> str:
    """Why a selected request will not be decided by this bulk decision ("" when it will)."""
    closed = runs.closed_reason(approval, now)
    if closed is not None:
        return str(closed)
    seen = form.seen_hash(approval.pk)
    if seen is not None and seen != approval.arguments_hash:
        return "Its arguments changed since the inbox showed them; open it to check them."
    if form.approve and runs.needs_another_reviewer(approval, user):
        return runs.SELF_APPROVAL_REFUSED
    if form.approve and not approval.arguments_intact:
        return "Its arguments were changed outside agentsite: it cannot be approved."
    return ""


def bulk_confirmation_for(
    request: HtmxHttpRequest, ids: list[int], *, approve: bool, back: str
) -> HttpResponse:
    """The first step of a bulk decision on `ids` taken elsewhere (the admin's actions): the
    same confirmation, whose confirm button posts to `bulk_decide`, then back to `back`."""
    data = QueryDict(mutable=True)
    data["action"] = "approve" if approve else "reject"
    data.setlist("ids", [str(pk) for pk in ids])
    form = BulkDecisionForm(data, user=request.user)
    if not form.is_valid():
        messages.error(request, _errors_text(form))
        return HttpResponseRedirect(back)
    return _bulk_confirmation(request, form, back)


def _bulk_confirmation(request: HtmxHttpRequest, form: BulkDecisionForm, back: str) -> HttpResponse:
    """The first step: what the bulk decision would decide, read from the database now, in
    the inbox's order; what it would not (and why) set apart. The confirmation's token
    covers exactly the ids it lists, with the arguments hashes it shows."""
    ids: list[int] = form.cleaned_data["ids"]
    found = {a.pk: a for a in with_people(ApprovalRequest.objects.filter(pk__in=ids))}
    explain.attach([a for a in found.values() if a.is_pending])
    now = timezone.now()
    listed: list[ApprovalRequest] = []
    set_aside: list[dict[str, Any]] = []
    # The rows in the inbox's order (newest first), then the ids no row has.
    inbox_order = sorted(found.values(), key=lambda a: (a.created, a.pk), reverse=True)
    for pk in [a.pk for a in inbox_order] + [pk for pk in ids if pk not in found]:
        approval = found.get(pk)
        if approval is None:
            set_aside.append({"pk": pk, "approval": None, "why": f"Request #{pk} does not exist."})
            continue
        why = _set_aside_reason(approval, form, request.user, now)
        if why:
            set_aside.append({"pk": pk, "approval": approval, "why": why})
        else:
            listed.append(approval)
    action = form.cleaned_data["action"]
    hashes = {approval.pk: approval.arguments_hash for approval in listed}
    context = {
        "action": action,
        "approve": form.approve,
        "listed": listed,
        "set_aside": set_aside,
        "selected": len(ids),
        "risks": _risk_counts(listed),
        "token": confirmation_token(request.user.pk, action, hashes) if listed else "",
        "message": form.cleaned_data["message"],
        "note": form.cleaned_data["note"],
        "problem": form.confirm_problem,
        "back": back,
        "modal": bool(request.htmx),
        "pending_count": pending_count(),
        "socket_query": urlencode({"show": "count"}),
        "tab": "pending",
    }
    if request.htmx:
        # Into the inbox's dialog, also when a confirmation posted from it was not taken.
        response = render(request, "approvals/bulk_confirm.html#confirmation", context)
        return retarget(reswap(response, "innerHTML"), "#bulk-confirm")
    return render(request, "approvals/bulk_confirm.html", context)


def _risk_counts(listed: list[ApprovalRequest]) -> list[tuple[str, int]]:
    """How many of the listed calls carry each risk, the gravest first."""
    order = {"irreversible": 0, "high": 1, "low": 2}
    counts: dict[str, int] = {}
    for approval in listed:
        risk = explain.for_request(approval).risk
        counts[risk] = counts.get(risk, 0) + 1
    return sorted(counts.items(), key=lambda item: order.get(item[0], -1))


# --- history --------------------------------------------------------------------------------


def _reviewer_names() -> list[str]:
    """Who decided something (the filter's suggestions): reviewers, and the users who took a
    request of theirs back; not people who may decide but never did. One index probe per
    user (`decision_reviewer_created`)."""
    decided = ApprovalDecision.objects.filter(reviewer=OuterRef("pk"))
    users = get_user_model().objects.filter(Exists(decided))
    return list(users.order_by("username").values_list("username", flat=True)[:500])


@require_GET
@login_required
@reviewer_required
def history(request: HttpRequest) -> HttpResponse:
    """Every decision, newest first: the audit, read from `ApprovalDecision` rows."""
    form = HistoryFilterForm(request.GET)
    valid = form.is_valid()
    decisions = ApprovalDecision.objects.order_by("-created", "-pk")
    decisions = decisions.filter(form.decision_filter()) if valid else decisions.none()
    # Page through the ids alone, then read the page's 50 rows with what they show: walking
    # (or sorting) only `created` and `id` keeps a deep page, or a filter the indexes cannot
    # order, from carrying every row's request and reviewer along.
    page = Paginator(decisions.values_list("pk", flat=True), HISTORY_PAGE_SIZE).get_page(
        form.cleaned_data.get("page") if valid else 1
    )
    on_page = list(
        ApprovalDecision.objects.select_related("request", "reviewer")
        .filter(pk__in=list(page.object_list))
        .order_by("-created", "-pk")
    )
    # What each call was, for people; not what it would touch now, which its decision changed.
    explain.attach([decision.request for decision in on_page], with_facts=False)
    choices = _filter_choices(form, ApprovalRequest.objects.exclude(status=ApprovalStatus.PENDING))
    reviewers = _reviewer_names()
    chosen = form.cleaned_data.get("reviewer") if valid else None
    if chosen and chosen not in reviewers:
        reviewers.append(chosen)
    context = {
        "form": form,
        "page": page,
        "decisions": on_page,
        "pending_count": pending_count(),
        "reviewer_choices": reviewers,
        "decision_choices": HistoryFilterForm.DECISIONS[1:],
        "socket_query": urlencode({"show": "count"}),
        "tab": "history",
        **choices,
    }
    return render(request, "approvals/history.html", context, status=200 if valid else 400)
