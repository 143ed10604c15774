/* The rule form's "Add a condition" (policy_edit.html): a copy of the formset's empty row,
   numbered as Django's formsets number them. Without JavaScript the page offers a few blank
   rows instead, and saving offers more. */
(function () {
  "use strict";
  function setUp() {
    var box = document.querySelector("[data-conditions]");
    if (!box) return;
    var rows = box.querySelector("[data-condition-rows]");
    var template = box.querySelector("[data-condition-template]");
    var button = box.querySelector("[data-add-condition]");
    var total = box.querySelector('input[name$="-TOTAL_FORMS"]');
    var max = box.querySelector('input[name$="-MAX_NUM_FORMS"]');
    if (!rows || !template || !button || !total) return;
    var limit = max ? parseInt(max.value, 10) : 1000;

    function refresh() {
      button.disabled = parseInt(total.value, 10) >= limit;
    }

    button.addEventListener("click", function () {
      var index = parseInt(total.value, 10);
      if (index >= limit) return;
      var holder = document.createElement("template");
      holder.innerHTML = template.innerHTML.replace(/__prefix__/g, String(index));
      var row = holder.content.firstElementChild;
      rows.appendChild(row);
      total.value = String(index + 1);
      refresh();
      var first = row.querySelector("input:not([type=hidden]), select");
      if (first) first.focus();
    });
    button.hidden = false;
    box.querySelectorAll("[data-no-js-hint]").forEach(function (hint) { hint.hidden = true; });
    refresh();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
