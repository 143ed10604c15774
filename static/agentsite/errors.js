/* What a failed htmx request tells the person who made it.
 *
 * htmx swaps nothing for a 4xx/5xx answer (the site's htmx-config) and nothing when the
 * server cannot be reached, so without this a click that failed looks like a click that did
 * nothing. The page's `#request-problem` notice says what happened and what to do; what was
 * typed stays where it was (nothing is swapped). The text is set as text, never as HTML.
 * The notice goes away with the next request that succeeds, or its Dismiss button. */
(function () {
  "use strict";

  var BY_STATUS = {
    400: "The site could not read that request. Nothing was changed.",
    403: "You are no longer allowed to do that (your session or permissions changed). Reload the page.",
    404: "That is no longer there: it was deleted, or is not yours. Reload the page.",
    405: "That action is not available here. Reload the page.",
    409: "Someone else changed this first. Reload the page to see it.",
    410: "That has ended in the meantime. Reload the page to see it.",
    413: "That was too large to send. Nothing was changed.",
  };
  var SERVER = "The site could not do that just now. Nothing you typed was lost: try again in a moment.";
  var OFFLINE = "The site could not be reached. Nothing you typed was lost: check your connection and try again.";

  function notice() {
    return document.getElementById("request-problem");
  }

  function show(text) {
    var box = notice();
    if (!box) return;
    box.querySelector("[data-problem-text]").textContent = text;
    box.hidden = false;
  }

  function hide() {
    var box = notice();
    if (box) box.hidden = true;
  }

  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr ? event.detail.xhr.status : 0;
    show(BY_STATUS[status] || (status >= 500 ? SERVER : "That did not work (" + status + "). Reload the page."));
  });
  document.addEventListener("htmx:sendError", function () {
    show(OFFLINE);
  });
  document.addEventListener("htmx:timeout", function () {
    show(OFFLINE);
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    if (event.detail.successful) hide();
  });
  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest("[data-problem-dismiss]")) hide();
  });
})();
