/* Overview: broker totals live from the feed's totals; health from /healthz. The rate chart is
   static/console/rates.js (the server's rate history). */
"use strict";
(function () {
  const { api, el, fill, fmt, live, ago } = window.SB;

  // The largest backlog's subscription comes with GET console/overview (the feed's totals name only the
  // destination): asked again when the destination changes.
  let largestSub = { destination: null, subscription: null };
  function largest(node, l) {
    if (!l) { node.textContent = "none"; return; }
    if (l.subscription !== undefined) largestSub = { destination: l.destination, subscription: l.subscription };
    else if (largestSub.destination !== l.destination) {
      largestSub = { destination: l.destination, subscription: null };
      if (l.destination.startsWith("topic://")) api("GET", "console/overview").then((t) => show(t)).catch(() => {});
    }
    const sub = largestSub.destination === l.destination ? largestSub.subscription : null;
    const name = l.destination.replace(/^(queue|topic):\/\//, "");
    const href = l.destination.startsWith("topic://") ? `/console/topics/${encodeURIComponent(name)}/` : `/console/queues/${encodeURIComponent(name)}/`;
    node.replaceChildren(el("a", { href, title: l.destination }, l.destination.startsWith("topic://") ? `${name} (topic)` : name),
      ` ${fmt.num(l.messages)}`,
      ...(sub ? [el("small", { class: "largest", title: sub.key }, `largest subscription: ${sub.label} (${fmt.num(sub.messages)})`)] : [])); // (replaceChildren writes a null as "null")
  }

  function show(totals) {
    for (const node of document.querySelectorAll("[data-total]")) {
      const key = node.dataset.total;
      if (key === "largest") largest(node, totals.largest);
      else if (key === "redis_memory") {
        const m = totals.redis_memory;
        if (m) node.textContent = m.max ? `${fmt.bytes(m.used)} of ${fmt.bytes(m.max)}` : fmt.bytes(m.used);
      }
      else node.textContent = fmt.num(totals[key]);
    }
  }

  const HEALTH = { redis: "Redis", database: "Database", celery: "Celery workers", maintenance: "Maintenance tick" };
  async function health() {
    let data;
    try {
      const response = await fetch("/healthz", { credentials: "same-origin" });
      data = await response.json();
    } catch (error) { data = { redis: { status: "error", error: String(error) } }; }
    // The maintenance tick too: with Celery beat stopped the workers still answer their ping, so the other
    // rows all read ok while nothing expires, no lapsed lease is redelivered and no rate is sampled.
    const rows = Object.keys(HEALTH).filter((k) => data[k]).map((k) => {
      const c = data[k];
      // the tick's age counts on between readings (SB.ago), on the server's clock, as every relative time
      const details = c.status !== "ok" ? c.error
        : c.workers ? `workers: ${c.workers.join(", ")}` : c.version ? `version ${c.version}`
          : c.last_tick ? ["last ran ", ago(c.last_tick)] : c.vendor || "";
      return el("tr", { dataset: { check: k } }, el("th", { scope: "row" }, HEALTH[k]),
        el("td", {}, el("span", { class: `badge ${c.status === "ok" ? "good" : "bad"}` }, c.status)), el("td", {}, details));
    });
    fill(document.querySelector("#health tbody"), rows, 3, "No health data");
  }

  api("GET", "console/overview").then((t) => show(t)).catch((e) => window.SB.toast(e.message, true));
  live("", (msg) => { if (msg.type === "totals") show(msg.totals); });
  health();
  setInterval(health, 15000);
})();
