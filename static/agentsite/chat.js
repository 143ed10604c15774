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
})();
