/* The trace page's small helpers, on top of htmx and live.js:
 * - the selected span's row is highlighted (the panel says which span it shows);
 * - a refreshed tree keeps the subtrees the reader collapsed;
 * - "Expand all" / "Collapse all";
 * - the waterfall's rows, bars and time marks are placed from their data attributes
 *   (`data-depth`, `data-left`, `data-width`, `data-right`, in percent): the Content Security
 *   Policy allows no inline style, but a script may still set element.style (and htmx's
 *   copy of the page for Back keeps the data attributes, not those styles).
 * Collapsing itself is plain <details>: it works without this file. */
(function () {
  "use strict";
  var collapsed = null;
  var PLACED = ".waterfall [data-depth], .waterfall [data-left], .waterfall [data-width], " +
    ".waterfall [data-right]";

  function placeOne(el) {
    var data = el.dataset;
    if (data.depth !== undefined) el.style.setProperty("--depth", data.depth);
    if (data.left !== undefined) el.style.left = data.left + "%";
    if (data.width !== undefined) el.style.width = data.width + "%";
    if (data.right !== undefined) el.style.right = data.right + "%";
  }

  function place(root) {
    if (root.matches && root.matches(PLACED)) placeOne(root);
    if (root.querySelectorAll) root.querySelectorAll(PLACED).forEach(placeOne);
  }

  // Now (the deferred script runs once the page is parsed), and for every swapped-in fragment
  // as soon as it is in (htmx:load comes only once it settled: the bars would show unplaced
  // until then).
  place(document);
  document.addEventListener("htmx:afterSwap", function (event) { place(event.detail.target); });
  document.addEventListener("htmx:oobAfterSwap", function (event) { place(event.detail.target); });
  document.addEventListener("htmx:load", function (event) {
    if (event.target !== document.body) place(event.target); // the body: placed just above
  });
  // htmx keeps a copy of the page for Back (a span's URL is pushed), as HTML text: what place()
  // set is in it as style attributes, which the policy refuses when Back puts the copy back.
  // The copy keeps the data attributes only (attribute values hold no quote, so the pattern
  // stays inside one attribute), and the restored rows are placed again as they come in.
  var PLACED_STYLE = /(<[^<>]*\sdata-(?:depth|left|width|right)="[^"]*"[^<>]*?)\sstyle="[^"]*"/g;
  document.addEventListener("htmx:historyItemCreated", function (event) {
    var item = event.detail.item;
    item.content = item.content.replace(PLACED_STYLE, "$1");
  });
  document.addEventListener("htmx:historyRestore", function () { place(document); });

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
