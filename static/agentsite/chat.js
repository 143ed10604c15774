/* The chat page's composer: Enter sends, Shift+Enter starts a new line.
 *
 * Sending is the form's own submit, which htmx turns into its request (and which, without
 * htmx, posts the form as a plain page). The composer is swapped after every send, so the
 * listeners sit on the document.
 *
 * A send whose session has ended (a logout in another tab) is answered with HX-Redirect to
 * the login page. The typed text is kept in this tab's sessionStorage until the login brings
 * the browser back to this chat, which puts it back in the composer. */
(function () {
  "use strict";
  var DRAFT = "agentsite:draft:";

  document.addEventListener("keydown", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("#composer textarea")) return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    box.form.requestSubmit();
  });

  document.addEventListener("htmx:beforeOnLoad", function (event) {
    var form = event.detail.elt;
    if (!form || form.id !== "composer") return;
    if (!event.detail.xhr.getResponseHeader("HX-Redirect")) return;
    var box = form.querySelector("textarea");
    if (!box || !box.value.trim()) return;
    try {
      sessionStorage.setItem(DRAFT + location.pathname, box.value);
    } catch (error) {
      // Storage off or full: the redirect happens anyway.
    }
  });

  function restoreDraft() {
    var draft = null;
    try {
      draft = sessionStorage.getItem(DRAFT + location.pathname);
      sessionStorage.removeItem(DRAFT + location.pathname);
    } catch (error) {
      return;
    }
    var box = document.querySelector("#composer textarea");
    if (draft === null || !box || box.value.trim()) return;
    box.value = draft;
    box.focus();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", restoreDraft);
  } else {
    restoreDraft();
  }

  // An example of the empty chat goes into the message box, for her to send or change.
  document.addEventListener("click", function (event) {
    var example = event.target.closest && event.target.closest("[data-example]");
    var box = document.querySelector("#composer textarea");
    if (!example || !box) return;
    box.value = example.dataset.example;
    box.focus();
  });
})();

/* The chat page tells the truth after reloads and pushes.
 *
 * - Streamed text. A run's block renders what the run had stored of its streamed text when
 *   it was read (`data-length` code points of the stretch `data-segment`: the run's pause
 *   count); each delta frame says where its words start and end in that stretch (`data-at`,
 *   `data-end`). The longest text seen of each run and stretch is kept here: a delta adds
 *   only what the page lacks, a re-rendered block never shows less than was already shown,
 *   and words that arrive beyond what the page has (its socket joined after the run last
 *   stored its text, or a hint was lost), or before the run's block, wait while the page
 *   re-reads the stored text, until it has caught up.
 * - A composer refused because the conversation was busy (`data-busy`: "waiting" for a
 *   reviewer, or "working") loses that error once the run the page showed so no longer is.
 * - The tab's title follows the page's heading when a push renames it. */
(function () {
  "use strict";
  var FIRST_RESYNC_MS = 700;
  var MOST_RESYNC_MS = 5000;
  var streams = {};
  var resyncDelay = FIRST_RESYNC_MS;
  var resyncTimer = null;

  function streamOf(key) {
    if (!streams[key]) streams[key] = { text: "", length: 0, pending: [] };
    return streams[key];
  }

  // False when the delta starts beyond what is known: it has to wait.
  function absorb(stream, delta) {
    if (delta.end <= stream.length) return true;
    if (delta.at > stream.length) return false;
    stream.text += Array.from(delta.text).slice(stream.length - delta.at).join("");
    stream.length = delta.end;
    return true;
  }

  function drain(stream) {
    stream.pending.sort(function (a, b) { return a.at - b.at; });
    stream.pending = stream.pending.filter(function (delta) { return !absorb(stream, delta); });
  }

  function resyncSoon() {
    if (resyncTimer) return;
    resyncTimer = setTimeout(function () {
      resyncTimer = null;
      document.body.dispatchEvent(new CustomEvent("resync"));
    }, resyncDelay);
    resyncDelay = Math.min(resyncDelay * 2, MOST_RESYNC_MS);
  }

  function show(span) {
    var stream = streamOf(span.dataset.run + ":" + span.dataset.segment);
    var rendered = parseInt(span.dataset.length || "0", 10);
    if (rendered > stream.length) {
      stream.text = span.textContent;
      stream.length = rendered;
    }
    drain(stream);
    if (span.textContent !== stream.text) span.textContent = stream.text;
    span.dataset.length = String(stream.length);
    return stream.pending.length === 0;
  }

  function waiting() {
    return Object.keys(streams).some(function (key) { return streams[key].pending.length; });
  }

  function showAll() {
    var caughtUp = true;
    document.querySelectorAll(".stream[data-run]").forEach(function (span) {
      if (!show(span)) caughtUp = false;
    });
    if (!caughtUp) {
      resyncSoon();
      return;
    }
    resyncDelay = FIRST_RESYNC_MS;
    // The block the words waited for arrived: no need to re-read the messages for them.
    if (resyncTimer && !waiting()) {
      clearTimeout(resyncTimer);
      resyncTimer = null;
    }
  }

  document.addEventListener("htmx:wsBeforeMessage", function (event) {
    var message = event.detail && event.detail.message;
    if (typeof message !== "string") return;
    // The conversation changed in another window (another version shown, an undo, a clear):
    // read it again.
    if (message.indexOf("<template data-resync-now>") === 0) {
      event.preventDefault();
      document.body.dispatchEvent(new CustomEvent("resync"));
      return;
    }
    if (message.indexOf("data-delta") < 0) return;
    var template = document.createElement("template");
    template.innerHTML = message;
    var frame = template.content.firstElementChild;
    if (!frame || !frame.hasAttribute("data-delta")) return;
    event.preventDefault();
    var key = frame.dataset.run + ":" + frame.dataset.segment;
    var stream = streamOf(key);
    stream.pending.push({
      at: parseInt(frame.dataset.at, 10),
      end: parseInt(frame.dataset.end, 10),
      text: frame.textContent,
    });
    var span = document.getElementById("run-" + frame.dataset.run + "-text");
    // Words of a run whose block the page does not have yet (the answer to the POST that
    // started it may come after its first words), or of a stretch the block does not show
    // yet: they wait, and the page re-reads its messages unless the block arrives first.
    if (span && key === span.dataset.run + ":" + span.dataset.segment) showAll();
    else resyncSoon();
  });

  function clearBusyError() {
    var error = document.querySelector("#composer-error[data-busy]");
    if (!error) return;
    var turns = document.querySelectorAll("#messages .turn[data-active]");
    var still = Array.prototype.some.call(turns, function (turn) {
      var waiting = turn.dataset.status === "waiting";
      return error.dataset.busy === "waiting" ? waiting : !waiting;
    });
    // Only once the page has shown the run it was refused for (its block may arrive later).
    if (still) {
      error.dataset.seen = "";
      return;
    }
    if (!("seen" in error.dataset)) return;
    var form = error.closest("form");
    var box = form && form.querySelector("textarea");
    if (form) form.classList.remove("has-error");
    if (box) {
      box.removeAttribute("aria-invalid");
      box.removeAttribute("aria-describedby");
    }
    error.remove();
  }

  function syncTitle() {
    var heading = document.querySelector("[data-testid=chat-title]");
    if (!heading) return;
    var suffix = " · agentsite";
    if (document.title !== heading.textContent + suffix) document.title = heading.textContent + suffix;
  }

  // The message box names who answers the next message, as the header does after a push
  // (a handoff): "Message Billing…".
  function syncPlaceholder() {
    var chip = document.getElementById("agent-chip");
    var box = document.querySelector("#composer textarea");
    var name = chip && chip.textContent.trim();
    if (!box || !name || name === "agent") return;
    var wanted = "Message " + name + "…";
    if (box.placeholder !== wanted) box.placeholder = wanted;
  }

  function refresh() {
    showAll();
    clearBusyError();
    syncTitle();
    syncPlaceholder();
  }

  // A re-read of the messages is the database as it was when the server read it. Whatever
  // reaches the page while one is out (a push, applied or missing its target; the answer to
  // something the page posted; another re-read asked for, which htmx drops once the list it
  // queued on is swapped out) may be newer than its answer: the page reads once more after
  // it lands, or it could stay behind for good (a pause shown as "running", no push to
  // come). Once the new list has settled, that is: before, its triggers are not listening
  // yet.
  var reading = 0;
  var again = false;
  var readAfterSettle = null;
  // Requests whose answer reached the page (its swap event came up to the document: the
  // element it answers to was still in it).
  var landed = typeof WeakSet === "function" ? new WeakSet() : null;

  function readAgain() {
    if (readAfterSettle) clearTimeout(readAfterSettle);
    readAfterSettle = null;
    document.body.dispatchEvent(new CustomEvent("resync"));
  }

  function isRead(event) {
    var target = event.detail && event.detail.target;
    return !!target && target.id === "messages";
  }

  // A request that changes something (anything but a GET).
  function isPost(event) {
    var verb = event.detail.requestConfig && event.detail.requestConfig.verb;
    return !!verb && verb !== "get";
  }

  function noteNews() {
    if (reading) again = true;
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (isRead(event)) {
      reading += 1;
      return;
    }
    var elt = event.detail.elt;
    var xhr = event.detail.xhr;
    if (!isPost(event) || !elt || !xhr) return;
    // A re-read that lands while this is out replaces the form it came from: its answer then
    // goes nowhere (htmx swaps it into the old form, and its events reach no listener), so
    // once it is in, the page reads what it changed. A form its own answer replaced is gone
    // too, but its answer is on the page: nothing to read.
    xhr.addEventListener("loadend", function () {
      if ((landed && landed.has(xhr)) || document.body.contains(elt)) return;
      if (reading) again = true;
      else setTimeout(readAgain, 0);
    });
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (landed && event.detail && event.detail.xhr) landed.add(event.detail.xhr);
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (!isRead(event)) {
      // Something this page changed (a rating, a stop, a withdraw): a read that went out
      // before it may land after its answer, with the old state.
      if (isPost(event)) noteNews();
      return;
    }
    reading = Math.max(0, reading - 1);
    if (reading || !again) return;
    again = false;
    // Without a swap (an error), at once; else after the settle, or in a second at most.
    if (event.detail.successful) readAfterSettle = setTimeout(readAgain, 1000);
    else setTimeout(readAgain, 0);
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    if (readAfterSettle && isRead(event)) readAgain();
  });
  document.addEventListener("htmx:wsAfterMessage", function (event) {
    var message = event.detail && event.detail.message;
    if (typeof message === "string" && message.indexOf("data-delta") < 0) noteNews();
  });
  document.addEventListener("htmx:oobErrorNoTarget", noteNews);
  function listenForResync() {
    document.body.addEventListener("resync", noteNews);
  }

  document.addEventListener("htmx:afterSettle", refresh);
  document.addEventListener("htmx:wsAfterMessage", refresh);
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () {
      listenForResync();
      refresh();
    });
  } else {
    listenForResync();
    refresh();
  }
})();

/* An edit or a comment in progress survives the page re-reading its messages.
 *
 * Each of her messages has an Edit box, each rated reply a comment box (a <details> with a
 * form, or in one). The page re-reads its whole message list whenever its socket
 * (re)connects, and a pushed run block replaces the old one: either would close a box she
 * opened and lose what she typed. What each open box holds is kept here, by the address it
 * posts to (and the version it edits), and put back in the box that replaces it; the box she
 * was typing in gets the focus back. Sending the form drops it: the answer is the truth. */
(function () {
  "use strict";
  var BOXES = "details.msg-edit, details.feedback-more";
  var TYPED = "details.msg-edit textarea, details.feedback-more textarea";
  var drafts = {};

  function keyOf(details) {
    var form = details.querySelector("form") || details.closest("form");
    if (!form) return null;
    var branch = details.querySelector("input[name=branch]");
    return form.getAttribute("action") + "|" + (branch ? branch.value : "");
  }

  function draftOf(element) {
    var details = element.closest && element.closest(BOXES);
    var key = details && keyOf(details);
    if (!key) return null;
    if (!drafts[key]) drafts[key] = { open: details.open, text: null, focused: false };
    return drafts[key];
  }

  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (!details.matches || !details.matches(BOXES)) return;
    var key = keyOf(details);
    if (!key) return;
    if (details.open) {
      var draft = draftOf(details);
      if (draft) draft.open = true;
    } else {
      delete drafts[key];  // closed by her: nothing to keep
    }
  }, true);

  document.addEventListener("input", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches(TYPED)) return;
    var draft = draftOf(box);
    if (draft) draft.text = box.value;
  });

  function rememberFocus() {
    Object.keys(drafts).forEach(function (key) { drafts[key].focused = false; });
    var active = document.activeElement;
    if (active && active.matches && active.matches(TYPED)) {
      var draft = draftOf(active);
      if (draft) draft.focused = true;
    }
  }

  function restore() {
    document.querySelectorAll(BOXES).forEach(function (details) {
      var key = keyOf(details);
      var draft = key && drafts[key];
      if (!draft) return;
      if (!details.open) details.open = true;
      var box = details.querySelector("textarea");
      if (!box) return;
      // A box the server sent back with an error holds what she typed already.
      if (draft.text !== null && !box.hasAttribute("aria-invalid")) box.value = draft.text;
      if (draft.focused && document.activeElement !== box) {
        box.focus();
        draft.focused = false;
      }
    });
  }

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form || !form.querySelector) return;
    var details = form.matches(BOXES) ? form : form.closest(BOXES) || form.querySelector(BOXES);
    var key = details && keyOf(details);
    if (key) delete drafts[key];
  }, true);

  document.addEventListener("htmx:beforeSwap", rememberFocus);
  document.addEventListener("htmx:oobBeforeSwap", rememberFocus);
  // At once when the new boxes are in, before any key she presses lands in one (htmx gives
  // the focus to the box of the same id as it swaps, and settles a moment later), and again
  // once settled.
  document.addEventListener("htmx:afterSwap", restore);
  document.addEventListener("htmx:afterSettle", restore);
  document.addEventListener("htmx:oobAfterSwap", restore);
  document.addEventListener("htmx:wsAfterMessage", restore);
})();
