/* Dead letters: each DLQ with its original destinations and causes; retry one origin's messages, or all. */
"use strict";
(function () {
  const { api, el, fmt, toast, tracked, live, queuePath } = window.SB;
  const box = document.getElementById("dlqs");
  const template = document.getElementById("dlq-template");
  let perms = {};

  async function retryOrigin(dlq, origin) {
    const ids = origin.message_ids;
    const to = origin.original_destination;
    if (!(await window.SB.confirm(`Retry ${ids.length} messages of ${dlq.name} back to ${to}?`, "Retry"))) return;
    let done = 0; let failed = 0;
    try {
      await tracked(`Retrying to ${to}`, async (bar) => {
        for (const id of ids) {
          try { await api("POST", `${queuePath(dlq.name)}/messages/${encodeURIComponent(id)}/retry`); done++; } catch (e) { failed++; }
          bar.update(done + failed, ids.length);
        }
      });
      toast(`Retried ${fmt.num(done)} messages${failed ? `, ${failed} failed` : ""}`, failed > 0);
    } catch (e) { toast(e.message, true); }
    load();
  }

  async function retryAll(dlq) {
    if (!(await window.SB.confirm(`Retry all ${fmt.num(dlq.queue_size)} messages of ${dlq.name} back to their original destinations?`, "Retry all"))) return;
    try {
      const start = dlq.queue_size;
      const result = await tracked(`Retrying ${dlq.name}`, () => api("POST", `${queuePath(dlq.name)}/retry-matching`, {}),
        async () => { const s = await api("GET", queuePath(dlq.name)); return { done: Math.max(0, start - s.queue_size), total: start }; });
      toast(`Retried ${fmt.num(result.count)} messages`);
    } catch (e) { toast(e.message, true); }
    load();
  }

  async function load() {
    let data;
    try { data = await api("GET", "console/dead-letters"); } catch (e) { toast(e.message, true); return; }
    const dlqs = data.dead_letter_queues;
    if (dlqs.length) {
      try { perms = (await api("GET", `console/permissions?destination=${encodeURIComponent(dlqs.map((d) => d.destination).join(","))}`)).destinations; } catch (e) { perms = {}; }
    }
    box.replaceChildren(...(dlqs.length ? dlqs.map((dlq) => {
      const node = template.content.firstElementChild.cloneNode(true);
      const admin = (perms[dlq.destination] || {}).admin;
      node.dataset.dlq = dlq.name;
      node.querySelector(".origins").setAttribute("aria-label", `Origins of ${dlq.name}`);  // (a scrolling box is a named region)
      const link = node.querySelector(".dlq-link");
      link.textContent = dlq.name; link.href = `/console/queues/${encodeURIComponent(dlq.name)}/`;
      node.querySelector(".dlq-size").textContent = `${fmt.num(dlq.queue_size)} messages`;
      node.querySelector(".browse-link").href = `/console/queues/${encodeURIComponent(dlq.name)}/browse/`;
      const all = node.querySelector(".retry-all");
      if (admin && dlq.queue_size) all.addEventListener("click", () => retryAll(dlq)); else all.remove();
      const tbody = node.querySelector("tbody");
      tbody.replaceChildren(...(dlq.origins.length ? dlq.origins.map((o) => el("tr", {},
        el("td", {}, o.original_destination || "–"), el("td", {}, o.cause), el("td", { class: "num" }, fmt.num(o.count)),
        el("td", {}, admin && o.original_destination ? el("button", { type: "button", class: "small", onclick: () => retryOrigin(dlq, o) }, `Retry to ${o.original_destination.replace(/^queue:\/\//, "")}`) : ""))) : [el("tr", {}, el("td", { colspan: 4, class: "empty" }, "Empty."))]));
      node.querySelector(".note").textContent = dlq.complete ? "" : `Origins and causes counted over the first ${fmt.num(dlq.examined)} messages.`;
      return node;
    }) : [el("p", { class: "empty" }, "No dead-letter queues yet.")]));
  }

  load();
  live("", () => {});
  setInterval(load, 10000);
})();
