/* Analytics page of one destination: draws the analytics pipeline's summary (summary.json of the last
   run): totals, per-minute throughput (uPlot, as the rate charts), latency percentiles in ms/s/min, dead-letter causes, redeliveries, message-group
   balance with the removeAllMessageGroups recommendation, slow-consumer episodes. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, confirm, queuePath, page, who, chartOptions, chartMissing } = window.SB;
  const P = page();
  const admin = P.admin === "1";
  const LABELS = { enqueued: "Enqueued", dispatched: "Dispatched", acked: "Acked", redelivered: "Redelivered",
    expired: "Expired", expired_on_arrival: "Expired on arrival", dead_lettered: "Dead-lettered", discarded: "Discarded", evicted: "Evicted", lost: "Lost events" };
  const METRICS = { send_to_dispatch: "send → dispatch", dispatch_to_ack: "dispatch → ack", send_to_ack: "send → ack" };
  const when = (ms) => new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  // A latency in the unit that reads best: 0.4 ms, 850 ms, 1.25 s, 42.5 s, 3 min 20 s, 2 h 5 min.
  function duration(v) {
    if (v === null || v === undefined) return "–";
    if (v < 1) return `${v === 0 ? 0 : v.toFixed(1)} ms`;
    if (Math.round(v) < 1000) return `${Math.round(v)} ms`;
    if (v < 9995) return `${(v / 1000).toFixed(2)} s`;
    if (v < 59950) return `${(v / 1000).toFixed(1)} s`;
    const s = Math.round(v / 1000);
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    const m = Math.round(s / 60);
    return `${Math.floor(m / 60)} h ${m % 60} min`;
  }

  // The throughput chart: the per-minute counters as messages/s (count ÷ 60), drawn by the console's
  // uPlot helper (rates.js) with the rate charts' series and colours. A minute without events is a 0
  // (the summary lists only minutes with events). The summary keeps the last 1,440 such minutes, which
  // hold every minute of the range's last 24 h: a longer range is drawn for those 24 h.
  const FLOW = [
    { key: "enqueued", label: "enqueued", color: "--rate-enqueued" },
    { key: "dispatched", label: "dispatched", color: "--rate-dispatched" },
    { key: "acked", label: "acked", color: "--rate-acked" },
    { key: "redelivered", label: "redelivered", color: "--rate-redelivered" },
    { key: "expired", label: "expired", color: "--rate-expired" },
    { key: "dead_lettered", label: "dead-lettered", color: "--rate-deadlettered" },
  ];
  const MINUTE = 60000; const SUMMARY_MINUTES = 1440;
  function throughput(s) {
    const figure = document.getElementById("throughput-chart");
    const plot = figure.querySelector(".rate-plot");
    const index = Object.fromEntries(s.counters.map((n, i) => [n, i + 1]));
    const last = Math.floor((s.until_ms - 1) / MINUTE) * MINUTE;
    const first = Math.max(Math.floor(s.since_ms / MINUTE) * MINUTE, last - (SUMMARY_MINUTES - 1) * MINUTE);
    const byMinute = new Map(s.per_minute.map((p) => [p[0], p]));
    const columns = [[], ...FLOW.map(() => [])];
    for (let t = first; t <= last; t += MINUTE) {
      const p = byMinute.get(t);
      columns[0].push(t / 1000);
      FLOW.forEach((f, i) => columns[i + 1].push(p ? p[index[f.key]] / 60 : 0));
    }
    document.getElementById("throughput-caption").textContent = `Per-minute averages, ${when(first)} – ${when(last + MINUTE)}`
      + (first > Math.floor(s.since_ms / MINUTE) * MINUTE ? " (the last 24 h of the range)." : ".");
    if (!window.uPlot) { plot.replaceChildren(chartMissing("The totals above count the whole range.")); return; }
    let chart = null;
    const draw = () => {
      if (chart) chart.destroy();
      plot.replaceChildren();
      chart = new window.uPlot(chartOptions(plot, FLOW, { time: when, xRange: () => [first / 1000, last / 1000] }),
        columns, plot);
      figure.uplot = chart;  // (tests)
    };
    draw();
    new ResizeObserver(() => chart.setSize({ width: Math.max(300, plot.clientWidth), height: chart.height })).observe(plot);
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", draw);
  }

  function bar(value, max, label) {
    const pct = max > 0 ? Math.min(100, (100 * value) / max) : 0;
    return el("span", { class: "meter", role: "meter", "aria-valuemin": 0, "aria-valuemax": max, "aria-valuenow": value, "aria-label": label },
      el("span", { class: "track" }, el("span", { class: "fill", style: `width:${pct}%` })));
  }

  function show(s) {
    document.getElementById("range").textContent =
      `${when(s.since_ms)} – ${when(s.until_ms)}; computed ${when(s.generated_at_ms)} `
      + `(${duration(Math.max(0, Date.now() - s.generated_at_ms))} ago).`;
    const stale = document.getElementById("stale");  // (the server says when a scheduled run is overdue)
    stale.hidden = !s.stale;
    stale.textContent = s.stale || "";
    // Events the stream's bound dropped before the archive read them (the archive's `lost` rows): every
    // figure on the page misses them, which the page says rather than showing partial numbers as whole.
    const lost = s.totals.lost || 0;
    const loss = document.getElementById("loss");
    loss.hidden = lost === 0;
    loss.textContent = lost === 0 ? "" : `${fmt.num(lost)} events were dropped by the event stream's bound `
      + "(eventsMaxLen) before they were archived: the figures below miss them. Archive more often "
      + "(SIGNALBOX_ARCHIVE_SECONDS) or raise eventsMaxLen.";
    document.getElementById("analytics-body").hidden = false;
    document.getElementById("totals").replaceChildren(...s.counters.map((name) =>
      el("div", { dataset: { counter: name } }, el("dt", {}, LABELS[name] || name), el("dd", {}, fmt.num(s.totals[name])))));
    throughput(s);

    const latencyRows = [];
    const maxP99 = Math.max(1, ...Object.values(s.latency).map((x) => x.p99 || 0),
      ...Object.values(s.latency_by_consumer).flatMap((m) => Object.values(m).map((x) => x.p99 || 0)));
    const addLatency = (consumer, metrics) => {
      for (const [metric, x] of Object.entries(metrics)) {
        latencyRows.push(el("tr", { dataset: { consumer: consumer || "", metric } },
          el("td", { class: "id" }, consumer ? who.node(consumer) : "all consumers"), el("td", {}, METRICS[metric] || metric),
          el("td", { class: "num" }, fmt.num(x.count)),
          ...["p50", "p95", "p99"].map((p) => el("td", { class: "num", dataset: { p, ms: x[p] ?? "" } }, duration(x[p]))),
          el("td", {}, bar(x.p99 || 0, maxP99, `p99 ${duration(x.p99)}`))));
      }
    };
    addLatency(null, s.latency);
    for (const [consumer, metrics] of Object.entries(s.latency_by_consumer).sort()) addLatency(consumer, metrics);
    fill(document.querySelector("#latency tbody"), latencyRows, 7, "No message was delivered in the range.");

    const dlqTotal = s.dead_letters.reduce((a, d) => a + d.count, 0);
    fill(document.querySelector("#dead-letters tbody"), s.dead_letters.map((d) => el("tr", {},
      el("td", {}, d.outcome === "discard" ? "discarded" : "dead-lettered"), el("td", {}, d.cause || "–"),
      el("td", {}, d.target || "–"), el("td", { class: "num" }, fmt.num(d.count)),
      el("td", {}, bar(d.count, dlqTotal, `${d.count} of ${dlqTotal}`)), el("td", { class: "detail" }, d.sample_detail || ""))),
    6, "Nothing was dead-lettered in the range.");
    const redeliveries = Object.entries(s.redeliveries).map(([n, c]) => [Number(n), c]).sort((a, b) => a[0] - b[0]);
    const delivered = redeliveries.reduce((a, r) => a + r[1], 0);
    fill(document.querySelector("#redeliveries tbody"), redeliveries.map(([n, c]) => el("tr", {},
      el("td", { class: "num" }, fmt.num(n)), el("td", { class: "num" }, fmt.num(c)), el("td", {}, bar(c, delivered, `${c} of ${delivered}`)))),
    3, "No message was delivered in the range.");

    const g = s.groups; const b = g.balance;
    // The balance is about who owns the groups at the end of the range (what removeAllMessageGroups would
    // change), the table below about what was dispatched to whom during it: labelled as such, and the
    // owner the balance names is marked in the table, so the two cannot read as contradicting each other.
    document.getElementById("balance").replaceChildren(...(b
      ? [`${fmt.num(g.count)} groups, ${fmt.num(b.grouped_messages)} grouped messages over ${fmt.num(b.consumers)} active consumers; `
        + `imbalance ${b.imbalance === null ? "–" : b.imbalance.toFixed(2)} (1.00 is even)`,
      ...(b.busiest_consumer ? [". Busiest owner at the end of the range: ", who.node(b.busiest_consumer),
        `, whose groups carried ${Math.round(100 * b.busiest_share)} % of the grouped messages`] : []), "."]
      : ["No message groups in the range."]));
    const rec = document.getElementById("recommendation");
    rec.textContent = b ? b.recommendation : "";
    rec.className = b && b.recommend_reset ? "badge warn" : "";
    const grouped = g.consumers.reduce((a, c) => a + c.messages, 0);
    fill(document.querySelector("#group-consumers tbody"), g.consumers.map((c) => el("tr", { dataset: { consumer: c.consumer } },
      el("td", { class: "id" }, who.node(c.consumer),
        b && b.busiest_consumer === c.consumer ? el("span", { class: "badge warn", title: "The busiest owner at the end of the range (above)" }, " busiest owner") : null),
      el("td", { class: "num" }, fmt.num(c.groups)), el("td", { class: "num" }, fmt.num(c.messages)),
      el("td", {}, bar(c.messages, grouped, `${c.messages} of ${grouped}`)))), 4, "No grouped message was dispatched.");
    fill(document.querySelector("#top-groups tbody"), g.top.map((x) => el("tr", {},
      el("td", {}, x.group), el("td", { class: "num" }, fmt.num(x.messages)), el("td", { class: "num" }, fmt.num(x.owner_changes)),
      el("td", { class: "id" }, who.node(x.owner)))), 4, "No message groups.");

    const slow = s.slow_consumers;
    document.getElementById("slow-summary").textContent =
      `${fmt.num(slow.episodes)} slow-consumer episodes, ${fmt.num(slow.aborts)} consumers aborted.`;
    fill(document.querySelector("#slow-episodes tbody"), slow.recent_episodes.map((e) => el("tr", {},
      el("td", { class: "id" }, who.node(e.consumer)), el("td", {}, when(e.start_ts)), el("td", {}, when(e.end_ts)), el("td", { class: "num" }, fmt.num(e.signals)))),
    4, "No slow consumers in the range.");
  }

  // Names of the consumers still attached (the summary keeps only ids); those gone stay ids.
  const path = `${P.kind === "topic" ? "topics" : "queues"}/${encodeURIComponent(P.name)}`;
  Promise.all([api("GET", P.summary), api("GET", path).then((d) => who.learn(d.consumers)).catch(() => {})])
    .then(([s]) => show(s)).catch((e) => {
    document.getElementById("range").textContent = e.message;
  });

  const reset = document.getElementById("remove-all-groups");
  if (admin && reset) {
    reset.addEventListener("click", async () => {
      if (!(await confirm(`Remove all message groups of ${P.name}? Their next messages are assigned to consumers again.`,
        "Remove all message groups"))) return;
      try {
        const result = await api("DELETE", `${queuePath(P.name)}/groups`);
        toast(`Message groups removed${result && result.removed !== undefined ? ` (${fmt.num(result.removed)})` : ""}.`);
      } catch (e) { toast(e.message, true); }
    });
  }
})();
