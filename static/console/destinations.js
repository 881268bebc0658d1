/* Destinations: server-side filter, sort and paging (GET /api/v1/destinations); the rows on screen are
   kept live by the feed (`watch`), actions per row only where the user has admin permission. */
"use strict";
(function () {
  const { api, el, fill, fmt, live, act, toast, queuePath } = window.SB;
  const params = new URLSearchParams(location.search);
  const state = { search: params.get("search") || "", kind: params.get("kind") || "", ordering: params.get("ordering") || "name",
    limit: Number(params.get("limit") || 50), offset: Number(params.get("offset") || 0) };
  const tbody = document.querySelector("#destinations tbody");
  const search = document.getElementById("search");
  const kind = document.getElementById("kind");
  const size = document.getElementById("page-size");
  search.value = state.search; kind.value = state.kind; size.value = String(state.limit);
  let feed = null; let shown = []; let perms = {};

  // "messages" (Pending): pending + in flight, a topic's across its subscriptions (docs/console.md)
  const NUMS = ["messages", "in_flight", "consumer_count", "enqueued", "dequeued", "expired", "deadlettered"];

  // A cell's content: the number, and under a topic's Pending its largest subscription.
  function content(k, row) {
    if (k.endsWith("_rate")) return [fmt.rate(row[k])];
    const largest = k === "messages" && row.largest_subscription;
    return [fmt.num(row[k]), largest && largest.messages ? el("small", { class: "largest", title: largest.key },
      `largest: ${largest.label} (${fmt.num(largest.messages)})`) : null];
  }

  function cells(row) {
    return [...NUMS, "enqueue_rate", "dequeue_rate"].map((k) => el("td", { class: "num", dataset: { col: k } }, ...content(k, row)));
  }

  function operations(row) {
    const may = perms[row.destination] || {};
    const ops = el("td", { class: "ops" });
    if (row.kind !== "queue") return ops;
    const name = row.name;
    ops.append(el("a", { href: `/console/queues/${encodeURIComponent(name)}/browse/`, class: "button secondary small" }, "Browse"), " ");
    if (may.write) ops.append(el("a", { href: `/console/send/?destination=${encodeURIComponent(row.destination)}`, class: "button secondary small" }, "Send"), " ");
    if (may.admin) {
      const pause = row.paused ? "resume" : "pause";
      ops.append(
        el("button", { type: "button", class: "small", onclick: () => run(`${pause[0].toUpperCase()}${pause.slice(1)} ${name}?`, pause, () => api("POST", `${queuePath(name)}/${pause}`)) }, row.paused ? "Resume" : "Pause"), " ",
        el("button", { type: "button", class: "small danger", onclick: () => run(`Purge every message of ${name}? This cannot be undone.`, "Purge", () => api("POST", `${queuePath(name)}/purge`)) }, "Purge"), " ",
        el("button", { type: "button", class: "small danger", onclick: () => run(`Delete ${name} and all its messages? This cannot be undone.`, "Delete", () => api("DELETE", queuePath(name))) }, "Delete"));
    }
    return ops;
  }

  async function run(text, label, call) {
    const done = await act(text, label, call);
    if (done) { toast(`${label}: done`); load(); }
  }

  function render(rows) {
    fill(tbody, rows.map((row) => el("tr", { dataset: { uri: row.destination } },
      el("th", { scope: "row" }, row.kind === "queue" ? el("a", { href: `/console/queues/${encodeURIComponent(row.name)}/` }, row.name)
        : el("a", { href: `/console/topics/${encodeURIComponent(row.name)}/` }, `${row.name} (topic)`),
        row.paused ? el("span", { class: "badge warn" }, " paused") : null),
      ...cells(row), operations(row))), 11, "No destinations match.");
  }

  // A reader with partial rights is told the list is not everything: how many exist unseen, no names.
  function hiddenNote(n) {
    let note = document.getElementById("dest-hidden");
    if (!note) { note = el("p", { id: "dest-hidden", class: "note", role: "status" }); document.getElementById("destinations").closest(".scroll, table").before(note); }
    note.hidden = !n;
    note.textContent = n ? `${fmt.num(n)} more ${n === 1 ? "destination exists" : "destinations exist"} that you may not see: ask an administrator for read access.` : "";
  }

  async function load() {
    const q = new URLSearchParams({ ordering: state.ordering, limit: state.limit, offset: state.offset });
    if (state.search) q.set("search", state.search);
    if (state.kind) q.set("kind", state.kind);
    history.replaceState(null, "", `?${q}`);
    let data;
    try { data = await api("GET", `destinations?${q}`); } catch (e) { toast(e.message, true); return; }
    shown = data.results;
    if (shown.length) {
      try { perms = (await api("GET", `console/permissions?destination=${encodeURIComponent(shown.map((r) => r.destination).join(","))}`)).destinations; } catch (e) { perms = {}; }
    }
    render(shown);
    const from = data.count ? state.offset + 1 : 0;
    document.getElementById("dest-count").textContent = `${fmt.num(from)}–${fmt.num(state.offset + shown.length)} of ${fmt.num(data.count)}`;
    hiddenNote(data.hidden || 0);
    document.getElementById("prev").disabled = !data.previous;
    document.getElementById("next").disabled = !data.next;
    for (const th of document.querySelectorAll("#destinations th[data-sort]")) {
      const key = th.dataset.sort;
      th.setAttribute("aria-sort", state.ordering === key ? "ascending" : state.ordering === `-${key}` ? "descending" : "none");
    }
    if (feed) feed.send({ watch: shown.map((r) => r.destination) });
  }

  function updateRows(rows) {
    for (const row of rows) {
      const tr = tbody.querySelector(`tr[data-uri="${CSS.escape(row.destination)}"]`);
      if (!tr) continue;
      for (const td of tr.querySelectorAll("td[data-col]")) td.replaceChildren(...content(td.dataset.col, row).filter(Boolean));
    }
  }

  let timer = null;
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { state.search = search.value; state.offset = 0; load(); }, 250); });
  document.getElementById("filter").addEventListener("submit", (e) => { e.preventDefault(); state.search = search.value; state.offset = 0; load(); });
  kind.addEventListener("change", () => { state.kind = kind.value; state.offset = 0; load(); });
  size.addEventListener("change", () => { state.limit = Number(size.value); state.offset = 0; load(); });
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); load(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; load(); });
  for (const th of document.querySelectorAll("#destinations th[data-sort]")) {
    th.querySelector("button").addEventListener("click", () => {
      const key = th.dataset.sort;
      // a second click reverses the order; a new column starts descending (name: ascending)
      if (state.ordering === key) state.ordering = `-${key}`;
      else if (state.ordering === `-${key}`) state.ordering = key;
      else state.ordering = key === "name" ? key : `-${key}`;
      state.offset = 0; load();
    });
  }
  const create = document.getElementById("create");
  api("GET", "console/permissions?destination=%3E").then((p) => {
    if ((p.destinations[">"] || p.destinations["queue://>"] || {}).admin) create.hidden = false;
  }).catch(() => {});
  create.addEventListener("submit", async (e) => {
    e.preventDefault();
    const name = document.getElementById("create-name").value.trim();
    const done = await act(`Create the queue ${name}?`, "Create", () => api("PUT", queuePath(name)));
    if (done) { toast(`Created ${name}`); load(); }
  });

  feed = live("", (msg) => { if (msg.type === "totals" && msg.rows) updateRows(msg.rows); },
    (handle) => handle.send({ watch: shown.map((r) => r.destination) }));
  load();
})();
