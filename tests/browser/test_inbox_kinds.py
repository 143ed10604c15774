"""Each kind of call in a real Chromium: rita's inbox with a shell command, a file patch and a
hosted MCP server's call to decide. She reads each (the commands as a code block, the patch as a
diff, the server beside the tool), rejects the shell command and approves the patch, at desktop
and phone width. With AGENTSITE_SCREENSHOTS=1 (tests/live.py) the README's pictures are written
to docs/screenshots (inbox-kinds.png, inbox-patch.png, inbox-patch-phone.png); the others always
go to the test's temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest, ApprovalStatus, ToolKind
from conversations.models import SessionItem
from tests.approvals.test_views import XSS
from tests.browser import open_inbox
from tests.factories import make_request, make_reviewer, make_run, make_user
from tests.live import start_site, stop_site
from tests.live import test_database_url as current_database_url

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "pass-for-tests"
DIFF = (
    "@@ -12,7 +12,9 @@ def total(order):\n"
    "     subtotal = sum(line.price * line.quantity for line in order.lines)\n"
    "-    tax = subtotal * 0.2\n"
    "+    rate = TAX_RATES.get(order.country, DEFAULT_RATE)\n"
    '+    tax = (subtotal * rate).quantize(Decimal("0.01"))\n'
    "     shipping = 0 if subtotal >= FREE_SHIPPING else SHIPPING_FEE\n"
    "-    return subtotal + tax + shipping\n"
    "+    # Rounded once, here: every caller used to round the total its own way, and the"
    " invoices and the order page disagreed by a cent now and then.\n"
    f"+    return subtotal + tax + shipping  # {XSS}\n"
    " \n"
    " \n"
    " def refund(order, amount):\n"
    "     assert amount <= order.paid\n"
)
SHELL = {
    "commands": ["ls -la build/", "rm -rf build/ && make dist", f"echo {XSS}"],
    "timeout_ms": 60000,
    "max_output_length": 4096,
}


@pytest.fixture
def site(django_db_blocker: Any, tmp_path_factory: Any) -> Any:
    """A server of its own whose executor never runs the decided runs: these requests are
    rows made here, with no saved state to resume."""
    with django_db_blocker.unblock():
        database_url = current_database_url()
    site = start_site(
        database_url,
        tmp_path_factory.mktemp("kinds") / "daphne.log",
        {
            "AGENTSITE_SWEEP_SECONDS": "0",
            "AGENTSITE_HEARTBEAT_SECONDS": "0",
            "AGENTSITE_EXECUTOR": "tasks",
        },
    )
    yield site
    stop_site(site)


def requests_of_each_kind() -> dict[str, ApprovalRequest]:
    alice = make_user(username="alice")

    def request(text: str, **kwargs: Any) -> ApprovalRequest:
        run = make_run(owner=alice, input=text, agent_name="support")
        SessionItem.objects.create(
            conversation=run.conversation, payload={"role": "user", "content": text}
        )
        return make_request(run=run, agent_name="Coder", **kwargs)

    return {
        "hosted": request(
            "how does the SDK resume a paused run?",
            tool_name="ask_question",
            kind=ToolKind.HOSTED_MCP,
            server="deepwiki",
            arguments={
                "repoName": "openai/openai-agents-python",
                "question": "How does RunState resume after an approval?",
            },
        ),
        "patch": request(
            "round the tax once in total()",
            tool_name="apply_patch",
            kind=ToolKind.APPLY_PATCH,
            arguments={"type": "update_file", "path": "shop/billing.py", "diff": DIFF},
        ),
        "shell": request(
            "rebuild the release",
            tool_name="shell",
            kind=ToolKind.SHELL,
            arguments=SHELL,
        ),
    }


def no_sideways_scroll(page: Any) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page scrolls sideways on a phone ({width}px)"


def test_rita_reads_and_decides_a_shell_command_a_patch_and_a_hosted_mcp_call(
    site: Any, page: Any, browser: Any, screenshots: Path, tmp_path: Path
) -> None:
    make_reviewer("rita", PASSWORD)
    made = requests_of_each_kind()
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)

    open_inbox(page, site, "rita")
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(3)
    hosted = page.locator(f"#request-{made['hosted'].pk}")
    expect(hosted.locator(".tool-name")).to_have_text("ask_question · hosted MCP server deepwiki")
    expect(hosted.get_by_text("Respond as the tool")).to_have_count(0)
    expect(hosted.get_by_text("Edit, then approve")).to_have_count(0)

    shell = page.locator(f"#request-{made['shell'].pk}")
    expect(shell.locator(".shell-command")).to_have_text(SHELL["commands"])
    expect(shell.locator(".shell-facts")).to_contain_text("Timeout60 s")
    # Drawn by CSS, not part of the text: copying the block copies the commands alone.
    prompt = shell.locator(".shell-command").first.evaluate(
        "element => getComputedStyle(element, '::before').content"
    )
    assert prompt == '"$ "'

    patch = page.locator(f"#request-{made['patch'].pk}")
    expect(patch.locator(".patch-head")).to_contain_text("Update the file shop/billing.py +4 −2")
    expect(patch.locator("tr.diff-add")).to_have_count(4)
    expect(patch.locator("tr.diff-del")).to_have_count(2)
    expect(patch.locator("[data-diff-more]")).to_contain_text("1 more line")
    # Added and removed lines look different: the classes are styled, no style attribute.
    added = patch.locator("tr.diff-add").first.evaluate("e => getComputedStyle(e).backgroundColor")
    removed = patch.locator("tr.diff-del").first.evaluate(
        "e => getComputedStyle(e).backgroundColor"
    )
    assert added != removed and "rgba(0, 0, 0, 0)" not in (added, removed)
    page.screenshot(path=str(screenshots / "inbox-kinds.png"), full_page=True)

    # Filtered to one kind, then to one MCP server: only its rows are left; Clear brings
    # every row back.
    page.get_by_label("Kind").select_option("Shell command")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(1)
    expect(shell.locator(".shell-command")).to_have_count(3)
    expect(page.get_by_label("Kind")).to_have_value("shell")
    page.get_by_label("Kind").select_option("All kinds")
    page.get_by_label("MCP server").select_option("deepwiki")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(1)
    expect(hosted).to_be_visible()
    # Its socket's first re-read done: a screenshot marks the focused box with a style that a
    # swap after it would copy, which the policy refuses.
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.locator("#pending-rows.htmx-request")).to_have_count(0)
    page.screenshot(path=str(tmp_path / "inbox-kinds-filtered.png"))
    page.get_by_role("link", name="Clear").click()
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.locator("#pending-rows.htmx-request")).to_have_count(0)
    expect(page.locator("#pending-rows > li.row-pending")).to_have_count(3)

    # A bulk decision lists each call as its row shows it; cancelling decides nothing.
    page.get_by_label("Select all").check()
    page.get_by_role("button", name="Reject selected").click()
    dialog = page.get_by_role("dialog", name="Reject 3 requests?")
    expect(dialog.locator(".confirm-row")).to_have_count(3)
    expect(dialog.locator(".tool-server")).to_have_text(" · hosted MCP server deepwiki")
    expect(dialog.locator(".shell-command")).to_have_count(3)
    expect(dialog.locator("tr.diff-add")).to_have_count(4)
    page.screenshot(path=str(tmp_path / "inbox-kinds-bulk.png"))
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()

    # The patch's page: the whole diff, numbered from its hunk header, escaped.
    page.goto(f"{site.url}/inbox/{made['patch'].pk}/")
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    diff = page.locator("table.diff")
    expect(diff.locator("tr.diff-line")).to_have_count(13)
    expect(diff.locator("tr.diff-add").last).to_contain_text(f"# {XSS}")
    expect(diff.locator("tr.diff-del").first.locator("td.diff-num").first).to_have_text("13")
    expect(diff.locator("tr.diff-add").first.locator("td.diff-num").last).to_have_text("13")
    expect(page.get_by_text("Edit the arguments, then approve")).to_have_count(0)
    page.get_by_text("Raw arguments (JSON)").click()
    expect(page.locator(".args-full")).to_contain_text('"path": "shop/billing.py"')
    page.get_by_text("Raw arguments (JSON)").click()
    page.screenshot(path=str(screenshots / "inbox-patch.png"), full_page=True)

    # The hosted MCP call's page: approve or reject it, nothing else.
    page.goto(f"{site.url}/inbox/{made['hosted'].pk}/")
    expect(page).to_have_title("(3) ask_question · hosted MCP server deepwiki · Inbox · agentsite")
    expect(page.locator("[data-not-answerable]")).to_be_visible()
    expect(page.locator("fieldset.respond")).to_have_count(0)
    page.screenshot(path=str(tmp_path / "inbox-hosted.png"), full_page=True)

    # Reject the shell command, with a message.
    page.goto(f"{site.url}/inbox/{made['shell'].pk}/")
    expect(page.locator("pre.shell-full .shell-command")).to_have_count(3)
    page.screenshot(path=str(tmp_path / "inbox-shell.png"), full_page=True)
    page.get_by_label("Message").fill("Not on the release machine: build in CI.")
    page.get_by_role("button", name="Reject").click()
    decision = page.get_by_role("region", name="Decision")
    expect(decision).to_contain_text("Rejected")
    expect(decision).to_contain_text("by rita")

    # Approve the patch.
    page.goto(f"{site.url}/inbox/{made['patch'].pk}/")
    page.get_by_role("button", name="Approve", exact=True).click()
    decision = page.get_by_role("region", name="Decision")
    expect(decision).to_contain_text("Approved")
    expect(decision).to_contain_text("by rita")

    made["shell"].refresh_from_db()
    made["patch"].refresh_from_db()
    assert made["shell"].status == ApprovalStatus.REJECTED
    assert made["patch"].status == ApprovalStatus.APPROVED
    assert made["shell"].decisions.get().message == "Not on the release machine: build in CI."

    page.goto(f"{site.url}/inbox/history/")
    history = page.locator("table.history tbody tr")
    expect(history).to_have_count(2)
    expect(history.first).to_contain_text("apply_patch: update shop/billing.py")
    expect(history.last.locator(".shell-command")).to_have_text(SHELL["commands"])
    page.screenshot(path=str(tmp_path / "inbox-kinds-history.png"), full_page=True)

    # A phone: nothing scrolls sideways, the diff's long lines wrap in its box.
    phone = browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True
    )
    phone_page = phone.new_page()
    phone_page.set_default_timeout(10_000)
    open_inbox(phone_page, site, "rita")
    expect(phone_page.locator("#pending-rows > li.row-pending")).to_have_count(1)
    phone_page.screenshot(path=str(tmp_path / "inbox-kinds-phone.png"), full_page=True)
    no_sideways_scroll(phone_page)
    phone_page.goto(f"{site.url}/inbox/{made['patch'].pk}/")
    expect(phone_page.locator("table.diff tr.diff-line")).to_have_count(13)
    phone_page.screenshot(path=str(screenshots / "inbox-patch-phone.png"), full_page=True)
    no_sideways_scroll(phone_page)
    box = phone_page.locator(".diff-box").evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert box[0] <= box[1], f"the diff scrolls sideways inside its box ({box})"
    phone.close()
    assert dialogs == []
