/* Node page: GET /api/v1/console/node every 2 s — Redis's facts, the broker's memory, the processes by
   their heartbeats (running, stopped, missing; a role with none running is listed as absent) and the
   maintenance tick with its recent failures. */
"use strict";
(function () {
  const { api, el, fill, fmt, latest } = window.SB;
  const EVERY_MS = 2000;
  const ROLE_NAMES = { web: "web (HTTP, WebSocket)", worker: "Celery worker", beat: "Celery beat", stomp: "STOMP listener" };
  const STATE_BADGE = { running: "good", stopped: "warn", missing: "bad", absent: "bad" };

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    const s = Math.max(0, Math.floor(ms / 1000));
    const d = Math.floor(s / 86400); const h = Math.floor((s % 86400) / 3600); const m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${s % 60}s`;
    return `${s}s`;
  }
  function set(selector, value, title) {
    const node = document.querySelector(selector);
    node.replaceChildren(value);
    if (title !== undefined) node.title = title;
  }
  function badge(state, text) { return el("span", { class: `badge ${STATE_BADGE[state] || ""}`, dataset: { state } }, text || state); }

  function showRedis(data) {
    const r = data.redis;
    if (r.status !== "ok") {
      set('[data-fact="server"]', badge("missing", "unreachable"), r.error);
      return;
    }
    set('[data-fact="server"]', `${r.server} ${r.version}`, `up ${duration(r.uptime_seconds * 1000)}`);
    set('[data-fact="memory"]', fmt.bytes(r.memory.used), `peak ${fmt.bytes(r.memory.peak)}, RSS ${fmt.bytes(r.memory.rss)}`);
    set('[data-fact="maxmemory"]', r.memory.max ? `${fmt.bytes(r.memory.max)} (${Math.round((100 * r.memory.used) / r.memory.max)}%)` : "no limit",
      `policy ${r.memory.policy}`);
    const b = data.broker_memory;
    set('[data-fact="broker_memory"]', `${fmt.bytes(b.used)} of ${fmt.bytes(b.limit)} (${b.percent}%)`,
      "Message bytes held, against the broker-wide memory limit of flow control ([systemUsage])");
    const t = data.temporary_destinations;
    set('[data-fact="temporary_deleted"]', `${fmt.num(t.deleted)} destinations, ${fmt.num(t.deleted_messages)} messages`,
      "Temporary destinations deleted because the STOMP connection that made them ended, with the messages they held");
    set('[data-fact="clients"]', fmt.num(r.clients.connected), `${r.clients.blocked} blocked, at most ${r.clients.max}`);
    set('[data-fact="ops"]', fmt.num(r.ops_per_second));
    const aof = r.aof;
    set('[data-fact="aof"]', aof.enabled ? `on, appendfsync ${aof.appendfsync || "?"}${aof.rewrite_in_progress ? ", rewriting" : ""}` : badge("stopped", "off"),
      `size ${fmt.bytes(aof.current_size)}; last rewrite ${aof.last_rewrite_status}`);
    set('[data-fact="aof_write"]', aof.enabled ? badge(aof.last_write_status === "ok" ? "running" : "missing", aof.last_write_status) : "–");
    set('[data-fact="fsync"]', aof.enabled ? `${fmt.num(aof.delayed_fsync)} (${fmt.num(aof.pending_fsync)} pending)` : "–");
  }

  function showProcesses(data) {
    const tbody = document.querySelector("#processes tbody");
    if (!data.processes) { fill(tbody, [], 7, "Unknown: Redis, which holds the heartbeats, does not answer."); return; }
    const rows = data.processes.map((p) => el("tr", { dataset: { role: p.role, state: p.state } },
      el("th", { scope: "row" }, ROLE_NAMES[p.role] || p.role),
      el("td", {}, badge(p.state)),
      el("td", {}, p.host), el("td", { class: "num" }, String(p.pid)), el("td", {}, p.name || "–"),
      el("td", { class: "num" }, p.state === "running" ? duration(p.uptime_ms) : `ran ${duration(p.uptime_ms)}`),
      el("td", {}, fmt.ago(p.last_seen))));
    for (const role of data.absent) {
      rows.push(el("tr", { dataset: { role, state: "absent" } },
        el("th", { scope: "row" }, ROLE_NAMES[role] || role), el("td", {}, badge("absent", "none running")),
        el("td", { colspan: 5, class: "empty" }, `No ${ROLE_NAMES[role] || role} has sent a heartbeat in the last ${data.missing_after_seconds} s.`)));
    }
    fill(tbody, rows, 7, "No process has sent a heartbeat.");
    document.getElementById("processes-note").textContent =
      `Each process writes a heartbeat every ${data.heartbeat_seconds} s; one silent for ${data.missing_after_seconds} s is missing (killed, its host lost, or cut off from Redis); one that ended in order is stopped. Both stay listed for 10 minutes.${
        data.redis.near_maxmemory ? " Redis is at (or within 5% of) its maxmemory, where it refuses writes, a heartbeat's too: processes that run may read missing." : ""}`;
  }

  function showTick(data) {
    const t = data.maintenance || {};
    set('[data-tick="status"]', badge(t.status === "ok" ? "running" : "missing", t.status === "ok" ? "alive" : "stale"));
    set('[data-tick="age"]', t.last_tick ? fmt.ago(t.last_tick) : "never", t.last_tick ? fmt.time(t.last_tick) : "");
    set('[data-tick="duration"]', t.duration_ms !== undefined ? `${fmt.num(t.duration_ms)} ms` : "–");
    set('[data-tick="destinations"]', fmt.num(t.destinations));
    set('[data-tick="errors"]', fmt.num(t.errors));
    const problem = document.getElementById("tick-problem");
    problem.hidden = !t.error; problem.textContent = t.error || "";
    const list = document.getElementById("recent-errors");
    const errors = data.recent_errors || [];
    list.replaceChildren(...(errors.length ? errors.map((e) => el("li", {}, el("time", {}, fmt.time(e.ts)), " ", e.error))
      : [el("li", { class: "empty" }, data.recent_errors ? "None recorded." : "Unknown (Redis does not answer).")]));
  }

  const load = latest(async () => {
    try {
      const data = await api("GET", "console/node");
      document.getElementById("node-error").hidden = true;
      return data;
    } catch (e) {
      const box = document.getElementById("node-error");
      box.hidden = false; box.textContent = `Could not read the node's health: ${e.message}`;
      throw e;
    }
  }, (data) => {
    showRedis(data); showProcesses(data); showTick(data);
    document.getElementById("node-updated").textContent = `Read ${fmt.time(data.now)}.`;
  });
  load();
  setInterval(load, EVERY_MS);
})();
