/* The trace page's small helpers, on top of htmx and live.js:
 * - the selected span's row is highlighted (the panel says which span it shows);
 * - a refreshed tree keeps the subtrees the reader collapsed, and (a big trace) the subtrees
 *   and pages of children the reader loaded: the refresh sends them back to the server;
 * - a big trace's folded subtree loads its spans when it is opened (click, Enter or Space on
 *   its row's caret), its "Show N more" rows load the next page of children (plain htmx);
 * - "Expand all" / "Collapse all" (of what is loaded: a big trace's folded subtrees stay
 *   folded rather than fire a request each);
 * - the live status says "Live" while the run works, "Waiting for approval" while it waits,
 *   and "Finished" once it has ended (the tree's data-trace-state, re-read with it);
 * - on a narrow screen, where the span panel is under the tree, a span's details scroll into
 *   view when they load, and "Back to the span" returns to its row.
 * Collapsing itself is plain <details> (each node's caret is one, its children hidden by a
 * stylesheet rule while it is closed), and the waterfall is placed by its markup (SVG
 * attributes and classes, no inline style): both work without this file. */
(function () {
  "use strict";
  var collapsed = null;
  var loaded = new Set(); // folded subtrees the reader opened (their spans' ids)
  var MAX_STATE = 150; // span ids a refresh sends back at most
  // A node's children: the rows and nodes after its own row.
  var CHILDREN = ":scope > .node, :scope > div.row:not(:first-child):not(.gap):not(.subtree-load)";

  // The caret that folds `node` (a <details>, open while the node's children show).
  function foldOf(node) {
    return node.querySelector(":scope > .row:first-child > .name-cell > details.fold");
  }

  function panelSpan() {
    var detail = document.querySelector("#span-panel [data-span-id]");
    return detail ? detail.getAttribute("data-span-id") : null;
  }

  function rowOf(id) {
    var found = null;
    document.querySelectorAll("#trace-tree a.span-link").forEach(function (link) {
      if (!found && link.getAttribute("data-span") === id) found = link.closest(".row");
    });
    return found;
  }

  function select(id) {
    document.querySelectorAll("#trace-tree .row.is-selected").forEach(function (row) {
      row.classList.remove("is-selected");
    });
    if (!id) return;
    var row = rowOf(id);
    if (row) row.classList.add("is-selected");
  }

  function applyTraceState() {
    var waterfall = document.querySelector("#trace-tree [data-trace-state]");
    var badge = document.getElementById("trace-live-state");
    if (!waterfall || !badge) return;
    var state = waterfall.getAttribute("data-trace-state");
    badge.setAttribute("data-trace-state", state);
    if (state === "done") {
      // live.js no longer touches it: the run has ended, the page is not "Live".
      badge.removeAttribute("data-live-status");
      badge.dataset.state = "done";
      badge.textContent = "Finished";
      badge.title = "The run has ended: this page no longer changes";
      return;
    }
    if (!badge.hasAttribute("data-live-status")) return;
    var label = state === "waiting" ? "Waiting for approval" : "Live";
    badge.dataset.liveLabel = label;
    if (badge.dataset.state === "live") badge.textContent = label;
  }

  function childPage() {
    var state = document.querySelector("#trace-tree [data-child-page]");
    return parseInt((state && state.getAttribute("data-child-page")) || "100", 10);
  }

  function loadSubtree(node) {
    var loader = node.querySelector(":scope > .subtree-load");
    var url = node.getAttribute("data-load");
    if (!loader || !url || node.dataset.loading) return;
    node.dataset.loading = "1";
    loader.classList.add("htmx-request");
    loaded.add(node.id.replace(/^node-/, ""));
    htmx.ajax("GET", url, { source: loader, target: loader, swap: "outerHTML" }).then(
      function () {
        node.classList.remove("is-lazy");
        delete node.dataset.loading;
        var count = node.querySelector(":scope > .row:first-child .flag-more");
        if (count) count.remove();
        select(panelSpan());
      },
      function () {
        delete node.dataset.loading;
        loader.classList.remove("htmx-request");
      }
    );
  }

  // A folded subtree of a big trace opens: load it (toggle does not bubble: capture it).
  document.addEventListener(
    "toggle",
    function (event) {
      var fold = event.target;
      if (!fold || !fold.matches || !fold.matches("#trace-tree details.fold") || !fold.open) return;
      var node = fold.closest(".node");
      if (node && node.classList.contains("is-lazy")) loadSubtree(node);
    },
    true
  );

  // A refresh of the tree says what the reader had loaded, so that it comes back loaded.
  document.addEventListener("htmx:configRequest", function (event) {
    var target = event.detail.target;
    if (!target || target.id !== "trace-tree") return;
    var open = Array.from(loaded).slice(0, MAX_STATE);
    var page = childPage();
    var more = [];
    target.querySelectorAll(".node").forEach(function (node) {
      var count = node.querySelectorAll(CHILDREN).length;
      if (count > page && more.length < MAX_STATE) more.push(node.id.replace(/^node-/, "") + ":" + count);
    });
    var rows = target.querySelector(".rows");
    if (rows) {
      var roots = rows.querySelectorAll(
        ":scope > .node, :scope > div.row:not(.gap):not(.subtree-load)"
      ).length;
      if (roots > page) more.push("*roots:" + roots);
    }
    if (open.length) event.detail.parameters["open"] = open;
    if (more.length) event.detail.parameters["more"] = more;
  });

  // "Show N more" from the keyboard: focus goes on to the first row it brought.
  var focusAfter = null;

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    if (target && target.classList.contains("gap") && target.contains(document.activeElement)) {
      focusAfter = { parent: target.parentNode, before: target.previousElementSibling };
    }
    if (!target || target.id !== "trace-tree") return;
    collapsed = [];
    target.querySelectorAll(".node:not(.is-lazy)").forEach(function (node) {
      var fold = foldOf(node);
      if (fold && !fold.open) collapsed.push(node.id);
    });
  });

  document.addEventListener("htmx:afterSwap", function (event) {
    var target = event.detail.target;
    if (focusAfter) {
      var first = focusAfter.before
        ? focusAfter.before.nextElementSibling
        : focusAfter.parent.firstElementChild;
      var link = first && first.querySelector("a.span-link, a.tree-more");
      focusAfter = null;
      if (link) link.focus();
    }
    if (target && target.id === "trace-tree") {
      if (collapsed) {
        collapsed.forEach(function (id) {
          var node = document.getElementById(id);
          var fold = node && foldOf(node);
          if (fold) fold.open = false;
        });
        collapsed = null;
      }
      applyTraceState();
    }
    select(panelSpan());
    if (target && target.id === "span-panel") showPanel(target);
  });

  // Where the panel is under the tree (a phone), bring a span's details to the reader.
  function showPanel(panel) {
    var box = panel.getBoundingClientRect();
    if (box.top < 0 || box.top > window.innerHeight * 0.75) {
      panel.scrollIntoView({ block: "start" });
    }
  }

  document.addEventListener("click", function (event) {
    var toggle = event.target.closest("[data-tree-toggle]");
    if (toggle) {
      var open = toggle.getAttribute("data-tree-toggle") === "open";
      document.querySelectorAll("#trace-tree .node").forEach(function (node) {
        var fold = foldOf(node);
        if (!fold || (open && node.classList.contains("is-lazy"))) return;
        fold.open = open;
      });
      return;
    }
    var back = event.target.closest("[data-back-to-span]");
    if (back) {
      var row = rowOf(panelSpan());
      if (row) {
        event.preventDefault();
        row.scrollIntoView({ block: "center" });
        var link = row.querySelector("a.span-link");
        if (link) link.focus({ preventScroll: true });
      }
      return;
    }
    var spanLink = event.target.closest("#trace-tree a.span-link");
    if (spanLink) select(spanLink.getAttribute("data-span"));
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-tree-buttons]").forEach(function (buttons) {
      buttons.hidden = false;
    });
    applyTraceState();
  });
})();
