/* Browse: cursor-paged through any depth with a selector; bulk delete/move/copy/retry on the selection
   or on everything matching the selector, with progress. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, tracked, queuePath, page, latest } = window.SB;
  const P = page();
  const name = P.name; const base = queuePath(name); const dlq = P.dlq === "1";
  const tbody = document.querySelector("#messages tbody");
  const selectorInput = document.getElementById("selector");
  const errorBox = document.getElementById("selector-error");
  const selected = new Set();
  let cursors = [null]; let nextCursor = null; let rows = [];
  for (const b of document.querySelectorAll(".dlq-only")) b.hidden = !dlq;

  function size(m) {
    if (m.body_base64) return Math.floor((m.body_base64.length * 3) / 4) - (m.body_base64.match(/=*$/)[0].length);
    return new TextEncoder().encode(m.body || "").length;
  }

  function countSelected() { document.getElementById("selection-count").textContent = `${selected.size} selected`; }

  function render() {
    fill(tbody, rows.map((m) => el("tr", {},
      el("td", {}, el("input", { type: "checkbox", "aria-label": `Select ${m.message_id}`, checked: selected.has(m.message_id),
        onchange: (e) => { if (e.target.checked) selected.add(m.message_id); else selected.delete(m.message_id); countSelected(); } })),
      el("td", { class: "id" }, el("a", { href: `/console/queues/${encodeURIComponent(name)}/messages/${encodeURIComponent(m.message_id)}/` }, m.message_id)),
      el("td", {}, fmt.time(m.timestamp)),
      el("td", { class: "num" }, m.priority),
      el("td", {}, m.persistent ? "yes" : "no"),
      el("td", {}, m.redelivered ? `yes (${m.delivery_count - 1})` : "no"),
      el("td", {}, m.group_id ? `${m.group_id} / ${m.group_seq}` : "–"),
      el("td", {}, m.type || "–"),
      el("td", { class: "num" }, fmt.bytes(size(m))),
      el("td", {}, m.state === "inflight" ? `in flight` : m.state))), 10, "No messages match.");
    document.getElementById("select-all").checked = rows.length > 0 && rows.every((m) => selected.has(m.message_id));
  }

  function showPage() {
    if (errorBox.hidden) selectorInput.removeAttribute("aria-invalid");
    render();
    document.getElementById("browse-status").textContent = `page ${cursors.length}: ${rows.length} messages${nextCursor ? "" : " (end)"}`;
    document.getElementById("next").disabled = !nextCursor;
    document.getElementById("first").disabled = cursors.length === 1;
  }

  // (a selector given while the page's first load is under way: only the load started last renders)
  const load = latest(() => {
    const q = new URLSearchParams({ limit: 50 });
    const selector = selectorInput.value.trim();
    if (selector) q.set("selector", selector);
    const cursor = cursors[cursors.length - 1];
    if (cursor) q.set("cursor", cursor);
    errorBox.hidden = true;
    return api("GET", `${base}/messages?${q}`);
  }, (data) => {
    rows = data.messages; nextCursor = data.next_cursor;
    showPage();
  }, (e) => {
    rows = []; nextCursor = null;
    if (e.problem && e.problem.code === "invalid_selector") {
      errorBox.textContent = `Invalid selector: ${e.message}`;
      errorBox.hidden = false;
      selectorInput.setAttribute("aria-invalid", "true");
      selectorInput.focus();
      if (typeof e.problem.position === "number") selectorInput.setSelectionRange(e.problem.position, e.problem.position + 1);
      showPage();
      return;
    }
    // not read: say so, rather than "No messages match" and "(end)" as if the queue were empty
    toast(e.message, true);
    fill(tbody, [], 10, `Could not read the messages: ${e.message}`);
    document.getElementById("browse-status").textContent = `page ${cursors.length}: not read`;
    document.getElementById("next").disabled = true;
    document.getElementById("first").disabled = cursors.length === 1;
  });

  document.getElementById("selector-form").addEventListener("submit", (e) => {
    e.preventDefault(); cursors = [null]; selected.clear(); countSelected();
    const u = new URL(location.href); u.searchParams.set("selector", selectorInput.value.trim()); history.replaceState(null, "", u);
    load();
  });
  document.getElementById("next").addEventListener("click", () => { cursors.push(nextCursor); load(); });
  document.getElementById("first").addEventListener("click", () => { cursors = [null]; load(); });
  document.getElementById("select-all").addEventListener("change", (e) => {
    for (const m of rows) { if (e.target.checked) selected.add(m.message_id); else selected.delete(m.message_id); }
    countSelected(); render();
  });

  const VERB = { move: "Move", copy: "Copy", delete: "Delete", retry: "Retry" };

  async function perMessage(action, id, target) {
    const path = `${base}/messages/${encodeURIComponent(id)}`;
    if (action === "delete") return api("DELETE", path);
    if (action === "retry") return api("POST", `${path}/retry`);
    return api("POST", `${path}/${action}`, { target });
  }

  async function bulk(action, scope) {
    const target = (document.getElementById("bulk-target") || {}).value?.trim() || "";
    if ((action === "move" || action === "copy") && !target) { toast("Name the target queue first.", true); return; }
    const selector = selectorInput.value.trim();
    const what = scope === "selected" ? `${selected.size} selected messages`
      : selector ? `every message matching “${selector}”` : "every message of the queue";
    if (scope === "selected" && !selected.size) { toast("Select messages first.", true); return; }
    const to = action === "move" || action === "copy" ? ` to ${target}` : action === "retry" ? " to their original destinations" : "";
    if (!(await window.SB.confirm(`${VERB[action]} ${what}${to}?`, VERB[action]))) return;
    let done = 0; let failed = 0; let why = "";  // (the first failure's reason: the others are likely the same)
    try {
      if (scope === "selected") {
        const ids = [...selected];
        await tracked(`${VERB[action]} ${ids.length} messages`, async (bar) => {
          for (const id of ids) {
            try { await perMessage(action, id, target); done++; selected.delete(id); } catch (e) { failed++; why = why || e.message; }
            bar.update(done + failed, ids.length);
          }
        });
      } else {
        const start = (await api("GET", base)).queue_size;
        // One server-side operation each (remove-matching for delete); progress from the queue's size.
        const call = action === "delete" ? "remove" : action;
        const result = await tracked(`${VERB[action]} matching messages`, () => api("POST", `${base}/${call}-matching`, { selector: selector || null, ...(target && (action === "move" || action === "copy") ? { target } : {}) }),
          action === "copy" ? null : async () => { const s = await api("GET", base); return { done: Math.max(0, start - s.queue_size), total: start }; });
        done = result.count;
      }
      toast(`${VERB[action]}: ${fmt.num(done)} messages${failed ? `, ${failed} failed: ${why}` : ""}`, failed > 0);
    } catch (e) { toast(e.message, true); }
    countSelected();
    load();
  }

  for (const button of document.querySelectorAll("[data-bulk]")) {
    button.addEventListener("click", () => bulk(button.dataset.bulk, button.dataset.scope));
  }
  load();
})();
