/* A reply's rating, after htmx swapped its form for the answer: focus goes where the person
 * goes next, instead of being lost with the button that was replaced. After a thumbs down,
 * the comment box it opened (if nothing is typed there yet); else the button just pressed;
 * after a refused comment, the box with its text and error.
 *
 * Without this (or without JavaScript) the form works the same: it posts and comes back. */
(function () {
  "use strict";
  var pressed = {};

  document.addEventListener("htmx:beforeRequest", function (event) {
    var form = event.detail.elt;
    if (!form || !form.matches || !form.matches("form[data-feedback]")) return;
    var submitter = event.detail.requestConfig && event.detail.requestConfig.triggeringEvent
      ? event.detail.requestConfig.triggeringEvent.submitter : null;
    pressed[form.id] = submitter ? submitter.className : "";
  });

  document.addEventListener("htmx:afterSettle", function () {
    Object.keys(pressed).forEach(function (id) {
      var form = document.getElementById(id);
      var was = pressed[id];
      delete pressed[id];
      if (!form) return;
      var box = form.querySelector("textarea");
      if (box && (box.getAttribute("aria-invalid") === "true" ||
          (was.indexOf("feedback-down") >= 0 && !box.value.trim()))) {
        box.focus();
        return;
      }
      var button = was && form.querySelector("." + was.split(" ").pop());
      if (button) button.focus();
    });
  });
})();
