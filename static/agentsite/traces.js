/* The trace page's small helpers, on top of htmx and live.js:
 * - the selected span's row is highlighted (the panel says which span it shows);
 * - a refreshed tree keeps the subtrees the reader collapsed;
 * - "Expand all" / "Collapse all".
 * Collapsing itself is plain <details>, and the waterfall is placed by its markup (SVG
 * attributes and classes, no inline style): both work without this file. */
(function () {
  "use strict";
  var collapsed = null;

  function panelSpan() {
    var detail = document.querySelector("#span-panel [data-span-id]");
    return detail ? detail.getAttribute("data-span-id") : null;
  }

  function select(id) {
    document.querySelectorAll("#trace-tree .row.is-selected").forEach(function (row) {
      row.classList.remove("is-selected");
    });
    if (!id) return;
    document.querySelectorAll("#trace-tree a.span-link").forEach(function (link) {
      if (link.getAttribute("data-span") === id) link.closest(".row").classList.add("is-selected");
    });
  }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (!target || target.id !== "trace-tree") return;
    collapsed = [];
    target.querySelectorAll("details.node:not([open])").forEach(function (node) {
      collapsed.push(node.id);
    });
  });

  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail.target;
    if (target && target.id === "trace-tree" && collapsed) {
      collapsed.forEach(function (id) {
        var node = document.getElementById(id);
        if (node) node.open = false;
      });
      collapsed = null;
    }
    select(panelSpan());
  });

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest("[data-tree-toggle]");
    if (toggle) {
      var open = toggle.getAttribute("data-tree-toggle") === "open";
      document.querySelectorAll("#trace-tree details.node").forEach(function (node) {
        node.open = open;
      });
      return;
    }
    var link = event.target.closest("#trace-tree a.span-link");
    if (link) select(link.getAttribute("data-span"));
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-tree-buttons]").forEach(function (buttons) {
      buttons.hidden = false;
    });
  });
})();
