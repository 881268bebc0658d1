/* Audit log: GET /api/v1/audit, filtered and paged; each record's result (what it affected), runs of the
   same action by one user grouped under one row. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, live, latest } = window.SB;
  const state = { offset: 0, limit: 50, destination: "", action: "" };
  const actionSelect = document.getElementById("a-action");
  const GROUP_MIN = 3; const GROUP_GAP_MS = 60000; // a run of 3+ within a minute of each other is one group

  // What the action did, from its response: `count` (messages, groups...) or `removed` (purge, delete).
  const PAST = [[/^purge$/, "purged"], [/^delete_destination$/, "deleted with"], [/^remove/, "removed"], [/^move/, "moved"],
    [/^copy/, "copied"], [/^retry/, "retried"]];
  function result(r) {
    if (!r.succeeded) return (r.result && (r.result.detail || r.result.title)) || "";
    const n = r.result && (typeof r.result.count === "number" ? r.result.count : r.result.removed);
    if (typeof n !== "number") return "";
    const verb = (PAST.find(([re]) => re.test(r.action)) || [null, "affected"])[1];
    const messages = /^(purge|delete_destination)$|_(message|matching)$/.test(r.action);
    return `${verb} ${fmt.num(n)}${messages ? (n === 1 ? " message" : " messages") : ""}`;
  }

  function row(r, extra = {}) {
    return el("tr", extra,
      el("td", {}, fmt.time(Date.parse(r.at))), el("td", {}, r.username || "–"), el("td", {}, r.action),
      el("td", {}, r.destination || "–"), el("td", { class: "id" }, r.target || "–"),
      el("td", {}, Object.keys(r.parameters || {}).length ? el("code", {}, JSON.stringify(r.parameters)) : "–"),
      el("td", {}, el("span", { class: `badge ${r.succeeded ? "good" : "bad"}` }, r.succeeded ? `ok ${r.status_code}` : `failed ${r.status_code}`)),
      el("td", { class: "audit-result" }, result(r) || "–"));
  }

  // Consecutive records (newest first) of one user and action with the same outcome, close in time.
  function runs(records) {
    const out = [];
    for (const r of records) {
      const last = out[out.length - 1];
      const prev = last && last[last.length - 1];
      if (prev && prev.username === r.username && prev.action === r.action && prev.succeeded === r.succeeded
          && Date.parse(prev.at) - Date.parse(r.at) <= GROUP_GAP_MS) last.push(r);
      else out.push([r]);
    }
    return out;
  }

  function group(records) {
    const first = records[records.length - 1]; const newest = records[0];
    const total = records.reduce((sum, r) => sum + ((r.result && typeof r.result.count === "number") ? r.result.count : 0), 0);
    const members = records.map((r) => row(r, { class: "audit-member", hidden: true }));
    const toggle = el("button", { type: "button", class: "small", "aria-expanded": "false" }, `Show ${records.length}`);
    toggle.addEventListener("click", () => {
      const open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", String(open));
      toggle.textContent = open ? `Hide ${records.length}` : `Show ${records.length}`;
      for (const m of members) m.hidden = !open;
    });
    const names = records.map((r) => r.destination).filter(Boolean);
    const head = el("tr", { class: "audit-group" },
      el("td", {}, `${fmt.time(Date.parse(first.at))} – ${fmt.time(Date.parse(newest.at))}`), el("td", {}, newest.username || "–"),
      el("td", {}, `${newest.action} × ${records.length}`),
      el("td", {}, names.length ? `${names[names.length - 1]} … ${names[0]}` : "–"), el("td", {}, "–"), el("td", {}, "–"),
      el("td", {}, el("span", { class: `badge ${newest.succeeded ? "good" : "bad"}` }, newest.succeeded ? "ok" : "failed")),
      el("td", { class: "audit-result" }, total ? `${result({ ...newest, result: { count: total } })} in all ` : "", toggle));
    return [head, ...members];
  }

  function actions(list) {
    const chosen = actionSelect.value;
    actionSelect.replaceChildren(el("option", { value: "" }, "All actions"), ...list.map((a) => el("option", { value: a }, a)));
    actionSelect.value = list.includes(chosen) ? chosen : "";
  }

  // (the page's first load may answer after a filter's: only the last one started renders)
  const load = latest(() => {
    const q = new URLSearchParams({ limit: state.limit, offset: state.offset });
    if (state.destination) q.set("destination", state.destination);
    if (state.action) q.set("action", state.action);
    return api("GET", `audit?${q}`);
  }, (data) => {
    actions(data.actions || []);
    fill(document.querySelector("#audit tbody"), runs(data.results).flatMap((rs) => (rs.length >= GROUP_MIN ? group(rs) : rs.map((r) => row(r)))), 8, "No audit records.");
    document.getElementById("audit-count").textContent = `${fmt.num(data.count ? state.offset + 1 : 0)}–${fmt.num(state.offset + data.results.length)} of ${fmt.num(data.count)}`;
    document.getElementById("prev").disabled = !data.previous;
    document.getElementById("next").disabled = !data.next;
  }, (e) => toast(e.message, true));
  document.getElementById("audit-filter").addEventListener("submit", (e) => {
    e.preventDefault();
    state.destination = document.getElementById("a-destination").value.trim();
    state.action = actionSelect.value;
    state.offset = 0; load();
  });
  actionSelect.addEventListener("change", () => document.getElementById("audit-filter").requestSubmit());
  document.getElementById("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); load(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += state.limit; load(); });
  load();
  live("", () => {});
})();
