/* Rate charts (queue, topic and overview pages): the server's rate history (GET .../rates?range=, from
   broker_core/rates.py, so a chart opened now shows the past), drawn with uPlot (npm package, served from
   /static/vendor/uplot/): a UTC time axis, round ticks, ranges of 5 min, 1 h and 24 h, a tooltip, one
   series per kind of movement, and the operator's operations (purge, move, ...) as marks with who and
   how many, not as a rate. Without uPlot the figure says so and shows the latest rates as text.
   Usage: SB.rateChart(figure, "console/queues/<name>/rates"). SB.chartOptions gives other time charts
   (analytics.js) the same look. */
"use strict";
(function () {
  const { api, el, fmt } = window.SB;
  const SERIES = [
    { key: "enqueued", label: "enqueued", color: "--rate-enqueued" },
    { key: "dispatched", label: "dispatched", color: "--rate-dispatched" },
    { key: "acked", label: "acked", color: "--rate-acked" },
    { key: "redelivered", label: "redelivered", color: "--rate-redelivered" },
    { key: "expired", label: "expired", color: "--rate-expired" },
    { key: "deadlettered", label: "dead-lettered", color: "--rate-deadlettered" },
    // dropped without delivery or a dead-letter queue: a topic's evictions and pending-limit drops, dead
    // letters discarded (null before the server first sampled it for this destination: drawn as a gap)
    { key: "discarded", label: "discarded", color: "--rate-discarded" },
  ];
  const RANGES = [["5m", "5 min"], ["1h", "1 h"], ["24h", "24 h"]];
  const REFRESH_MS = { "5m": 5000, "1h": 5000, "24h": 60000 };
  const ACTION_LABEL = { purge: "purge", move_message: "move", move_matching: "move", remove_message: "remove", remove_matching: "remove",
    retry_message: "retry", retry_matching: "retry" };
  const HEIGHT = 220;
  // Every destination is sampled each 5 s pass (a pass over 10,000 takes a few ticks): a last sample
  // older than this means the maintenance tick has stopped.
  const SAMPLES_STALE_MS = 30_000;

  // The smallest 1, 2 or 5 x 10^n at or above v: the top of the y axis, so its ticks are round.
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 5, 10]) if (m * p >= v * (1 - 1e-9)) return m * p;
    return 10 * p;
  }
  // The y axis' tick steps: 1, 2 and 5 x 10^n only (uPlot's own list has 2.5, giving 0, 2.5, 5, 7.5, 10).
  const ROUND_STEPS = [];
  for (let e = -4; e <= 9; e++) for (const m of [1, 2, 5]) ROUND_STEPS.push(Number((m * 10 ** e).toPrecision(1)));
  // A tick's text: whole thousands grouped, small rates with the decimals they need (0.02, not 0.0).
  const tickText = (v) => (v >= 100 ? fmt.rate(v) : String(Number(v.toFixed(6))));
  // A legend's rate: as fmt.rate, but one message a minute reads 0.017, not 0.0.
  const rateText = (v) => (v > 0 && v < 0.05 ? String(Number(v.toPrecision(2))) : fmt.rate(v));
  const utc = (ms) => new Date(ms).toISOString().slice(11, 19);
  // The time axis in UTC (as every time in the console), 24-hour: HH:MM, HH:MM:SS below a minute's
  // spacing, MM-DD at a day's; uPlot chose the spacing (`incr`, s) from its round steps.
  function timeTicks(u, splits, axis, space, incr) {
    return splits.map((s) => {
      const iso = new Date(s * 1000).toISOString();
      if (incr >= 86400) return iso.slice(5, 10);
      return incr < 60 ? iso.slice(11, 19) : iso.slice(11, 16);
    });
  }
  function describe(e) {
    const what = ACTION_LABEL[e.action] || e.action;
    const count = e.count === null || e.count === undefined ? "" : ` ${fmt.num(e.count)} message${e.count === 1 ? "" : "s"}`;
    const where = e.target && e.target !== e.destination ? ` ${e.destination} → ${e.target}` : ` ${e.destination}`;
    return `${what}${count} by ${e.user || "unknown"} —${where}`;
  }

  const css = () => getComputedStyle(document.documentElement);

  /* uPlot options in the console's look, for every time chart of the console (the rate charts below and
     the analytics page's throughput): UTC time axis, messages/s from 0 to a round top, the series'
     colours from CSS variables (both themes), a live legend. series: [{label, color}] (per second);
     extra: {xRange, hooks, time(ms) for the legend's time}. */
  function chartOptions(plot, series, extra = {}) {
    const c = css();
    const muted = c.getPropertyValue("--muted").trim(); const line = c.getPropertyValue("--line").trim();
    const axis = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 }, font: "11px system-ui" };
    const time = extra.time || ((ms) => utc(ms));
    const x = { time: true };
    if (extra.xRange) x.range = extra.xRange;
    return {
      width: Math.max(300, plot.clientWidth), height: HEIGHT,
      tzDate: (ts) => window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),  // (the legend's, the cursor's)
      scales: { x, y: { range: (u, min, max) => [0, niceCeil(max)] } },
      axes: [
        { ...axis, label: "time (UTC)", labelSize: 18, labelFont: "11px system-ui", values: timeTicks },
        { ...axis, size: 56, label: "messages/s", labelSize: 18, labelFont: "11px system-ui", incrs: ROUND_STEPS,
          values: (u, splits) => splits.map(tickText) },
      ],
      series: [
        { label: "time (UTC)", value: (u, v) => (v === null || v === undefined ? "–" : time(v * 1000)) },
        ...series.map((s) => ({ label: `${s.label}/s`, stroke: c.getPropertyValue(s.color).trim(), width: 2,
          points: { show: false }, spanGaps: false, value: (u, v) => (v === null || v === undefined ? "–" : rateText(v)) })),
      ],
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false }, points: { size: 6 } },
      hooks: extra.hooks || {},
    };
  }

  // What a chart's place says when uPlot is not installed; `then` says where the figures are instead.
  function chartMissing(then) {
    return el("p", { class: "chart-missing" },
      "The chart needs uPlot (npm package uplot), which is not installed here: run ",
      el("code", {}, "npm ci"), " in the installation folder (./signalbox.sh does it when npm is installed). ", then);
  }

  function rateChart(figure, path) {
    const buttons = RANGES.map(([key, label]) => el("button", { type: "button", class: "small secondary",
      dataset: { range: key }, "aria-pressed": "false", onclick: () => show(key) }, label));
    const plot = el("div", { class: "rate-plot" });
    const tip = el("div", { class: "rate-tip", role: "tooltip", hidden: true });
    const now = el("p", { class: "rate-now", "aria-live": "off" });
    const marks = el("ul", { class: "rate-marks", "aria-label": "Operations in this range" });
    figure.replaceChildren(el("div", { class: "toolbar rate-ranges", role: "group", "aria-label": "Time range" }, ...buttons),
      plot, now, marks);
    figure.classList.add("rate-chart");

    let range = "5m"; let data = null; let chart = null; let timer = null; let seq = 0;

    function options() {
      // x runs to now: a mark made since the last step's start is drawn at the right edge
      return chartOptions(plot, SERIES, { xRange: (u, min, max) => [min, Math.max(max, data.now / 1000)],
        hooks: { draw: [drawMarks], setCursor: [tooltip] } });
    }

    function columns() {
      return [data.times.map((t) => t / 1000), ...SERIES.map((s) => data.rates[s.key])];
    }

    // The operator's operations: a dashed line at their time across the plot, labelled at the top.
    function drawMarks(u) {
      if (!data) return;
      const ctx = u.ctx; const c = css();
      const colour = c.getPropertyValue("--rate-mark").trim();
      const { left, top, width, height } = u.bbox;
      ctx.save();
      ctx.strokeStyle = colour; ctx.fillStyle = colour; ctx.lineWidth = Math.max(1, window.devicePixelRatio || 1);
      ctx.setLineDash([4 * (window.devicePixelRatio || 1), 3 * (window.devicePixelRatio || 1)]);
      ctx.font = `${Math.round(11 * (window.devicePixelRatio || 1))}px system-ui`;
      for (const e of data.events) {
        const x = Math.round(u.valToPos(e.at / 1000, "x", true));
        if (x < left || x > left + width) continue;
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
        ctx.fillText(ACTION_LABEL[e.action] || e.action, x + 3, top + 12 * (window.devicePixelRatio || 1));
      }
      ctx.restore();
    }

    function tooltip(u) {
      const i = u.cursor.idx;
      if (i === null || i === undefined || !data) { tip.hidden = true; return; }
      const t = data.times[i]; const step = data.resolution_ms;
      const rows = SERIES.map((s) => {
        const v = data.rates[s.key][i];
        return el("tr", {}, el("th", { scope: "row" }, el("span", { class: "swatch", style: `background:var(${s.color})` }), s.label),
          el("td", { class: "num" }, v === null || v === undefined ? "no sample" : `${fmt.rate(v)}/s`));
      });
      const near = data.events.filter((e) => Math.abs(e.at - t) <= step);
      tip.replaceChildren(el("div", { class: "rate-tip-time" }, `${utc(t)}–${utc(t + step)} UTC`),
        el("table", {}, el("tbody", {}, ...rows)),
        ...near.map((e) => el("div", { class: "rate-tip-mark" }, `${utc(e.at)} ${describe(e)}`)));
      tip.hidden = false;
      const x = u.cursor.left; const box = u.over.getBoundingClientRect();
      tip.style.left = `${Math.min(Math.max(0, x + 12), Math.max(0, box.width - tip.offsetWidth))}px`;
      tip.style.top = `${Math.max(0, (u.cursor.top || 0) - 10)}px`;
    }

    function render() {
      const latest = {};
      for (const s of SERIES) {
        const values = data.rates[s.key];
        for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) { latest[s.key] = values[i]; break; }
      }
      const rates_ = SERIES.map((s) => `${s.label} ${fmt.rate(latest[s.key])}/s`).join(", ");
      // (by the server's clock: the answer's `now`)
      const lag = data.sampled_until ? data.now - data.sampled_until : 0;
      if (!data.sampled_until) now.textContent = "No samples yet: the maintenance worker samples every 5 s.";
      else if (lag > SAMPLES_STALE_MS) {
        // the tick stopped (Celery beat or the workers): the last rates are not the rates now
        const ago = lag < 120_000 ? `${Math.round(lag / 1000)}s ago` : `${Math.round(lag / 60_000)} min ago`;
        now.textContent = `No samples since ${utc(data.sampled_until)} UTC (${ago}): the maintenance tick has stopped sampling (Celery beat or the workers are down), so the chart is not updating. The last sample: ${rates_}`;
      } else now.textContent = `latest (${utc(data.sampled_until)} UTC): ${rates_}`;
      now.dataset.state = lag > SAMPLES_STALE_MS ? "stale" : "";
      marks.replaceChildren(...data.events.map((e) => el("li", { dataset: { action: e.action } }, `${fmt.time(e.at)} ${describe(e)}`)));
      if (!window.uPlot) {
        plot.replaceChildren(chartMissing("The latest rates are below."));
        return;
      }
      if (!chart) {
        plot.replaceChildren();
        chart = new window.uPlot(options(), columns(), plot);
        chart.over.append(tip);
        chart.over.addEventListener("mouseleave", () => { tip.hidden = true; });
      } else {
        chart.setData(columns());
      }
      figure.uplot = chart; figure.rateData = data; figure.marks = data.events;  // (tests, the console's own)
      figure.dataset.loadedRange = data.range;
    }

    async function load() {
      const mine = ++seq;
      let answer;
      try { answer = await api("GET", `${path}?range=${range}`); } catch (e) { now.textContent = `Rates unavailable: ${e.message}`; return; }
      if (mine !== seq) return;
      data = answer;
      render();
    }

    function show(key) {
      range = key;
      for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.range === key));
      if (chart) { chart.destroy(); chart = null; }
      clearInterval(timer);
      timer = setInterval(load, REFRESH_MS[key]);
      load();
    }

    new ResizeObserver(() => { if (chart) chart.setSize({ width: Math.max(300, plot.clientWidth), height: HEIGHT }); }).observe(plot);
    matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => { if (chart) { chart.destroy(); chart = null; render(); } });
    document.addEventListener("sb:operation", () => load());  // a page's own purge or move: its mark now
    show(range);
    return { show, reload: load };
  }

  Object.assign(window.SB, { rateChart, chartOptions, chartMissing });
  // Every <figure data-rates="<API path>"> of the page gets its chart.
  for (const figure of document.querySelectorAll("figure[data-rates]")) rateChart(figure, figure.dataset.rates);
})();
