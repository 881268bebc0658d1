/* Queue page: statistics, consumers with prefetch bars, message groups, scheduled messages
   and recent events, live from the destination's lifecycle events; QueueView operations for admins. */
"use strict";
(function () {
  const { api, el, fill, fmt, ago, live, latest, act, toast, gone, eventLog, tracked, queuePath, meter, page, who } = window.SB;
  const P = page();
  const name = P.name; const admin = P.admin === "1";
  const base = queuePath(name);
  // (the rate chart is static/console/rates.js, from the server's rate history)
  let current = null;

  function showStats(stats, ts) {
    gone(stats ? null : `The queue ${name} does not exist (any more): deleted, or never created. A send to it creates it again.`);
    current = stats;
    for (const node of document.querySelectorAll("[data-stat]")) {
      const v = stats && stats[node.dataset.stat];
      node.textContent = typeof v === "number" ? fmt.num(v) : (v || "–");
    }
    scheduled.stats(stats);  // (its count is the card's)
    if (!stats) {  // nor its consumers, groups and scheduled messages, gone with it
      showConsumers([]);
      fill(document.querySelector("#groups tbody"), [], admin ? 7 : 6, "No message groups are assigned.");
      document.getElementById("groups-summary").textContent = "";
      return;
    }
    document.getElementById("paused-badge").hidden = !stats.paused;
    const pause = document.getElementById("pause"); const resume = document.getElementById("resume");
    if (pause) { pause.hidden = stats.paused; resume.hidden = !stats.paused; }
    showConsumers(stats.consumers || []);
  }

  // "slow" is the API's verdict (docs/console.md): window full and no acknowledgement for a while. The
  // broker's own slow_since (found full while a message waited) is set again after every ack of a busy
  // consumer, so it is only the tooltip's detail.
  function slowBadge(c) {
    if (!c.slow) return "–";
    const quiet = c.last_ack ? `last ack ${fmt.ago(c.last_ack)}` : `no ack since it attached ${fmt.ago(c.added)}`;
    // the badge one word, the detail as text beside it: the whole sentence in the pill wrapped into a
    // six-line pill that pushed the table past a laptop's screen
    const title = `Prefetch window full (${c.in_flight} in flight) and ${quiet}`
      + (c.slow_since ? `; dispatch last found it full ${fmt.time(c.slow_since)}` : "");
    return el("span", { class: "slow", title }, el("span", { class: "badge bad" }, "slow"), " ", el("small", {}, quiet));
  }

  // The consumer's connection on the Connections page (a REST consumer is a connection of its own).
  function connectionLink(c, node) {
    const conn = c.connection_id && c.connection_id.startsWith("http:") ? c.consumer_id : c.connection_id;
    return conn ? el("a", { href: `/console/connections/${encodeURIComponent(conn)}/`, title: `connection ${conn}` }, node) : node;
  }

  function showConsumers(consumers) {
    who.learn(consumers);
    // in the order they attached: the broker's own order rotates with round-robin dispatch
    const ordered = [...consumers].sort((a, b) => (a.added - b.added) || (a.consumer_id < b.consumer_id ? -1 : 1));
    const rows = ordered.map((c) => {
      const window = c.prefetch + (c.prefetch_extension || 0);
      // data-label: on a phone the table is a list of cards, each figure under its label (console.css)
      return el("tr", { dataset: { consumer: c.consumer_id } },
        el("td", { class: "id", "data-label": "Id" }, el("code", {}, c.consumer_id)),
        el("td", { class: "id", "data-label": "Client / connection" }, connectionLink(c, who.node(c.consumer_id))),
        el("td", { "data-label": "Selector" }, c.selector ? el("code", {}, c.selector) : "–"),
        el("td", { class: "num", "data-label": "Priority" }, c.priority),
        el("td", { "data-label": "Exclusive" }, c.exclusive ? (c.is_exclusive_owner ? "yes (owner)" : "yes") : (c.is_exclusive_owner ? "owner" : "no")),
        el("td", { "data-label": "Ack mode" }, c.ack_mode),
        el("td", { class: "num", "data-label": "Prefetch" }, c.prefetch === 0 ? "0 (pull)" : fmt.num(c.prefetch)),
        el("td", { class: "prefetch", "data-label": "In flight / prefetch" }, meter(c.in_flight, Math.max(window, c.in_flight), c.full)),
        el("td", { class: "num", "data-label": "Dispatched" }, fmt.num(c.dispatched)),
        el("td", { class: "num", "data-label": "Acked" }, fmt.num(c.acked)),
        el("td", { class: "num", "data-label": "Groups assigned" }, fmt.num(c.groups)),
        el("td", { dataset: { col: "slow" }, "data-label": "Slow" }, slowBadge(c)),
        el("td", { "data-label": "Lease expires" }, ago(c.lease_expires)));
    });
    fill(document.querySelector("#consumers tbody"), rows, 13, "No consumers.");
  }

  const loadGroups = latest(() => api("GET", `console/${base}/groups`), (g) => {
    const fill_ = g.capacity ? `${fmt.num(g.group_count)} of ${fmt.num(g.capacity)} (${(100 * g.fill).toFixed(1)}%)` : `${fmt.num(g.group_count)} (unbounded)`;
    const scope = g.complete ? "" : ` Counts cover the first ${fmt.num(g.examined)} messages.`;
    const listed = g.groups_complete ? "" : ` Listing the first ${fmt.num(g.groups.length)} groups.`;
    document.getElementById("groups-summary").textContent =
      `Group map: ${g.map_type}, ${fill_} · ${fmt.num(g.held_back)} messages held back waiting for busy owners.${scope}${listed}`;
    who.learn(g.groups.map((x) => ({ consumer_id: x.owner, client_id: x.owner_client_id, connection_id: x.owner_connection_id, added: x.owner_added })));
    const sorted = [...g.groups].sort((a, b) => (a.group_id < b.group_id ? -1 : a.group_id > b.group_id ? 1 : 0));
    const rows = sorted.map((x) => el("tr", { dataset: { group: x.group_id } },
      el("th", { scope: "row" }, x.group_id),
      el("td", { class: "id", dataset: { col: "owner" } }, who.node(x.owner), x.owner_busy ? [" ", el("span", { class: "badge warn" }, "busy")] : null),
      el("td", {}, ago(x.assigned_at)),
      el("td", { class: "num" }, fmt.num(x.pending)),
      el("td", { class: "num" }, fmt.num(x.in_flight)),
      el("td", { class: "num" }, fmt.num(x.held_back)),
      admin ? el("td", {}, el("button", { type: "button", class: "small", "aria-label": `Reset group ${x.group_id}`,
        onclick: () => resetGroup(x.group_id) }, "Reset")) : null));
    fill(document.querySelector("#groups tbody"), rows, admin ? 7 : 6, "No message groups are assigned.");
  });

  async function resetGroup(group) {
    const done = await act(`Reset the message group ${group}? Its next message picks a new owner.`, "Reset group",
      () => api("DELETE", `${base}/groups/${encodeURIComponent(group)}`));
    if (done) { toast(`Group ${group} reset`); loadGroups(); }
  }

  // scheduled and delayed messages: the table the topic page has too (scheduled.js)
  const scheduled = window.SB.scheduledTable({ base, admin,
    link: (id) => `/console/queues/${encodeURIComponent(name)}/messages/${encodeURIComponent(id)}/` });
  const loadScheduled = scheduled.load;

  const showEvents = eventLog(document.getElementById("events"));

  let groupsTimer = null;
  function groupsSoon() { if (!groupsTimer) groupsTimer = setTimeout(() => { groupsTimer = null; loadGroups(); }, 700); }

  live(`destination=${encodeURIComponent(P.uri)}`, (msg) => {
    if (msg.type === "stats") showStats(msg.stats, msg.ts);
    else if (msg.type === "events") {
      showEvents(msg.recent);
      const kinds = Object.keys(msg.counts);
      if (kinds.some((k) => k.startsWith("group_") || k.startsWith("consumer_") || k === "dispatch" || k === "ack" || k === "enqueue")) groupsSoon();
      if (kinds.some((k) => k === "schedule" || k === "redeliver" || k === "cancel")) loadScheduled();
    }
  }, () => { loadGroups(); loadScheduled(); });  // (re)opened: what changed while it was closed

  async function admin_(text, label, call, progressTitle) {
    if (!(await window.SB.confirm(text, label))) return;
    try {
      const start = current ? current.queue_size : 0;
      const result = progressTitle
        ? await tracked(progressTitle, call, async () => {
          const s = await api("GET", base);
          return { done: Math.max(0, start - s.queue_size), total: start };
        })
        : await call();
      toast(`${label}: done${result && result.removed !== undefined ? ` (${fmt.num(result.removed)} removed)` : ""}${result && result.count !== undefined ? ` (${fmt.num(result.count)})` : ""}`);
      document.dispatchEvent(new Event("sb:operation"));  // the rate chart marks it (rates.js)
      return result || {};
    } catch (e) { toast(e.message, true); return null; }
  }

  if (admin) {
    document.getElementById("pause").addEventListener("click", async () => { if (await admin_(`Pause ${name}? Nothing is dispatched until it is resumed.`, "Pause", () => api("POST", `${base}/pause`))) showStats(await api("GET", base), Date.now()); });
    document.getElementById("resume").addEventListener("click", async () => { if (await admin_(`Resume ${name}?`, "Resume", () => api("POST", `${base}/resume`))) showStats(await api("GET", base), Date.now()); });
    document.getElementById("purge").addEventListener("click", () => admin_(`Purge every message of ${name}, in flight too? This cannot be undone.`, "Purge", () => api("POST", `${base}/purge`), `Purging ${name}`));
    document.getElementById("delete").addEventListener("click", async () => {
      const done = await admin_(`Delete ${name} and all its messages? This cannot be undone.`, "Delete", () => api("DELETE", base));
      if (!done) return;
      window.SB.toastNext(`Deleted ${P.uri}: ${fmt.num(done.removed)} messages removed`);  // (said on the list)
      location.href = "/console/destinations/";
    });
    document.getElementById("remove-all-groups").addEventListener("click", async () => {
      if (await admin_(`Remove all message groups of ${name}? Their next messages are assigned to consumers again.`, "Remove all message groups",
        () => api("DELETE", `${base}/groups`))) loadGroups();
    });
  }

  api("GET", base).then((s) => showStats(s, Date.now())).catch((e) => toast(e.message, true));
  loadGroups();
  loadScheduled();
})();
