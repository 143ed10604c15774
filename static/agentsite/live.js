/* agentsite live pages, on top of htmx's ws extension.
 *
 * - Every (re)connect fires a `resync` event on <body>: live lists re-fetch themselves
 *   (`hx-trigger="resync from:body"`), so nothing pushed while the socket was down (or before
 *   it first connected) is ever missed. Pushes are hints; the page re-reads the truth.
 * - A socket that closes for any reason other than a refusal reconnects with backoff (the
 *   extension itself retries only a few close codes). A socket closed with 4403 (logged out,
 *   or no longer allowed) stays closed and the status says "Log in again".
 * - A `[data-live-status]` element shows whether updates are live.
 * - `[data-title-count]` (e.g. the inbox badge) is mirrored into the tab title.
 */
(function () {
  "use strict";
  var retries = 0;

  function setStatus(text, state) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.textContent = text;
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
    retries = 0;
    setStatus("Live", "live");
    document.body.dispatchEvent(new CustomEvent("resync"));
  });

  document.addEventListener("htmx:wsClose", function (event) {
    var code = event.detail && event.detail.event ? event.detail.event.code : 0;
    // 4403 is our consumers' "not allowed": the session ended or the permission went.
    // Reconnecting cannot help, so the page says what will.
    if (code === 4403) {
      setStatus("Log in again", "refused");
      return;
    }
    setStatus("Reconnecting…", "offline");
    // The extension retries these itself.
    if ([1006, 1011, 1012, 1013].indexOf(code) >= 0) return;
    var wrapper = event.detail && event.detail.socketWrapper;
    if (!wrapper || !wrapper.reconnect) return;
    var delay = Math.min(1000 * Math.pow(2, retries), 15000) * (0.5 + Math.random() / 2);
    retries += 1;
    setTimeout(wrapper.reconnect, delay);
  });

  document.addEventListener("htmx:oobAfterSwap", syncTitle);
  document.addEventListener("htmx:afterSwap", syncTitle);
  document.addEventListener("DOMContentLoaded", syncTitle);
})();
