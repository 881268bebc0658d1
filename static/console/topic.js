/* Topic page: the topic's statistics and its subscriptions (durable active/offline, retroactive, pending,
   in flight, slow state, discards, pending-message limit), live from the destination's stats, and its
   scheduled messages (scheduled.js, as the queue page); admins may delete an offline durable subscription
   (DurableSubscriptionView.destroy; the API audits it and refuses an active one) and delete the topic
   (BrokerView.removeTopic: every subscription goes, durable and active ones too; the API audits it with
   the messages removed). */
"use strict";
(function () {
  const { api, el, fill, fmt, live, act, toast, toastNext, gone, eventLog, page, who } = window.SB;
  const P = page();
  const name = P.name; const admin = P.admin === "1";
  const base = `topics/${encodeURIComponent(name)}`;
  // (no message page for a topic's message: its ids are not links)
  const scheduled = window.SB.scheduledTable({ base, admin, link: null });
  let current = null;

  function showStats(stats) {
    // deleted while the page is open: no last figures left reading as live (as the queue page)
    gone(stats ? null : `The topic ${name} does not exist (any more): deleted, or never created. A send or a subscription creates it again.`);
    current = stats;
    scheduled.stats(stats);
    // Pending as the destination list counts it (waiting + in flight); Waiting is `pending`, not dispatched
    const figures = stats && { ...stats, messages: stats.pending + stats.in_flight };
    for (const node of document.querySelectorAll("[data-stat]")) {
      const v = figures && figures[node.dataset.stat];
      node.textContent = typeof v === "number" ? fmt.num(v) : (v || "–");
    }
    if (!stats) { showSubscriptions([]); return; }
    who.learn(stats.consumers);
    // a stable order: by name, not the broker's
    showSubscriptions([...(stats.subscriptions || [])].sort((a, b) => (label(a) < label(b) ? -1 : label(a) > label(b) ? 1 : 0)));
  }

  function label(s) {
    return s.durable ? `${s.client_id} / ${s.subscription_name}` : `non-durable ${s.consumer_id ? who.label(s.consumer_id) : s.key}`;
  }

  function showSubscriptions(subs) {
    const rows = subs.map((s) => el("tr", { dataset: { key: s.key, durable: s.durable ? "1" : "0" } },
      el("th", { scope: "row" }, label(s)),
      el("td", { class: "state" },
        s.active ? el("span", { class: "badge good" }, "active")
          : el("span", { class: "badge warn", title: s.offline_since ? `offline since ${fmt.time(s.offline_since)}` : null }, "offline"),
        s.durable ? " durable" : null, s.retroactive ? " retroactive" : null),
      el("td", {}, s.selector ? el("code", {}, s.selector) : "–", s.no_local ? " (noLocal)" : null),
      el("td", { class: "num", dataset: { col: "pending" } }, fmt.num(s.pending)),
      el("td", { class: "num", dataset: { col: "in_flight" } }, fmt.num(s.in_flight)),
      el("td", { class: "num" }, fmt.num(s.dispatched)),
      el("td", { class: "num" }, fmt.num(s.dequeued)),
      el("td", { class: "num", dataset: { col: "discards" },
        title: `evicted ${s.evicted}, dropped ${s.dropped}, dead letters discarded ${s.discarded}` },
      fmt.num(s.evicted + s.dropped + s.discarded)),
      el("td", { class: "num" }, s.active ? fmt.num(s.prefetch) : "–"),
      // the pending-message limit in force (§8.5); -1 = none (durable subscriptions never have one)
      el("td", { class: "num", dataset: { col: "pending_limit" } },
        s.pending_message_limit < 0 ? "none" : fmt.num(s.pending_message_limit)),
      el("td", {}, s.slow_since ? el("span", { class: "badge bad" }, `slow since ${fmt.ago(s.slow_since)}`) : "–"),
      // an active one is refused by the broker (its consumer holds it): not offered, and the reason said
      admin ? el("td", {}, s.durable ? el("button", { type: "button", class: "small danger",
        "aria-label": `Delete subscription ${label(s)}`, onclick: () => remove(s), disabled: s.active,
        title: s.active ? "Its consumer is connected: a durable subscription in use cannot be deleted; close the consumer (or its connection) first" : null },
      "Delete subscription") : null) : null));
    fill(document.querySelector("#subscriptions tbody"), rows, admin ? 12 : 11, "No subscriptions.");
  }

  async function remove(s) {
    const path = `${base}/subscriptions/${encodeURIComponent(s.client_id)}/${encodeURIComponent(s.subscription_name)}`;
    const done = await act(`Delete the durable subscription ${label(s)} and its ${fmt.num(s.pending + s.in_flight)} messages? This cannot be undone.`,
      "Delete subscription", () => api("DELETE", path));
    if (done) { toast(`Subscription ${label(s)} deleted (${fmt.num(done.removed)} messages removed)`); refresh(); }
  }

  function refresh() { return api("GET", base).then(showStats).catch((e) => toast(e.message, true)); }

  // What goes with the topic, from the figures on screen; the count removed comes back from the server.
  function deleteQuestion(s) {
    if (!s) return `Delete the topic ${name}? This cannot be undone.`;
    const held = s.pending + s.in_flight;
    const durables = s.durable_active + s.durable_offline;
    const active = (s.subscriptions || []).filter((x) => x.active).length;
    return `Delete the topic ${name} with its ${fmt.num(s.consumer_count)} subscriptions (${fmt.num(durables)} durable, `
      + `${fmt.num(s.durable_offline)} offline) and the ${fmt.num(held)} messages held for them`
      + `${s.redelivery_delayed ? `, ${fmt.num(s.redelivery_delayed)} waiting for a redelivery delay` : ""}`
      + `${s.scheduled ? `, and ${fmt.num(s.scheduled)} scheduled` : ""}?`
      + `${active ? ` ${fmt.num(active)} active subscribers are cut off.` : ""} This cannot be undone.`;
  }

  if (admin) {
    document.getElementById("delete").addEventListener("click", async () => {
      const done = await act(deleteQuestion(current), "Delete", () => api("DELETE", base));
      if (!done) return;
      toastNext(`Deleted ${P.uri}: ${fmt.num(done.removed)} messages removed`);
      location.href = "/console/destinations/";
    });
  }

  const showEvents = eventLog(document.getElementById("events"));

  live(`destination=${encodeURIComponent(P.uri)}`, (msg) => {
    if (msg.type === "stats") showStats(msg.stats);
    else if (msg.type === "events") {
      showEvents(msg.recent);
      if (Object.keys(msg.counts).some((k) => k === "schedule" || k === "cancel")) scheduled.load();
    }
  }, () => scheduled.load());  // (re)opened: what changed while it was closed
  refresh();
  scheduled.load();
})();
