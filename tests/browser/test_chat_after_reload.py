"""The chat page after reloads and resumes, in a real Chromium against real daphne servers: it
shows what is so (what has streamed, who answers, what a call waits for, a rating), whatever
order its re-reads and pushes land in; and so does the request page."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from engine import executor, runs
from tests.browser import (
    WAITING,
    in_thread,
    log_in,
    open_new_chat,
    say,
    still_same_document,
)
from tests.factories import PASSWORD, make_conversation, make_reviewer
from tests.live import start_site, stop_site
from tests.live import test_database_url as current_database_url
from tracing.models import Feedback

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    # alice is the demo customer who owns orders 42, 44 and 46.
    pytest.mark.usefixtures("orders"),
]

# Every text the streaming reply shows, on a node that re-syncs never replace.
WATCH_STREAM = """() => {
  window.__streamTexts = [];
  new MutationObserver(() => {
    document.querySelectorAll(".stream").forEach((el) => {
      const seen = window.__streamTexts;
      if (el.textContent && seen[seen.length - 1] !== el.textContent) seen.push(el.textContent);
    });
  }).observe(document.querySelector(".chat-column"), {
    childList: true, subtree: true, characterData: true,
  });
}"""


@pytest.fixture
def slow_site(django_db_blocker: Any, live_site: Any, tmp_path: Path) -> Iterator[Any]:
    """A server whose demo model writes a word every 0.15 s: a reply takes seconds."""
    with django_db_blocker.unblock():
        database_url = current_database_url()
    site = start_site(database_url, tmp_path / "slow.log", {"AGENTSITE_DEMO_STREAM_DELAY": "0.15"})
    yield site
    stop_site(site)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_a_reload_mid_stream_shows_the_text_streamed_before_it(
    slow_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, slow_site)
    say(page, "hello")  # the demo model's introduction: some 40 words
    stream = page.locator(".stream")
    expect(stream).to_have_text(re.compile(r"^.{60,}"), timeout=10_000)

    page.reload()
    # What the run had stored when the page was read, before any word arrives over the socket.
    shown = page.locator(".stream").text_content() or ""
    assert len(shown) >= 40, shown
    page.evaluate(WATCH_STREAM)

    reply = page.locator(".msg-assistant .markdown").last
    expect(reply).to_contain_text("offline demo model", timeout=20_000)
    final = flat(reply.text_content() or "")
    assert final.startswith(flat(shown)), (shown, final)
    texts = [flat(text) for text in page.evaluate("window.__streamTexts")]
    assert texts, "the text went on streaming after the reload"
    # No word twice, none lost: each text the page showed is the start of the reply, growing.
    for text in texts:
        assert final.startswith(text), (text, final)
    assert [len(text) for text in texts] == sorted(len(text) for text in texts)


def test_the_first_message_retitles_the_chat_and_a_handoff_shows_who_answers(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)
    expect(page.get_by_test_id("chat-title")).to_have_text("New conversation")
    expect(page.get_by_text("Start the conversation")).to_be_visible()
    expect(page.get_by_test_id("answering")).to_have_text("Support desk")

    say(page, "where is order 44")
    expect(page.get_by_test_id("chat-title")).to_have_text("where is order 44")
    expect(page).to_have_title("where is order 44 · agentsite")
    expect(page.get_by_text("Start the conversation")).to_be_hidden()
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text("shipped")

    say(page, "I have a billing question")
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text("Hi, this is Billing.")
    expect(page.get_by_test_id("answering")).to_have_text("Billing")
    say(page, "I have a support desk question")
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text(
        "Hi, this is Support desk."
    )
    expect(page.get_by_test_id("answering")).to_have_text("Support desk")
    assert still_same_document(page)


def test_the_waiting_error_clears_when_the_run_resumes(
    live_site: Any, page: Any, alice: Any, screenshots: Path
) -> None:
    open_new_chat(page, live_site)
    say(page, "cancel order 42")
    expect(page.get_by_text(WAITING)).to_be_visible()
    say(page, "and refund it")
    error = page.locator("#composer-error")
    expect(error).to_contain_text("waiting for a reviewer's approval")
    page.screenshot(path=screenshots / "chat-waiting-plain.png", caret="initial")

    request = ApprovalRequest.objects.get(tool_name="cancel_order")
    # Decided in this process: the waiting page finds out by re-reading the database.
    decider = threading.Thread(
        target=runs.decide, args=(request, make_reviewer(), runs.Decision.approve())
    )
    decider.start()
    decider.join()
    assert executor.inprocess().wait_idle(timeout=20)
    expect(page.locator(".msg-assistant .markdown").last).to_contain_text(
        "is now cancelled", timeout=25_000
    )
    expect(error).to_have_count(0)
    expect(page.get_by_label("Message")).to_have_value("and refund it")  # still hers to send
    assert still_same_document(page)


def test_the_request_page_stops_waiting_once_another_reviewer_decides(
    live_site: Any, page: Any, browser: Any, monkeypatch: pytest.MonkeyPatch, alice: Any
) -> None:
    monkeypatch.setattr("engine.executor.submit", lambda job, run_id: None)
    make_reviewer("rita")
    make_reviewer("bob")

    def work() -> int:
        conversation = make_conversation(owner=alice, agent_name="support")
        run = runs.start_run(conversation, "cancel order 42", alice)
        asyncio.run(runs.execute(run.pk))
        return run.pk

    request = ApprovalRequest.objects.get(run_id=in_thread(work))
    url = f"/inbox/{request.pk}/"
    log_in(page, live_site, "rita", PASSWORD, then=url)
    expect(page.locator("[data-live-status]")).to_have_text("Live")
    state = page.locator(f"#call-state-{request.pk}")
    expect(state).to_have_text("waiting for you")

    other = browser.new_context().new_page()
    log_in(other, live_site, "bob", PASSWORD, then=url)
    # htmx has taken the form over (a click before that would post it as a plain page).
    expect(other.locator("[data-live-status]")).to_have_text("Live")
    other.get_by_role("button", name="Approve", exact=True).click()
    expect(other.locator(f"#call-state-{request.pk}")).to_have_text("approved by bob")

    expect(state).to_have_text("approved by bob")  # pushed to rita's open page
    expect(page.get_by_text("waiting for you")).to_have_count(0)


# A delta frame as the chat socket sends it, for a run whose block the page lacks, then that
# block as the answer to the POST that started the run brings it, late.
DELTA_BEFORE_BLOCK = """() => {
  const frame = (at, text) => '<span hx-swap-oob="beforeend:#run-999999-text" data-delta ' +
    'data-run="999999" data-segment="0" data-at="' + at + '" data-end="' +
    (at + text.length) + '">' + text + '</span>';
  for (const [at, text] of [[0, "Order "], [6, "44 has "]]) {
    document.body.dispatchEvent(new CustomEvent("htmx:wsBeforeMessage", {
      bubbles: true, cancelable: true, detail: {message: frame(at, text)},
    }));
  }
  const block = document.createElement("div");
  block.id = "run-999999";
  block.innerHTML = '<span id="run-999999-text" class="stream" data-run="999999" ' +
    'data-segment="0" data-length="0"></span>';
  document.querySelector("#messages").append(block);
  document.body.dispatchEvent(new CustomEvent("htmx:afterSettle", {bubbles: true}));
  return document.getElementById("run-999999-text").textContent;
}"""


def test_words_that_arrive_before_their_runs_block_are_shown_when_it_comes(
    live_site: Any, page: Any, alice: Any
) -> None:
    open_new_chat(page, live_site)

    # Under load the POST's answer (the run's block) can come after the run's first words.
    assert page.evaluate(DELTA_BEFORE_BLOCK) == "Order 44 has "


def test_a_re_read_that_lands_after_pushes_does_not_take_the_page_back(
    live_site: Any, page: Any, alice: Any
) -> None:
    """The messages re-read by the server before the run paused, but reaching the page after
    the pause's pushes, must not leave the page behind them: no push comes after it to put
    it right (the CI once saw a pause never shown, the page stuck at "running")."""
    open_new_chat(page, live_site)
    held: list[tuple[Any, Any]] = []

    def hold_the_first(route: Any) -> None:
        if held:
            route.continue_()
            return
        held.append((route, route.fetch()))  # answered now, delivered when the test says

    page.route(re.compile(r"/history/$"), hold_the_first)
    # A re-read (its socket reconnected, or words came before their run's block).
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    while not held:
        page.wait_for_timeout(20)
    say(page, "cancel order 42")
    # The run pauses while the re-read is out; its pushes reach the page meanwhile.
    deadline = time.monotonic() + 15
    while not ApprovalRequest.objects.filter(tool_name="cancel_order").exists():
        assert time.monotonic() < deadline, "the run did not pause"
        page.wait_for_timeout(50)
    page.wait_for_timeout(500)

    route, answer = held[0]
    route.fulfill(response=answer)  # the older list lands on top of the pushes

    expect(page.get_by_text(WAITING)).to_be_visible()
    expect(page.locator(".turn[data-status=waiting]")).to_have_count(1)
    expect(page.locator("#chat-empty")).to_have_count(0)
    assert still_same_document(page)


def test_a_re_read_that_lands_after_a_rating_does_not_undo_it(
    live_site: Any, page: Any, alice: Any
) -> None:
    """A re-read answered before the page posted a rating, landing after the rating's answer,
    must not show the old rating: the page reads again (CI once saw the rating undone)."""
    open_new_chat(page, live_site)
    say(page, "where is order 44")
    helpful = page.get_by_role("button", name="Helpful", exact=True)
    expect(helpful).to_have_attribute("aria-pressed", "false")
    held: list[tuple[Any, Any]] = []

    def hold_the_first(route: Any) -> None:
        if held:
            route.continue_()
            return
        held.append((route, route.fetch()))

    page.route(re.compile(r"/history/$"), hold_the_first)
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    while not held:
        page.wait_for_timeout(20)
    helpful.click()
    expect(helpful).to_have_attribute("aria-pressed", "true")

    route, answer = held[0]
    route.fulfill(response=answer)  # read before the rating, with none

    expect(page.locator("#messages.htmx-request")).to_have_count(0)
    page.wait_for_timeout(300)
    expect(helpful).to_have_attribute("aria-pressed", "true")
    assert still_same_document(page)


def test_a_comment_being_typed_survives_a_re_read(live_site: Any, page: Any, alice: Any) -> None:
    open_new_chat(page, live_site)
    say(page, "where is order 44")
    page.get_by_role("button", name="Not helpful").click()
    comment = page.get_by_label("What was wrong, or right? (optional)")
    expect(comment).to_be_focused()
    comment.type("It did not say when")

    # The socket reconnected: the page re-reads its messages (the comment box among them).
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    expect(page.locator("#messages.htmx-request")).to_have_count(1)
    expect(page.locator("#messages.htmx-request")).to_have_count(0)

    expect(comment).to_have_value("It did not say when")
    expect(comment).to_be_focused()
    comment.type(" it arrives.")
    page.get_by_role("button", name="Send comment").click()
    expect(
        page.get_by_role("status").filter(has_text="Thanks, your comment is saved.")
    ).to_be_visible()
    assert Feedback.objects.get().comment == "It did not say when it arrives."


def test_a_rating_s_own_answer_makes_the_page_read_nothing_again(
    live_site: Any, page: Any, alice: Any
) -> None:
    """The rating's form is swapped for its answer, so the form it posted from is gone when
    its request ends, as it is when a re-read replaced it; only the second asks for another
    read. One sent each time re-read the whole list while she began her comment (the full
    suite lost its first letters)."""
    open_new_chat(page, live_site)
    reads: list[str] = []

    def note_read(request: Any) -> None:
        if "/history/" in request.url:
            reads.append(request.url)

    page.on("request", note_read)
    say(page, "where is order 44")
    expect(page.locator(".turn[data-status=completed]")).to_have_count(1)
    seen = -1
    while seen != len(reads):  # the reads the run's pushes asked for are over (1 s at most)
        seen = len(reads)
        page.wait_for_timeout(1200)
    reads.clear()

    page.get_by_role("button", name="Not helpful").click()
    expect(page.get_by_label("What was wrong, or right? (optional)")).to_be_focused()
    page.wait_for_timeout(500)  # a read asked for goes out at once (a timer of 0)
    assert reads == []
    assert list(Feedback.objects.values_list("score", flat=True)) == [-1]


def test_what_she_types_while_a_re_read_settles_follows_what_she_typed_before(
    live_site: Any, page: Any, alice: Any
) -> None:
    """htmx gives the new comment box the focus as it swaps the list in, and settles it a
    moment later: the letters typed in that moment went into the new box, and the draft then
    put back held only them."""
    open_new_chat(page, live_site)
    say(page, "where is order 44")
    page.get_by_role("button", name="Not helpful").click()
    comment = page.get_by_label("What was wrong, or right? (optional)")
    expect(comment).to_be_focused()
    comment.type("It did not say")
    expect(page.locator("#messages.htmx-request")).to_have_count(0)

    page.evaluate("htmx.config.defaultSettleDelay = 1500")  # the moment, made long
    reads: list[tuple[Any, Any]] = []
    page.route(re.compile(r"/history/$"), lambda route: reads.append((route, route.fetch())))
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    while not reads:
        page.wait_for_timeout(20)
    old_box = comment.element_handle()
    route, answer = reads[0]
    route.fulfill(response=answer)
    page.wait_for_function("(box) => !box.isConnected", arg=old_box)
    expect(page.locator("#messages.htmx-settling")).to_have_count(1)
    page.keyboard.type(" when")

    expect(page.locator("#messages.htmx-settling")).to_have_count(0)
    expect(comment).to_have_value("It did not say when")
    expect(comment).to_be_focused()


def test_a_rating_whose_answer_lands_after_a_re_read_replaced_its_form_is_shown(
    live_site: Any, page: Any, alice: Any
) -> None:
    """A re-read read before a rating was saved, landing while the rating's request is still
    out, replaces the form that request answers to: the answer lands nowhere, and the page
    read again (the full suite once saw the rating shown as not given)."""
    open_new_chat(page, live_site)
    say(page, "where is order 44")
    helpful = page.get_by_role("button", name="Helpful", exact=True)
    expect(helpful).to_have_attribute("aria-pressed", "false")
    reads: list[tuple[Any, Any]] = []
    posts: list[tuple[Any, Any]] = []

    def hold_the_first_read(route: Any) -> None:
        if reads:
            route.continue_()
            return
        reads.append((route, route.fetch()))  # before the rating: none

    def hold_the_rating(route: Any) -> None:
        posts.append((route, route.fetch()))  # saved now, answered when the test says

    page.route(re.compile(r"/history/$"), hold_the_first_read)
    page.route(re.compile(r"/feedback/$"), hold_the_rating)
    page.evaluate("document.body.dispatchEvent(new CustomEvent('resync'))")
    while not reads:
        page.wait_for_timeout(20)
    helpful.click()
    while not posts:
        page.wait_for_timeout(20)

    route, answer = reads[0]
    route.fulfill(response=answer)  # the older list replaces the form the rating came from
    expect(page.locator("#messages.htmx-request")).to_have_count(0)
    route, answer = posts[0]
    route.fulfill(response=answer)

    expect(helpful).to_have_attribute("aria-pressed", "true")
    assert list(Feedback.objects.values_list("score", flat=True)) == [1]
    assert still_same_document(page)
