/* agentsite live pages, on top of htmx's ws extension.
 *
 * - Every (re)connect fires a `resync` event on <body>: live lists re-fetch themselves
 *   (`hx-trigger="resync from:body"`), so nothing pushed while the socket was down (or before
 *   it first connected) is ever missed. Pushes are hints; the page re-reads the truth.
 * - A socket that closes for any reason other than a refusal reconnects with backoff (the
 *   extension itself retries only a few close codes). Both retry on one schedule,
 *   `reconnectDelay`: doubling from 1 s, jittered, never more than 15 s apart, so a page finds
 *   a restarted server within 15 s however long it was down (the extension's own schedule,
 *   "full-jitter", waits up to 64 s after six failed tries). A socket closed with 4403 (logged
 *   out, or no longer allowed) stays closed and the status says "Log in again".
 * - A socket closed with 4503 (the server's channel layer is down: live updates cannot reach
 *   it) shows "Live updates paused — re-reading every N s", re-reads the page's live
 *   fragments from the database every N s (the same `resync` as on a reconnect) and keeps
 *   reconnecting with backoff; once a socket stays open, the notice goes and updates are live.
 * - A `[data-live-status]` element shows whether updates are live.
 * - `[data-title-count]` (e.g. the inbox badge) is mirrored into the tab title.
 */
(function () {
  "use strict";
  var retries = 0;
  var POLL_SECONDS = 5;
  // A paused page trusts a socket only once it has stayed open this long: while the layer is
  // down, the server accepts a socket and closes it at once with 4503.
  var CONFIRM_MS = 1000;
  var paused = false;
  var pollTimer = null;
  var confirmTimer = null;

  // The wait before reconnect try number `tries` (0-based): doubling from 1 s, at most `most`
  // ms, jittered down to half so that a restarted server is not met by every page at once.
  function reconnectDelay(tries, most) {
    return Math.min(1000 * Math.pow(2, Math.min(tries, 10)), most) * (0.5 + Math.random() / 2);
  }
  if (window.htmx) {
    htmx.config.wsReconnectDelay = function (tries) { return reconnectDelay(tries, 15000); };
  }

  function resync() {
    document.body.dispatchEvent(new CustomEvent("resync"));
  }

  function pause() {
    setStatus("Live updates paused", "paused");
    if (paused) return;
    paused = true;
    var notice = document.createElement("p");
    notice.className = "live-paused";
    notice.setAttribute("role", "status");
    notice.dataset.livePaused = "";
    notice.textContent = "Live updates paused — re-reading every " + POLL_SECONDS + " s.";
    // Under the header that shows the live status, else at the top of the live part.
    var status = document.querySelector("[data-live-status]");
    var header = status && status.closest("header");
    if (header) {
      header.after(notice);
    } else {
      var where = document.querySelector("[ws-connect]") || document.querySelector("main");
      if (where) where.prepend(notice);
    }
    pollTimer = setInterval(resync, POLL_SECONDS * 1000);
    resync();  // what was pushed while the socket broke may be lost
  }

  function resume() {
    paused = false;
    clearInterval(pollTimer);
    pollTimer = null;
    document.querySelectorAll("[data-live-paused]").forEach(function (el) { el.remove(); });
  }

  function live() {
    retries = 0;
    setStatus("Live", "live");
    resync();
  }

  function setStatus(text, state) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      // A page may say more than "Live" while connected (the trace page: "Waiting for approval").
      el.textContent = state === "live" && el.dataset.liveLabel ? el.dataset.liveLabel : text;
      el.dataset.state = state;
    });
  }

  function syncTitle() {
    var badge = document.querySelector("[data-title-count]");
    if (!badge) return;
    var base = document.body.dataset.baseTitle || document.title.replace(/^\(\d+\)\s*/, "");
    document.body.dataset.baseTitle = base;
    var count = parseInt(badge.dataset.titleCount || "0", 10);
    document.title = count > 0 ? "(" + count + ") " + base : base;
  }

  document.addEventListener("htmx:wsOpen", function () {
    if (!paused) {
      live();
      return;
    }
    clearTimeout(confirmTimer);
    confirmTimer = setTimeout(function () {
      resume();
      live();
    }, CONFIRM_MS);
  });

  document.addEventListener("htmx:wsClose", function (event) {
    clearTimeout(confirmTimer);
    var code = event.detail && event.detail.event ? event.detail.event.code : 0;
    // 4403 is our consumers' "not allowed": the session ended or the permission went.
    // Reconnecting cannot help, so the page says what will.
    if (code === 4403) {
      resume();
      setStatus("Log in again", "refused");
      return;
    }
    // 4503: the server cannot send live updates now; the page re-reads on a timer meanwhile.
    if (code === 4503) pause();
    else if (!paused) setStatus("Reconnecting…", "offline");
    // The extension retries these itself.
    if ([1006, 1011, 1012, 1013].indexOf(code) >= 0) return;
    var wrapper = event.detail && event.detail.socketWrapper;
    if (!wrapper || !wrapper.reconnect) return;
    // While paused, the page tries again at least as often as it re-reads.
    var most = paused ? POLL_SECONDS * 1000 : 15000;
    setTimeout(wrapper.reconnect, reconnectDelay(retries, most));
    retries += 1;
  });

  // A status the page renders empty says "Connecting…" only once this script runs: without
  // JavaScript no socket will ever connect, and the page must not say it is trying.
  function connecting() {
    document.querySelectorAll("[data-live-status][data-state=connecting]").forEach(function (el) {
      if (!el.textContent) el.textContent = "Connecting…";
    });
  }

  document.addEventListener("htmx:oobAfterSwap", syncTitle);
  document.addEventListener("htmx:afterSwap", syncTitle);
  document.addEventListener("DOMContentLoaded", syncTitle);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", connecting);
  else connecting();
})();
