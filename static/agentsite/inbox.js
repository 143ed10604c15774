/* The inbox's small helpers: one copy of each pushed row, and the bulk selection. */
(function () {
  "use strict";
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    // A pushed row may already be on the page (the resync after a connect read it first).
    var detail = event.detail;
    if (!detail.target || detail.target.id !== "pending-rows" || !detail.fragment) return;
    detail.fragment.querySelectorAll("li[id]").forEach(function (row) {
      if (document.getElementById(row.id)) row.remove();
    });
  });

  function boxes() {
    return Array.prototype.slice.call(
      document.querySelectorAll('input[type="checkbox"][name="ids"][form="bulk-form"]'));
  }

  function updateSelection() {
    var all = boxes();
    var checked = all.filter(function (box) { return box.checked; }).length;
    document.querySelectorAll("[data-selected-count]").forEach(function (el) {
      el.textContent = checked ? checked + " selected" : "";
    });
    document.querySelectorAll("[data-bulk-action]").forEach(function (button) {
      button.disabled = checked === 0;
    });
    var toggle = document.querySelector("[data-select-all]");
    if (toggle) {
      toggle.checked = all.length > 0 && checked === all.length;
      toggle.indeterminate = checked > 0 && checked < all.length;
      toggle.disabled = all.length === 0;
    }
  }

  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches("[data-select-all]")) {
      var on = event.target.checked;
      boxes().forEach(function (box) { box.checked = on; });
    }
    updateSelection();
  });
  document.addEventListener("htmx:afterSettle", updateSelection);
  document.addEventListener("htmx:oobAfterSwap", updateSelection);
  document.addEventListener("DOMContentLoaded", updateSelection);
})();
