"""Every page a person uses, audited by axe-core in a real Chromium, at a desktop's width and
a phone's: no violation axe rates critical or serious.

axe-core is vendored under tests/browser/vendor/axe-core/ (its README says which release) and
injected into each page here; the site never serves it. The pages show what people see on
a working day: the demo shop's runs executed in this process (a reply, a call waiting for a
reviewer, one approved, one rejected), their traces stored, the demo's rule and prices.
Third-party pages (the API's Swagger UI) are not ours to fix and are left out.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLResolver, get_resolver
from playwright.sync_api import expect

from approvals.models import ApprovalPolicy
from demo.seed import seed_policies, seed_prices
from engine import runs
from engine.models import AgentRun, RunStatus
from tests.browser import in_thread, log_in
from tests.conftest import Traces
from tests.factories import PASSWORD, grant, make_conversation, make_reviewer, make_user
from tracing.models import Span

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # The demo shop's orders (alice owns 42, 44, 46); runs started here pause without going on.
    pytest.mark.usefixtures("orders", "submitted"),
]

AXE_SOURCE = (Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js").read_text()
WIDTHS = {"desktop": (1366, 768), "phone": (390, 844)}
# What fails a page: axe's two highest impacts ("moderate" and "minor" are reported by axe too).
FAILING = ("critical", "serious")

# axe's violations, each with the elements it found and what it says of the first of them.
AUDIT = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
    targets: v.nodes.map((n) => n.target.join(" ")),
    detail: (v.nodes[0].failureSummary || "").split("\\n").slice(1, 2).join("").trim(),
  }));
}"""


@dataclass(frozen=True)
class Finding:
    where: str
    rule: str
    impact: str
    help: str
    targets: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        shown = ", ".join(self.targets[:5]) + (
            f" (and {len(self.targets) - 5} more)" if len(self.targets) > 5 else ""
        )
        return (
            f"{self.where}: {self.rule} ({self.impact}) {self.help}\n"
            f"    on {shown}\n    {self.detail}"
        )


def audit(page: Any, where: str) -> list[Finding]:
    """What axe finds on `page` as it is now."""
    if not page.evaluate("typeof window.axe === 'object'"):
        # Not `add_script_tag`: that inserts an inline <script>, which the site's Content
        # Security Policy refuses (rightly). Evaluated through the browser's protocol, the
        # script runs under the page as served, its policy still on.
        page.evaluate(AXE_SOURCE)
    return [
        Finding(where, v["id"], v["impact"] or "", v["help"], tuple(v["targets"]), v["detail"])
        for v in page.evaluate(AUDIT)
    ]


def settled(page: Any) -> None:
    """The page has loaded, its socket (if it has one) is open and no htmx request is on the
    way: what axe audits is what a person reads, not a list being swapped."""
    page.wait_for_load_state("load")
    live = page.locator("[data-live-status]")
    if live.count():
        expect(live.first).to_have_text("Live")
    page.wait_for_function("() => !document.querySelector('.htmx-request')")


# A page that does not exist. The live server runs with DEBUG on (it serves the static files),
# where Django answers a 404 with its technical page: the site's own 404 page, the one people
# meet, is rendered by this process (DEBUG off) and handed to the browser at that address; its
# stylesheets still come from the live server.
NOT_FOUND = "/no-such-page/"


def serve_the_sites_404(context: Any, live_site: Any, user: Any) -> None:
    client = Client()
    if user is not None:
        client.force_login(user)
    answer = client.get(NOT_FOUND)
    assert answer.status_code == 404 and b"Go to the home page" in answer.content
    context.route(
        live_site.url + NOT_FOUND,
        lambda route: route.fulfill(
            status=404, headers=dict(answer.headers.items()), body=answer.content
        ),
    )


# A page to audit: its path, or its path and what the person does there first (an action
# whose answer is the page again, with a notice).
Visit = str | tuple[str, Callable[[Any], None]]


def audit_pages(
    browser: Any, live_site: Any, username: str | None, visits: list[Visit]
) -> list[Finding]:
    """Each of `visits`, by `username` (None: nobody logged in) at each width, audited;
    every critical or serious finding."""
    user = get_user_model().objects.get(username=username) if username else None
    found: list[Finding] = []
    for width_name, (width, height) in WIDTHS.items():
        context = browser.new_context(viewport={"width": width, "height": height})
        serve_the_sites_404(context, live_site, user)
        page = context.new_page()
        page.set_default_timeout(10_000)
        if username:
            log_in(page, live_site, username, PASSWORD)
        for visit in visits:
            path, act = visit if isinstance(visit, tuple) else (visit, None)
            page.goto(live_site.url + path)
            settled(page)
            where = f"{path} ({width_name}, {width}px)"
            if act is not None:
                act(page)
                settled(page)
                where = f"{path} after {act.__name__} ({width_name}, {width}px)"
            found += [finding for finding in audit(page, where) if finding.impact in FAILING]
        context.close()
    return found


def assert_none(found: list[Finding]) -> None:
    assert not found, f"{len(found)} critical or serious accessibility violations:\n" + "\n".join(
        str(finding) for finding in found
    )


# --- what the pages show ----------------------------------------------------------------------


@dataclass
class Day:
    """A working day's rows: alice's chats, the requests they made, rita's decisions."""

    chat: str  # a reply, with its tool call; then a call waiting for a reviewer
    approved_chat: str  # a call rita approved, the run about to go on
    rejected_chat: str  # a call rita rejected, the reply that followed
    pending: int  # a request waiting in the inbox
    decided: int  # a request rita rejected, with a message
    trace_id: str  # the trace of the finished reply
    tool_span_id: str  # its tool call's span


def working_day(traces: Traces | None = None) -> Day:
    """The demo's runs executed here (their resumes too, where a decision was taken), the
    demo's rule (off) and prices; rita a reviewer who may write rules and read traces, admin
    a superuser."""
    alice = make_user(username="alice")
    rita = grant(make_reviewer(), "tracing.view_trace", "approvals.manage_approvalpolicy")
    make_user(username="admin", is_staff=True, is_superuser=True)
    seed_policies()
    seed_prices()

    def run(conversation: Any, text: str) -> AgentRun:
        started = runs.start_run(conversation, text, alice)
        asyncio.run(runs.execute(started.pk))
        return AgentRun.objects.get(pk=started.pk)

    def work() -> Day:
        chat = make_conversation(owner=alice, agent_name="support", title="Order 44, order 42")
        answered = run(chat, "where is order 44")
        assert answered.status == RunStatus.COMPLETED, answered.error
        waiting = run(chat, "cancel order 42")
        assert waiting.status == RunStatus.WAITING, waiting.error

        refund = make_conversation(owner=alice, agent_name="support", title="A refund")
        approved = run(refund, "refund 60 on order 42")
        runs.decide(approved.approval_requests.get(), rita, runs.Decision.approve())

        email = make_conversation(owner=alice, agent_name="support", title="An email")
        rejected = run(email, "email alice@example.com about my refund")
        request = rejected.approval_requests.get()
        runs.decide(request, rita, runs.Decision.reject(message="Not to a customer, please."))
        asyncio.run(runs.resume(rejected.pk))
        if traces is not None:
            traces.flush()
        return Day(
            chat=chat.session_id,
            approved_chat=refund.session_id,
            rejected_chat=email.session_id,
            pending=waiting.approval_requests.get().pk,
            decided=request.pk,
            trace_id=answered.trace_id,
            tool_span_id=(
                Span.objects.filter(trace_id=answered.trace_id, span_type="function")
                .values_list("span_id", flat=True)
                .first()
                or ""
            ),
        )

    return in_thread(work)


# --- what people do that leaves a notice on the page ------------------------------------------


def rename(page: Any) -> None:
    page.get_by_text("Options").click()
    page.get_by_label("Title").fill("Order 44, order 42")
    page.get_by_role("button", name="Rename").click()
    expect(page.locator("[data-flash]")).to_contain_text("Renamed.")


def clear(page: Any) -> None:
    page.get_by_role("button", name="Clear conversation").click()
    expect(page.locator("[data-flash]")).to_contain_text("The conversation was cleared.")


def save(page: Any) -> None:
    page.get_by_role("button", name="Save").click()
    expect(page.locator("[data-flash]")).to_contain_text("Saved your email settings.")


def confirm_bulk(page: Any) -> None:
    """The inbox's bulk confirmation, open over the list."""
    page.locator("[data-select-all]").check()
    page.get_by_role("button", name="Approve selected").click()
    expect(page.get_by_role("dialog")).to_be_visible()


def open_reject(page: Any) -> None:
    """A row's reject box, open: a message to the agent and an internal note."""
    row = page.locator("#pending-rows > li.row-pending").first
    row.get_by_role("button", name="Reject", exact=True).click()
    expect(row.get_by_label("Message to the agent")).to_be_focused()


def refuse_an_empty_answer(page: Any) -> None:
    """A row's answer as the tool sent empty: its box open with the error under it."""
    row = page.locator("#pending-rows > li.row-pending").first
    row.get_by_text("Respond as the tool").click()
    row.get_by_role("button", name="Send as the tool's output").click()
    expect(row.get_by_label("The tool's output")).to_have_attribute("aria-invalid", "true")


def toggle(page: Any) -> None:
    page.get_by_role("button", name=re.compile("^Turn (on|off)")).first.click()
    expect(page.locator("[data-flash]")).to_contain_text("Rule")


# --- the audits -------------------------------------------------------------------------------


def test_the_pages_anybody_sees_have_no_serious_violations(live_site: Any, browser: Any) -> None:
    assert_none(audit_pages(browser, live_site, None, ["/", "/accounts/login/", NOT_FOUND]))


def test_the_end_users_pages_have_no_serious_violations(live_site: Any, browser: Any) -> None:
    day = working_day()
    assert_none(
        audit_pages(
            browser,
            live_site,
            "alice",
            [
                "/",
                "/chats/",
                f"/chats/{day.chat}/",
                f"/chats/{day.approved_chat}/",
                (f"/chats/{day.chat}/", rename),
                f"/chats/{day.rejected_chat}/",
                f"/chats/{day.rejected_chat}/clear/",
                (f"/chats/{day.rejected_chat}/clear/", clear),
                "/account/tokens/",
                NOT_FOUND,
                "/inbox/",  # not hers: the 403 page
            ],
        )
    )


def test_the_reviewers_pages_have_no_serious_violations(live_site: Any, browser: Any) -> None:
    day = working_day()
    rule = ApprovalPolicy.objects.get()

    def edited() -> int:
        """A request rita approved with arguments of her own (the page says what ran)."""
        alice = get_user_model().objects.get(username="alice")
        conversation = make_conversation(owner=alice, agent_name="support", title="Order 44")
        started = runs.start_run(conversation, "cancel order 44", alice)
        asyncio.run(runs.execute(started.pk))
        request = AgentRun.objects.get(pk=started.pk).approval_requests.get()
        rita = get_user_model().objects.get(username="rita")
        runs.decide(request, rita, runs.Decision.edit({"order_id": 46}))
        return int(request.pk)

    edited_pk = in_thread(edited)
    assert_none(
        audit_pages(
            browser,
            live_site,
            "rita",
            [
                "/inbox/",
                ("/inbox/", confirm_bulk),
                ("/inbox/", open_reject),
                ("/inbox/", refuse_an_empty_answer),
                f"/inbox/{day.pending}/",
                f"/inbox/{day.decided}/",
                f"/inbox/{edited_pk}/",
                "/inbox/history/",
                "/inbox/policies/",
                ("/inbox/policies/", toggle),
                "/inbox/policies/new/",
                f"/inbox/policies/{rule.pk}/",
                f"/inbox/policies/{rule.pk}/delete/",
                "/account/notifications/",
                ("/account/notifications/", save),
                "/account/tokens/",
            ],
        )
    )


def test_the_operators_pages_have_no_serious_violations(
    live_site: Any, browser: Any, traces: Traces
) -> None:
    day = working_day(traces)
    assert_none(
        audit_pages(
            browser,
            live_site,
            "rita",
            [
                "/traces/",
                f"/traces/{day.trace_id}/",
                f"/traces/{day.trace_id}/spans/{day.tool_span_id}/",
                "/traces/dashboard/",
                "/traces/costs/",
                "/traces/conversations/",
                f"/traces/conversations/{day.chat}/",
            ],
        )
    )


def test_the_admins_pages_have_no_serious_violations(live_site: Any, browser: Any) -> None:
    day = working_day()
    assert_none(
        audit_pages(
            browser,
            live_site,
            "admin",
            [
                "/admin/",
                "/admin/approvals/approvalrequest/",
                f"/admin/approvals/approvalrequest/{day.pending}/change/",
                "/admin/approvals/approvalpolicy/",
                "/admin/engine/agentrun/",
                "/admin/tracing/trace/",
            ],
        )
    )


# --- which pages ------------------------------------------------------------------------------

AUDITED = "audited here"
# Every route of the site (the admin's aside: its index, lists and change pages are audited
# above), and whether its page is audited here or why it is not a page to audit. A new route
# fails the test below until it is listed: a page people use is audited from its first day.
ROUTES = {
    "login": AUDITED,
    "logout": "a POST; its answer is the login page",
    "favicon.ico": "a redirect to the icon",
    "home": AUDITED,
    "chats": AUDITED,
    "chat_new": "a POST; its answer is the new chat's page",
    "chat": AUDITED,
    "chat_history": "the chat's list of messages, re-read into the chat's page",
    "chat_send": "a POST; its answer is part of the chat's page",
    "chat_undo": "a POST; its answer is the chat's page with a notice",
    "chat_clear": AUDITED,
    "chat_rename": AUDITED + " (the chat's page after a rename, with its notice)",
    "chat_edit": "a POST; its answer is part of the chat's page",
    "chat_branch": "a POST; its answer is the chat's page",
    "chat_stop": "a POST; its answer is part of the chat's page",
    "chat_feedback": "a POST; its answer is part of the chat's page",
    "chat_withdraw": "a POST; its answer is part of the chat's page",
    "inbox": AUDITED,
    "inbox_rows": "the inbox's list, re-read into the inbox",
    "inbox_history": AUDITED,
    "inbox_bulk_decide": AUDITED + " (its confirmation, as the inbox's dialog)",
    "inbox_request": AUDITED,
    "inbox_decide": "a POST; its answer is part of the inbox or the request's page",
    "policies": AUDITED,
    "policy_new": AUDITED,
    "policy_edit": AUDITED,
    "policy_toggle": AUDITED + " (the policies' page after a toggle, with its notice)",
    "policy_delete": AUDITED,
    "trace_list": AUDITED,
    "trace_costs": AUDITED,
    "trace_dashboard": AUDITED,
    "trace_export_jsonl": "a file",
    "trace_conversations": AUDITED,
    "trace_conversation": AUDITED,
    "trace_export_otlp": "a file",
    "trace_export_otlp_protobuf": "a file",
    "trace_export": "a file",
    "trace_detail": AUDITED,
    "trace_tree": "the trace's tree, re-read into the trace's page",
    "trace_roots": "part of the trace's tree",
    "trace_subtree": "part of the trace's tree (without htmx: the trace's page)",
    "trace_span": AUDITED,
    "api:openapi-json": "JSON",
    "api:openapi-view": "Swagger UI, django-ninja's vendored page: not ours to fix",
    "api:list_requests": "JSON",
    "api:read_request": "JSON",
    "api:decide": "JSON",
    "api:list_decisions": "JSON",
    "api:read_decision": "JSON",
    "api:read_run": "JSON",
    "api:list_conversations": "JSON",
    "api:start_run": "JSON",
    "api:api-root": "JSON",
    "api_tokens": AUDITED,
    "api_token_revoke": "a POST; its answer is the tokens' page with a notice",
    "notification_settings": AUDITED,
    "notification_open": "a redirect to the request's page (or the login page)",
}


def site_routes(patterns: list[Any], namespace: str = "") -> list[str]:
    names = []
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if pattern.namespace != "admin":
                names += site_routes(pattern.url_patterns, pattern.namespace or namespace)
        elif pattern.name:
            names.append(f"{namespace}:{pattern.name}" if namespace else pattern.name)
        else:
            names.append(str(pattern.pattern))
    return names


def test_every_route_of_the_site_is_audited_or_says_why_not() -> None:
    routes = site_routes(get_resolver("agentsite.urls").url_patterns)
    assert sorted(routes) == sorted(ROUTES)
