/* The rule form (policy_edit.html). "Add a condition": a copy of the formset's empty row,
   numbered as Django's formsets number them; without JavaScript the page offers a few blank
   rows instead, and saving offers more. And the boxes only an approving rule reads (whether
   the facts must show no warnings) are shown only while the action is "approve"; without
   JavaScript they are always shown, and their hint says so. */
(function () {
  "use strict";
  function setUpConditions() {
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

  function setUpApprovingOnly() {
    var action = document.querySelector('.policy-form select[name="action"]');
    var boxes = document.querySelectorAll("[data-approving-only]");
    if (!action || !boxes.length) return;
    function refresh() {
      boxes.forEach(function (box) { box.hidden = action.value !== "approve"; });
    }
    action.addEventListener("change", refresh);
    refresh();
  }

  function setUp() {
    setUpConditions();
    setUpApprovingOnly();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", setUp);
  else setUp();
})();
