/* Audit log: GET /api/v1/audit, filtered and paged. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, live } = window.SB;
  const state = { offset: 0, limit: 50, destination: "", action: "" };
  async function load() {
    const q = new URLSearchParams({ limit: state.limit, offset: state.offset });
    if (state.destination) q.set("destination", state.destination);
    if (state.action) q.set("action", state.action);
    let data;
    try { data = await api("GET", `audit?${q}`); } catch (e) { toast(e.message, true); return; }
    fill(document.querySelector("#audit tbody"), data.results.map((r) => el("tr", {},
      el("td", {}, fmt.time(Date.parse(r.at))), el("td", {}, r.username || "–"), el("td", {}, r.action),
      el("td", {}, r.destination || "–"), el("td", { class: "id" }, r.target || "–"),
      el("td", {}, Object.keys(r.parameters || {}).length ? el("code", {}, JSON.stringify(r.parameters)) : "–"),
      el("td", {}, el("span", { class: `badge ${r.succeeded ? "good" : "bad"}` }, r.succeeded ? `ok ${r.status_code}` : `failed ${r.status_code}`),
        r.succeeded ? "" : ` ${r.result && (r.result.detail || r.result.title) || ""}`))), 7, "No audit records.");
    document.getElementById("audit-count").textContent = `${fmt.num(data.count ? state.offset + 1 : 0)}–${fmt.num(state.offset + data.results.length)} of ${fmt.num(data.count)}`;
    document.getElementById("prev").disabled = !data.previous;
    document.getElementById("next").disabled = !data.next;
  }
  document.getElementById("audit-filter").addEventListener("submit", (e) => {
    e.preventDefault();
    state.destination = document.getElementById("a-destination").value.trim();
    state.action = document.getElementById("a-action").value.trim();
    state.offset = 0; load();
  });
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); load(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; load(); });
  load();
  live("", () => {});
})();
