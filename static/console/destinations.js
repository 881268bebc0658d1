/* Destinations: server-side filters, sort and paging (GET /api/v1/destinations); the view lives in the URL
   (search, kind, non_empty, has_consumers, dlq, ordering, limit, page) so it can be shared. The rows on
   screen are kept live by the feed (`watch`); a row's actions sit in its Actions menu, only those the user
   may take. */
"use strict";
(function () {
  const { api, el, fill, fmt, live, act, toast, queuePath } = window.SB;
  const FILTERS = { search: "search", kind: "kind", non_empty: "f-messages", has_consumers: "f-consumers", dlq: "f-dlq" };
  const params = new URLSearchParams(location.search);
  const limit = Number(params.get("limit") || 50);
  const state = { ordering: params.get("ordering") || "name", limit,
    // `page` (1-based) in the URL; an older link's `offset` still works
    offset: params.has("page") ? (Math.max(1, Number(params.get("page")) || 1) - 1) * limit : Number(params.get("offset") || 0) };
  for (const [key, id] of Object.entries(FILTERS)) {
    state[key] = params.get(key) || "";
    document.getElementById(id).value = state[key];
  }
  const tbody = document.querySelector("#destinations tbody");
  const size = document.getElementById("page-size");
  const ordering = document.getElementById("ordering");
  size.value = String(state.limit);
  let feed = null; let shown = []; let perms = {}; let count = 0; let loads = 0;

  // "messages" (Pending): pending + in flight, a topic's across its subscriptions (docs/console.md)
  const NUMS = ["messages", "in_flight", "consumer_count", "enqueued", "dequeued", "expired", "deadlettered"];
  // the column headers, repeated in each cell for the phone layout (where the header row is hidden)
  const LABELS = Object.fromEntries([...document.querySelectorAll("#destinations th[data-sort]")].map((th) => [th.dataset.sort, th.textContent.trim()]));

  // A cell's content: the number, and under a topic's Pending its largest subscription.
  function content(k, row) {
    if (k.endsWith("_rate")) return [fmt.rate(row[k])];
    const largest = k === "messages" && row.largest_subscription;
    return [fmt.num(row[k]), largest && largest.messages ? el("small", { class: "largest", title: largest.key },
      `largest: ${largest.label} (${fmt.num(largest.messages)})`) : null];
  }

  function cells(row) {
    return [...NUMS, "enqueue_rate", "dequeue_rate"].map((k) => el("td", { class: "num", dataset: { col: k, label: LABELS[k] } }, ...content(k, row)));
  }

  /* The row's Actions menu: a disclosure (<details>) of links and buttons, never five buttons a row. The
     destructive ones are text in the danger colour, each asks for confirmation. */
  function operations(row) {
    const may = perms[row.destination] || {};
    const ops = el("td", { class: "ops" });
    const name = row.name;
    const items = row.kind === "queue" ? [el("a", { href: `/console/queues/${encodeURIComponent(name)}/browse/` }, "Browse")] : [];
    if (may.write) items.push(el("a", { href: `/console/send/?destination=${encodeURIComponent(row.destination)}` }, "Send"));
    if (row.kind === "topic") {  // no browse, pause or purge for a topic (as ActiveMQ's topics.jsp): send, delete
      if (may.admin) items.push(deleteItem(row, `Delete the topic ${name} with its ${fmt.num(row.consumer_count)} subscriptions and the ${fmt.num(row.messages)} messages held for them? This cannot be undone.`));
      if (!items.length) return ops;
    } else if (may.admin) {
      const pause = row.paused ? "resume" : "pause";
      items.push(
        el("button", { type: "button", dataset: { op: pause }, onclick: () => run(`${pause[0].toUpperCase()}${pause.slice(1)} ${name}?`, pause, () => api("POST", `${queuePath(name)}/${pause}`)) }, row.paused ? "Resume" : "Pause"),
        el("button", { type: "button", class: "danger-text", dataset: { op: "purge" }, onclick: () => run(`Purge every message of ${name}? This cannot be undone.`, "Purge", () => api("POST", `${queuePath(name)}/purge`)) }, "Purge…"),
        deleteItem(row, `Delete ${name} and all its messages? This cannot be undone.`));
    }
    ops.append(el("details", { class: "menu" },
      el("summary", {}, "Actions", el("span", { class: "visually-hidden" }, ` for ${name}`)),
      el("div", { class: "menu-items" }, ...items)));
    return ops;
  }

  // One menu open at a time; it floats over the table (position: fixed, placed under its summary, so the
  // table's sideways-scrolling box does not clip it) and closes on Escape, outside clicks and scrolling.
  function closeMenus(except) {
    for (const d of document.querySelectorAll("details.menu[open]")) if (d !== except) d.open = false;
  }
  tbody.addEventListener("toggle", (e) => {
    const d = e.target;
    if (!d.open) return;
    closeMenus(d);
    const box = d.querySelector("summary").getBoundingClientRect();
    const items = d.querySelector(".menu-items");
    items.style.top = `${Math.round(box.bottom + 2)}px`;
    items.style.left = `${Math.round(Math.max(4, box.right - items.offsetWidth))}px`;
    if (box.bottom + items.offsetHeight > innerHeight) items.style.top = `${Math.round(box.top - items.offsetHeight - 2)}px`;
  }, true);
  document.addEventListener("click", (e) => { if (!e.target.closest("details.menu")) closeMenus(null); });
  document.addEventListener("keydown", (e) => {
    const open = document.querySelector("details.menu[open]");
    if (e.key === "Escape" && open) { open.open = false; open.querySelector("summary").focus(); }
  });
  window.addEventListener("scroll", () => closeMenus(null), { passive: true });
  document.querySelector("#destinations").parentElement.addEventListener("scroll", () => closeMenus(null), { passive: true });

  // Delete a queue or a topic (one API call for both), saying what went: the messages the server removed.
  function deleteItem(row, question) {
    return el("button", { type: "button", class: "danger-text", dataset: { op: "delete" }, onclick: async () => {
      closeMenus(null);
      const done = await act(question, "Delete", () => api("DELETE", `${row.kind}s/${encodeURIComponent(row.name)}`));
      if (done) { toast(`Deleted ${row.destination}: ${fmt.num(done.removed)} messages removed`); load(); }
    } }, "Delete…");
  }

  async function run(text, label, call) {
    closeMenus(null);
    const done = await act(text, label, call);
    if (done) { toast(`${label}: done`); load(); }
  }

  function rowNode(row) {
    return el("tr", { dataset: { uri: row.destination } },
      el("th", { scope: "row" }, row.kind === "queue" ? el("a", { href: `/console/queues/${encodeURIComponent(row.name)}/` }, row.name)
        : el("a", { href: `/console/topics/${encodeURIComponent(row.name)}/` }, `${row.name} (topic)`),
        row.paused ? el("span", { class: "badge warn" }, " paused") : null,
        row.temporary ? el("span", { class: "badge" }, " temporary") : null),
      ...cells(row), operations(row));
  }

  function render(rows) {
    fill(tbody, rows.map(rowNode), 11, "No destinations match.");
  }

  const pages = () => Math.max(1, Math.ceil(count / state.limit));

  // On a phone the filters fold away under "Filters and sort (n)" so the list starts near the top; on a
  // wider screen they are always open (the summary is hidden there).
  const filtersBox = document.getElementById("filters");
  const wide = matchMedia("(min-width: 601px)");
  filtersBox.open = wide.matches;
  wide.addEventListener("change", () => { filtersBox.open = wide.matches; });
  function showActive() {
    const n = Object.keys(FILTERS).filter((k) => state[k]).length;
    document.getElementById("filters-active").textContent = n ? `(${n} on)` : "";
  }

  // A reader with partial rights is told the list is not everything: how many exist unseen, no names.
  function hiddenNote(n) {
    let note = document.getElementById("dest-hidden");
    if (!note) { note = el("p", { id: "dest-hidden", class: "note", role: "status" }); document.getElementById("destinations").closest(".scroll, table").before(note); }
    note.hidden = !n;
    note.textContent = n ? `${fmt.num(n)} more ${n === 1 ? "destination exists" : "destinations exist"} that you may not see: ask an administrator for read access.` : "";
  }

  function query() {
    const q = new URLSearchParams({ ordering: state.ordering, limit: state.limit, offset: state.offset });
    for (const key of Object.keys(FILTERS)) if (state[key]) q.set(key, state[key]);
    return q;
  }

  async function load() {
    const q = query();
    const shared = new URLSearchParams(q);
    shared.delete("offset");
    if (state.offset) shared.set("page", String(Math.floor(state.offset / state.limit) + 1));
    history.replaceState(null, "", `?${shared}`);
    showActive();
    // Filters changed in quick succession start overlapping loads: only the last one started renders, so
    // an earlier answer arriving late cannot show rows of a filter no longer chosen.
    const mine = ++loads;
    let data;
    try { data = await api("GET", `destinations?${q}`); } catch (e) { if (mine === loads) toast(e.message, true); return; }
    if (mine !== loads) return;
    count = data.count;
    if (!data.results.length && count && state.offset >= count) {  // past the last page (a shared link, rows gone)
      state.offset = (pages() - 1) * state.limit; load(); return;
    }
    shown = data.results;
    if (shown.length) {
      try { perms = (await api("GET", `console/permissions?destination=${encodeURIComponent(shown.map((r) => r.destination).join(","))}`)).destinations; } catch (e) { perms = {}; }
    }
    if (mine !== loads) return;
    render(shown);
    const from = count ? state.offset + 1 : 0;
    document.getElementById("dest-count").textContent = `${fmt.num(from)}–${fmt.num(state.offset + shown.length)} of ${fmt.num(count)}`;
    hiddenNote(data.hidden || 0);
    const current = Math.floor(state.offset / state.limit) + 1;
    const pageNo = document.getElementById("page-no");
    pageNo.value = String(current); pageNo.max = String(pages());
    document.getElementById("page-count").textContent = fmt.num(pages());
    document.getElementById("prev").disabled = document.getElementById("first").disabled = !data.previous;
    document.getElementById("next").disabled = document.getElementById("last").disabled = !data.next;
    for (const th of document.querySelectorAll("#destinations th[data-sort]")) {
      const key = th.dataset.sort;
      th.setAttribute("aria-sort", state.ordering === key ? "ascending" : state.ordering === `-${key}` ? "descending" : "none");
    }
    ordering.value = [...ordering.options].some((o) => o.value === state.ordering) ? state.ordering : "";
    if (feed) feed.send({ watch: shown.map((r) => r.destination) });
  }

  function updateRows(rows) {
    for (const row of rows) {
      const tr = tbody.querySelector(`tr[data-uri="${CSS.escape(row.destination)}"]`);
      if (!tr) continue;
      const at = shown.findIndex((r) => r.destination === row.destination);
      if (at >= 0 && Boolean(shown[at].paused) !== Boolean(row.paused)) {
        // paused or resumed elsewhere: the badge and the menu's Pause / Resume change with it
        shown[at] = row;
        tr.replaceWith(rowNode(row));
        continue;
      }
      for (const td of tr.querySelectorAll("td[data-col]")) td.replaceChildren(...content(td.dataset.col, row).filter(Boolean));
    }
  }

  function go(offset) { state.offset = Math.max(0, offset); load(); }
  function refilter() { for (const [key, id] of Object.entries(FILTERS)) state[key] = document.getElementById(id).value; go(0); }

  let timer = null;
  document.getElementById("search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(refilter, 250); });
  document.getElementById("filter").addEventListener("submit", (e) => { e.preventDefault(); refilter(); });
  for (const id of Object.values(FILTERS).slice(1)) document.getElementById(id).addEventListener("change", refilter);
  document.getElementById("clear").addEventListener("click", () => {  // the selects; the typed name stays
    for (const id of Object.values(FILTERS).slice(1)) document.getElementById(id).value = "";
    refilter();
  });
  ordering.addEventListener("change", () => { state.ordering = ordering.value || "name"; go(0); });
  size.addEventListener("change", () => { state.limit = Number(size.value); go(0); });
  document.getElementById("first").addEventListener("click", () => go(0));
  document.getElementById("prev").addEventListener("click", () => go(state.offset - state.limit));
  document.getElementById("next").addEventListener("click", () => go(state.offset + state.limit));
  document.getElementById("last").addEventListener("click", () => go((pages() - 1) * state.limit));
  document.getElementById("jump").addEventListener("submit", (e) => {
    e.preventDefault();
    const n = Math.min(pages(), Math.max(1, Math.floor(Number(document.getElementById("page-no").value) || 1)));
    go((n - 1) * state.limit);
  });
  for (const th of document.querySelectorAll("#destinations th[data-sort]")) {
    th.querySelector("button").addEventListener("click", () => {
      const key = th.dataset.sort;
      // a second click reverses the order; a new column starts descending (name: ascending)
      if (state.ordering === key) state.ordering = `-${key}`;
      else if (state.ordering === `-${key}`) state.ordering = key;
      else state.ordering = key === "name" ? key : `-${key}`;
      go(0);
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

  // A row deleted since the list was read (elsewhere, or by anything else) would keep its last figures
  // under a "Live" header: the list is read again without it.
  function dropGone(gone) {
    const listed = (gone || []).filter((uri) => shown.some((r) => r.destination === uri));
    if (!listed.length) return;
    toast(`${listed.map((uri) => uri.replace(/^(queue|topic):\/\//, "")).join(", ")} no longer ${listed.length === 1 ? "exists" : "exist"}`);
    load();
  }

  feed = live("", (msg) => { if (msg.type === "totals" && msg.rows) { updateRows(msg.rows); dropGone(msg.gone); } },
    (handle) => handle.send({ watch: shown.map((r) => r.destination) }));
  load();
})();
