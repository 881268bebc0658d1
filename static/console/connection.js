/* One connection: its fields, subscriptions and producers (GET /api/v1/connections/<id>), re-read every
   2 s; Close (staff) asks the owning gateway process to end it (POST .../close) and waits for it to go. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, act, live, page } = window.SB;
  const id = page().connection;
  const path = `connections/${encodeURIComponent(id)}`;
  let gone = false;
  function destLink(uri) {
    const m = /^(queue|topic):\/\/(.*)$/.exec(uri);
    if (!m || m[2].includes("*") || m[2].includes(">")) return el("code", {}, uri);
    return el("a", { href: `/console/${m[1]}s/${encodeURIComponent(m[2])}/` }, el("code", {}, uri));
  }
  function ended(text) {
    gone = true;
    document.getElementById("conn-state").textContent = text;
    const button = document.getElementById("close-connection");
    if (button) button.disabled = true;
  }
  async function load() {
    if (gone) return;
    let c;
    try { c = await api("GET", path); } catch (e) {
      if (e.status === 404) ended("This connection has ended (it is no longer registered)."); else toast(e.message, true);
      return;
    }
    const values = { ...c, connected_since: `${fmt.time(c.connected_since)} (${fmt.ago(c.connected_since)})` };
    for (const node of document.querySelectorAll("#fields [data-field]")) node.textContent = values[node.dataset.field] || "–";
    document.getElementById("conn-state").textContent = c.close_requested ? `Closing: requested ${fmt.ago(c.close_requested)}.` : "";
    fill(document.querySelector("#subscriptions tbody"), c.subscriptions.map((s) => el("tr", { dataset: { subscription: s.key } },
      el("td", { class: "id" }, s.key + (s.durable ? ` (durable ${s.durable})` : "")),
      el("td", {}, s.destinations.flatMap((d, i) => [i ? ", " : "", destLink(d)])),
      el("td", {}, s.ack_mode), el("td", {}, s.selector ? el("code", {}, s.selector) : "–"),
      el("td", { class: "num" }, s.prefetch === null || s.prefetch === undefined ? "–" : fmt.num(s.prefetch)),
      el("td", { class: "id" }, s.consumers.flatMap((x, i) => [i ? " " : "", el("code", {}, x)])))), 6, "No subscriptions.");
    fill(document.querySelector("#producers tbody"), c.producers.map((p) => el("tr", { dataset: { producer: p.destination } },
      el("td", {}, destLink(p.destination)), el("td", { class: "num" }, fmt.num(p.count)),
      el("td", { title: fmt.time(p.last_send) }, fmt.ago(p.last_send)))), 3, "No messages sent on this connection.");
    document.getElementById("producers-note").textContent = c.producers_untracked
      ? `${fmt.num(c.producers_untracked)} more messages went to destinations beyond the ${fmt.num(c.producer_count)} listed (the per-connection limit).` : "";
  }
  const button = document.getElementById("close-connection");
  if (button) button.addEventListener("click", async () => {
    const done = await act(`Close connection ${id}? The client is disconnected (STOMP: an ERROR frame, then the close); its unacknowledged messages go back to their queues.`,
      "Close connection", () => api("POST", `${path}/close`));
    if (!done) return;
    if (done.status === "closed") { ended("Connection closed."); return; }
    document.getElementById("conn-state").textContent = "Closing…";
    for (let i = 0; i < 40 && !gone; i += 1) { await new Promise((r) => setTimeout(r, 250)); await load(); }
    if (gone) document.getElementById("conn-state").textContent = "Connection closed.";
  });
  load();
  setInterval(load, 2000);
  live("", () => {});
})();
