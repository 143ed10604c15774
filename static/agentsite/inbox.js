/* The inbox's small helpers: one copy of each pushed row, the bulk selection and its
   confirmation dialog, the keyboard flow and the announcement of new requests. */
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

  /* The filter selects offer the values the pending requests have. The server sends them
     again with each new request and each re-read (#filter-fields, out of band); they are
     merged into the page's selects rather than swapped in, so that a value chosen but not
     applied yet, an open list and focus stay as they are. */
  function sameOptions(mine, theirs) {
    if (mine.options.length !== theirs.options.length) return false;
    for (var i = 0; i < mine.options.length; i++) {
      if (mine.options[i].value !== theirs.options[i].value ||
          mine.options[i].text !== theirs.options[i].text) return false;
    }
    return true;
  }

  function mergeSelect(mine, theirs) {
    if (sameOptions(mine, theirs)) return;
    var chosen = mine.options[mine.selectedIndex];
    var options = Array.prototype.map.call(theirs.options, function (option) {
      return new Option(option.text, option.value);
    });
    var kept = chosen && options.some(function (option) { return option.value === chosen.value; });
    if (chosen && !kept) options.push(new Option(chosen.text, chosen.value));
    mine.replaceChildren.apply(mine, options);
    if (chosen) mine.value = chosen.value;
  }

  function mergeFilters(fields, fresh) {
    fresh.querySelectorAll(".filter").forEach(function (filter) {
      var theirs = filter.querySelector("select");
      var mine = theirs && document.getElementById(theirs.id);
      if (mine) {
        mergeSelect(mine, theirs);
        return;
      }
      // A filter the page did not offer yet (its first MCP server's call): in its place,
      // before the next one the page has.
      var before = null;
      for (var next = filter.nextElementSibling; next && !before; next = next.nextElementSibling) {
        var select = next.querySelector("select");
        var ours = select && document.getElementById(select.id);
        before = ours ? ours.closest(".filter") : null;
      }
      fields.insertBefore(filter, before);
    });
  }

  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var detail = event.detail;
    if (!detail.target || detail.target.id !== "filter-fields" || !detail.fragment) return;
    var fresh = detail.fragment.querySelector("#filter-fields");
    if (!fresh) return;
    detail.shouldSwap = false;
    mergeFilters(detail.target, fresh);
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
    // "Select all" ticks the rows on this page, and says how many: never a filtered-out row.
    document.querySelectorAll("[data-select-all-label]").forEach(function (el) {
      el.textContent = all.length ? "Select all " + all.length + " shown" : "Select all shown";
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

  /* A bulk decision asks first: the server's confirmation (bulk_confirm.html) fills the
     dialog, which opens as a modal. Cancel or Escape closes it and posts nothing; a
     confirmed decision answers into the flash, and the dialog closes. */
  function confirmDialog() {
    return document.getElementById("bulk-confirm");
  }

  function confirmOpen() {
    var dialog = confirmDialog();
    return Boolean(dialog && dialog.open);
  }

  document.addEventListener("htmx:afterSwap", function (event) {
    var dialog = confirmDialog();
    if (!dialog) return;
    if (event.detail.target === dialog) {
      if (!dialog.open) dialog.showModal();
      var first = dialog.querySelector("[data-bulk-message]") ||
        dialog.querySelector("#bulk-confirm-title");
      if (first) first.focus();
    } else if (dialog.open && event.detail.target && event.detail.target.id === "flash" &&
               event.detail.requestConfig && dialog.contains(event.detail.requestConfig.elt)) {
      dialog.close();
    }
  });

  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest("[data-bulk-cancel]")) {
      confirmDialog().close();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var dialog = confirmDialog();
    if (!dialog) return;
    // A closed confirmation is gone: its token is never posted later by mistake.
    dialog.addEventListener("close", function () { dialog.replaceChildren(); });
  });

  /* A row's Reject opens its reject box (a message to the agent and an internal note, both
     optional) instead of rejecting at once; the box's own button rejects. Without this script
     Reject rejects at once. The box is a disclosure: its Reject says whether it is open. */
  function enhanceRows() {
    document.querySelectorAll("#pending-rows [data-reject-open]:not([aria-expanded])")
      .forEach(function (toggle) {
        var box = toggle.form && toggle.form.querySelector("[data-reject-box]");
        if (!box) return;
        toggle.setAttribute("aria-controls", box.id);
        toggle.setAttribute("aria-expanded", box.hidden ? "false" : "true");
      });
  }

  function setReject(row, open, focusToggle) {
    var toggle = row && row.querySelector("[data-reject-open]");
    var box = row && row.querySelector("[data-reject-box]");
    if (!toggle || !box) return;
    box.hidden = !open;  // closing keeps what was typed
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
    if (open) box.querySelector("[data-reject-message]").focus();
    else if (focusToggle) toggle.focus();
  }

  document.addEventListener("click", function (event) {
    if (!event.target.closest) return;
    var toggle = event.target.closest("#pending-rows [data-reject-open]");
    var cancel = event.target.closest("#pending-rows [data-reject-cancel]");
    if (toggle) {
      event.preventDefault();  // no submission: the box asks first
      var row = toggle.closest("li.row-pending");
      setReject(row, row.querySelector("[data-reject-box]").hidden, false);
    } else if (cancel) {
      setReject(cancel.closest("li.row-pending"), false, true);
    }
  });

  // A box whose text the server refused is open with the error under it (and aria-invalid):
  // focus goes back to it, since the answer replaced the field that had it.
  document.addEventListener("htmx:afterSettle", function (event) {
    var config = event.detail && event.detail.requestConfig;
    var active = document.activeElement;
    if (!config || config.verb !== "post" || (active && active !== document.body)) return;
    var invalid = document.querySelector(
      '#pending-rows [aria-invalid="true"], .decision [aria-invalid="true"]');
    if (invalid) invalid.focus();
  });

  /* The keyboard flow: j / k move between pending requests, a approves the current one, r
     opens its reject box with the message focused; after a decision, focus moves to the next
     request. Keys typed into a field, or with a modifier, are left alone. */
  function pendingRows() {
    return Array.prototype.slice.call(
      document.querySelectorAll("#pending-rows > li.row-pending"));
  }

  function currentRow() {
    var active = document.activeElement;
    return active && active.closest ? active.closest("#pending-rows > li.row-pending") : null;
  }

  function focusRow(row) {
    if (!row) return false;
    var target = row.querySelector("[data-row-focus]") || row;
    target.focus();
    target.scrollIntoView({block: "nearest"});
    return true;
  }

  function move(step) {
    var rows = pendingRows();
    if (!rows.length) return;
    var index = rows.indexOf(currentRow());
    if (index === -1) {
      focusRow(step > 0 ? rows[0] : rows[rows.length - 1]);
    } else {
      focusRow(rows[Math.min(Math.max(index + step, 0), rows.length - 1)]);
    }
  }

  function typing(target) {
    return target && target.closest &&
      target.closest("input, textarea, select, [contenteditable], [contenteditable=true]");
  }

  // The row whose decision is on its way, and the one after it, where focus goes when the
  // decided line replaces it.
  var deciding = null;

  function decide(row, button) {
    deciding = {id: row.id, next: nextOf(row)};
    button.click();
  }

  function afterDecision() {
    if (!deciding) return;
    var row = document.getElementById(deciding.id);
    if (row && row.classList.contains("row-pending")) return;  // not landed yet
    var next = deciding.next;
    deciding = null;
    if (next && document.body.contains(next) && next.classList.contains("row-pending")) {
      focusRow(next);
    } else if (!focusRow(pendingRows()[0])) {
      document.getElementById("pending-rows").focus();
    }
  }

  function approve(row) {
    var button = row.querySelector('button[name="action"][value="approve"]');
    if (!button) return;
    if (button.disabled) {
      announce("You started this conversation: another reviewer must approve it.");
      return;
    }
    decide(row, button);
  }

  function openReject(row) {
    setReject(row, true, false);
  }

  function nextOf(row) {
    var rows = pendingRows();
    var index = rows.indexOf(row);
    return rows[index + 1] || rows[index - 1] || null;
  }

  document.addEventListener("keydown", function (event) {
    if (!document.getElementById("pending-rows") || confirmOpen()) return;
    var box = event.target && event.target.closest && event.target.closest("[data-reject-box]");
    if (box) {
      var row = box.closest("li.row-pending");
      if (event.key === "Escape") {
        event.preventDefault();
        setReject(row, false, true);
      } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey) &&
                 event.target.matches("textarea")) {
        event.preventDefault();
        decide(row, box.querySelector("[data-reject-send]"));
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    var current = currentRow();
    if (event.key === "j") move(1);
    else if (event.key === "k") move(-1);
    else if (event.key === "a" && current) approve(current);
    else if (event.key === "r" && current) openReject(current);
    else return;
    event.preventDefault();
  });

  /* New requests are announced in the page's aria-live region: the rows that were not on the
     page before, whether pushed or re-read on a reconnect. */
  var seen = {};

  function announce(text) {
    var region = document.querySelector("[data-announcer]");
    if (!region) return;
    region.textContent = "";
    // A change the screen reader notices even when the same words come twice.
    setTimeout(function () { region.textContent = text; }, 50);
  }

  function noteRows(say) {
    var fresh = pendingRows().filter(function (row) { return !seen[row.id]; });
    fresh.forEach(function (row) { seen[row.id] = true; });
    if (!say || !fresh.length) return;
    var summaries = fresh.map(function (row) {
      var body = row.querySelector("[data-summary]");
      return body ? body.getAttribute("data-summary") : row.id;
    });
    announce((fresh.length === 1 ? "New request: " : fresh.length + " new requests: ") +
      summaries.join("; ") + ".");
  }

  document.addEventListener("DOMContentLoaded", function () {
    var list = document.getElementById("pending-rows");
    if (!list) return;
    noteRows(false);
    enhanceRows();
    new MutationObserver(function () {
      enhanceRows();
      noteRows(true);
      afterDecision();
    }).observe(list, {childList: true});
  });
})();
