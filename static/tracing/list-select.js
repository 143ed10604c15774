// The trace list's selection: "select all" ticks every row of the page, and "Export
// selected" is enabled only while a row is ticked (without this script it always submits,
// and the server answers an empty selection with a message).
(function () {
  "use strict";
  function boxes() {
    return Array.from(document.querySelectorAll('input[name="trace"][form="trace-export"]'));
  }
  function refresh() {
    const button = document.querySelector("[data-export-selected]");
    const all = document.querySelector("[data-select-all]");
    const ticked = boxes().filter((box) => box.checked).length;
    if (button) button.disabled = ticked === 0;
    if (all) {
      all.checked = ticked > 0 && ticked === boxes().length;
      all.indeterminate = ticked > 0 && ticked < boxes().length;
    }
  }
  document.addEventListener("change", (event) => {
    const target = event.target;
    if (!(target instanceof HTMLInputElement)) return;
    if (target.matches("[data-select-all]")) {
      boxes().forEach((box) => { box.checked = target.checked; });
    }
    if (target.matches("[data-select-all], input[name='trace']")) refresh();
  });
  document.addEventListener("DOMContentLoaded", refresh);
})();
