/* The notices of Django's messages (templates/_messages.html): each one's Dismiss button
 * removes it, and every notice on the page goes once the person sends something next (any
 * form, htmx's or a plain one): a notice says what the last thing done did, and would
 * otherwise stay on a page that htmx never reloads (the chat, the inbox). A notice that the
 * answer brings (the inbox swaps one into its #flash) arrives after that, and stays. */
(function () {
  "use strict";

  function notices() {
    return document.querySelectorAll("[data-flash]");
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-flash-dismiss]");
    if (!button) return;
    var notice = button.closest("[data-flash]");
    if (!notice) return;
    // The keyboard's focus goes to the next notice's button, else to the page's main part
    // (the button it was on is gone).
    var all = Array.prototype.slice.call(notices());
    var next = all[all.indexOf(notice) + 1] || all[all.indexOf(notice) - 1];
    notice.remove();
    var target = next && next.querySelector("[data-flash-dismiss]");
    if (!target) {
      target = document.querySelector("main");
      if (target && !target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
    }
    if (target) target.focus({ preventScroll: true });
  });

  document.addEventListener(
    "submit",
    function () {
      notices().forEach(function (notice) {
        notice.remove();
      });
    },
    true
  );
})();
