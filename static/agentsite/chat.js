/* The chat page's composer: Enter sends, Shift+Enter starts a new line.
 *
 * Sending is the form's own submit, which htmx turns into its request (and which, without
 * htmx, posts the form as a plain page). The composer is swapped after every send, so the
 * listener sits on the document. */
(function () {
  "use strict";
  document.addEventListener("keydown", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches("#composer textarea")) return;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    event.preventDefault();
    box.form.requestSubmit();
  });
})();
