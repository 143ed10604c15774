"""Small helpers for the browser tests of this folder."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections
from playwright.sync_api import expect

from tests.factories import PASSWORD

# What the chat says while the demo's cancellation of order 42 waits for a reviewer.
WAITING = "A person will confirm: cancel an order that has not been delivered yet (order 42)"

# Records every length the streaming text of a run takes, on a node the re-syncs never replace.
WATCH_STREAM = """() => {
  window.__streamLengths = [];
  new MutationObserver(() => {
    document.querySelectorAll(".stream").forEach((el) => {
      const n = el.textContent.length;
      const seen = window.__streamLengths;
      if (n && seen[seen.length - 1] !== n) seen.push(n);
    });
  }).observe(document.querySelector(".chat-column"), {
    childList: true, subtree: true, characterData: true,
  });
}"""


def log_in(page: Any, live_site: Any, username: str, password: str, then: str = "/") -> None:
    """Log in through the real login form, then open `then`; return once that page's load
    event came (its stylesheets are in: a layout read before, under load, measured the page
    unstyled)."""
    page.goto(f"{live_site.url}/accounts/login/?next={then}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
    page.wait_for_load_state("load")


def in_thread[T](work: Callable[[], T]) -> T:
    """Run `work` in a thread of its own: Playwright keeps an event loop running in the
    test's thread, where neither `asyncio.run`, `async_to_sync` nor the SDK's trace processor
    may run. The thread's database connections are closed after it."""

    def wrapped() -> T:
        try:
            return work()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(wrapped).result(timeout=30)


# --- the chat ---------------------------------------------------------------------------------


def open_new_chat(page: Any, live_site: Any) -> str:
    """Log in as alice, start a conversation from the list, and wait until its updates are
    live; the page's address."""
    log_in(page, live_site, "alice", PASSWORD, then="/chats/")
    page.get_by_role("button", name="New conversation").click()
    page.wait_for_url(re.compile(r"/chats/conv_[\w-]+/$"))
    wait_until_live(page)
    # Anything that reloads the page would drop this marker.
    page.evaluate("window.__sameDocument = true")
    return str(page.url)


def wait_until_live(page: Any) -> None:
    """The socket is open and the re-sync it started has landed.

    A message sent in the same instant as the page's first re-sync could see that (older)
    list land on top of the run's first pushes; no person types that fast, a test does.
    """
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    expect(page.locator("#messages.htmx-request")).to_have_count(0)


def say(page: Any, text: str) -> None:
    box = page.get_by_label("Message")
    box.fill(text)
    box.press("Enter")


def still_same_document(page: Any) -> bool:
    """The page was not reloaded since `open_new_chat` opened it."""
    return bool(page.evaluate("window.__sameDocument === true"))


def looks(locator: Any) -> dict[str, Any]:
    """What a control looks like: its computed background, corners, left padding and size."""
    return dict(
        locator.evaluate(
            """(e) => { const s = getComputedStyle(e); const r = e.getBoundingClientRect();
            return {background: s.backgroundColor, radius: s.borderTopLeftRadius,
                    padding: parseFloat(s.paddingLeft), height: r.height, width: r.width}; }"""
        )
    )


# --- the inbox --------------------------------------------------------------------------------


def open_inbox(page: Any, live_site: Any, username: str, then: str = "/inbox/") -> None:
    log_in(page, live_site, username, PASSWORD, then=then)
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    # Connecting re-reads the pending list (live.js); a box ticked before the list lands would
    # be replaced by an unticked one.
    expect(page.locator("#pending-rows.htmx-request")).to_have_count(0)


def pause(text: str, owner: Any) -> Any:
    """Run the demo agent on `text` in this process until it asks for approval (its executor
    stubbed: `submitted`); its one request, committed for the server to read."""
    from approvals.models import ApprovalRequest
    from engine import runs
    from tests.factories import make_conversation

    def work() -> int:
        conversation = make_conversation(owner=owner, agent_name="support", title=text)
        run = runs.start_run(conversation, text, owner)
        asyncio.run(runs.execute(run.pk))
        return run.pk

    return ApprovalRequest.objects.get(run_id=in_thread(work))


def wait_for_run(run_id: int, status: str, within: float = 15) -> Any:
    """The run once it has `status` (the server resumes it on its own time)."""
    from engine.models import AgentRun

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        run = AgentRun.objects.get(pk=run_id)
        if run.status == status:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} is {run.status}, not {status}: {run.error}")
