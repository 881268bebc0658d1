/* Connections: GET /api/v1/connections, filtered and paged by cursor (the registry's order: by id).
   Re-read every 5 s, the registry having no event stream. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, live, latest } = window.SB;
  const state = { cursors: [""], index: 0, next: null, filters: {} };
  function link(c) { return el("a", { href: `/console/connections/${encodeURIComponent(c.id)}/` }, el("code", {}, c.id)); }
  // (the 5 s refresh, a filter, a page: only the load started last renders)
  const load = latest(() => {
    const q = new URLSearchParams({ limit: 50 });
    const cursor = state.cursors[state.index];
    if (cursor) q.set("cursor", cursor);
    for (const [k, v] of Object.entries(state.filters)) if (v) q.set(k, v);
    return api("GET", `connections?${q}`);
  }, (data) => {
    fill(document.querySelector("#connections tbody"), data.connections.map((c) => el("tr", { dataset: { connection: c.id } },
      el("td", { class: "id" }, link(c)), el("td", {}, c.protocol), el("td", { class: "id" }, c.client_id || "–"),
      el("td", {}, c.user || "–"), el("td", {}, c.address || "–"),
      el("td", { title: fmt.time(c.connected_since) }, fmt.ago(c.connected_since)),
      el("td", { class: "num" }, fmt.num(c.subscription_count)), el("td", { class: "num" }, fmt.num(c.producer_count)))),
      8, "No connections.");
    state.next = data.next_cursor;
    document.getElementById("conn-count").textContent = `page ${state.index + 1}: ${fmt.num(data.connections.length)} shown`;
    document.getElementById("prev").disabled = state.index === 0;
    document.getElementById("next").disabled = !state.next;
  }, (e) => toast(e.message, true));
  document.getElementById("conn-filter").addEventListener("submit", (e) => {
    e.preventDefault();
    state.filters = {
      protocol: document.getElementById("f-protocol").value, client: document.getElementById("f-client").value.trim(),
      user: document.getElementById("f-user").value.trim(), destination: document.getElementById("f-destination").value.trim(),
    };
    state.cursors = [""]; state.index = 0; load();
  });
  document.getElementById("prev").addEventListener("click", () => { if (state.index > 0) { state.index -= 1; load(); } });
  document.getElementById("next").addEventListener("click", () => {
    if (!state.next) return;
    state.cursors = state.cursors.slice(0, state.index + 1).concat([state.next]); state.index += 1; load();
  });
  // a link may bring filters (the queue page's "Connections": ?destination=queue://...)
  const given = new URLSearchParams(location.search);
  for (const [name, id] of [["protocol", "f-protocol"], ["client", "f-client"], ["user", "f-user"], ["destination", "f-destination"]]) {
    if (given.get(name)) { state.filters[name] = given.get(name); document.getElementById(id).value = given.get(name); }
  }
  load();
  setInterval(load, 5000);
  live("", () => {});
})();
