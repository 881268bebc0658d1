/* The console's shared pieces: API calls (session + CSRF), confirmation and progress dialogs, the live
   WebSocket with its connection indicator, DOM and number helpers.
   No framework: every page script (overview.js, queue.js, ...) builds on window.SB. */
"use strict";
(function () {
  const body = document.body;
  const API = body.dataset.api || "/api/v1";
  const feeds = [];
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem || {};
    }
  }

  /* The server's clock as this browser sees it: relative times ("in 24s", "2 min ago") compare the server's
     timestamps with the server's now, not with a workstation clock that may be minutes off (which made a
     lease due in two minutes read "8 min ago"). Every feed message's `ts` (ms) sets it; until the first
     one, an API answer's Date header (whole seconds: its middle). */
  const serverClock = {
    skew: 0, precise: false, samples: [],
    // a message read late (a busy page) gives too small a skew: the largest of the last 20 is the closest
    fromFeed(ts) {
      if (typeof ts !== "number") return;
      this.samples.push(ts - Date.now());
      if (this.samples.length > 20) this.samples.shift();
      this.skew = Math.max(...this.samples); this.precise = true;
    },
    fromDate(header) {
      const at = header ? Date.parse(header) : NaN;
      if (!this.precise && !Number.isNaN(at)) this.skew = at + 500 - Date.now();
    },
    now() { return Date.now() + this.skew; },
  };

  /* When the figures on the page were last brought up to date, on the server's clock (0: not yet): by a
     feed message with figures, or by an API answer to a GET (a page's first figures come from one; the
     banner's "last update" names it when the feed has sent none since). */
  let lastUpdate = 0;

  async function api(method, path, data) {
    const options = { method, headers: { Accept: "application/json" }, credentials: "same-origin" };
    if (method !== "GET") options.headers["X-CSRFToken"] = csrf;
    if (data !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(data);
    }
    // Logged out: no more calls that can only fail (the log-in prompt is up).
    if (session.ended) throw new ApiError(401, { detail: "Your session has ended: log in again." });
    let response;
    try {
      response = await fetch(path.startsWith("/") ? path : `${API}/${path}`, options);
    } catch (error) {
      // The request got no answer (network down, server gone, connection reset): a problem like the API's,
      // so every caller can read e.problem, and words that say what is known — a change may or may not
      // have been made — rather than the browser's "Failed to fetch".
      throw new ApiError(0, { code: "network_error", detail: method === "GET"
        ? "The request did not reach the server (network error); the figures shown may be out of date."
        : "The request did not reach the server (network error), or its answer was lost: it may or may not have been carried out. Reload to see." });
    }
    serverClock.fromDate(response.headers.get("Date"));
    // A console JSON view (login_required) sends the logged-out to the login page rather than a 401.
    if (response.redirected && new URL(response.url).pathname === (body.dataset.login || "/console/login/")) {
      session.end();
      throw new ApiError(401, { detail: "Your session has ended: log in again." });
    }
    if (response.status === 204) return null;
    let payload = null;
    try { payload = await response.json(); } catch (e) { payload = null; }
    if (!response.ok) {
      if (loggedOut(response.status, payload)) session.end();
      throw new ApiError(response.status, payload);
    }
    if (method === "GET") lastUpdate = serverClock.now();
    return payload;
  }

  /* 401: no session (logged out in another tab, expired). 403 "CSRF Failed": the page's CSRF token is of a
     session that has ended (a log-in elsewhere rotated it). Any other 403 is a permission refusal. */
  function loggedOut(status, problem) {
    return status === 401 || (status === 403 && /^CSRF Failed/.test((problem && problem.detail) || ""));
  }

  /* The session ended: stop the live feeds and every further call, and ask to log in again; the login
     page returns here (next=) afterwards. Modal, so nothing else on the page can be tried meanwhile. */
  const session = {
    ended: false,
    end() {
      if (session.ended) return;
      session.ended = true;
      for (const feed of feeds) feed.close();
      const indicator = document.getElementById("live");
      indicator.dataset.state = "signed-out";
      indicator.querySelector(".label").textContent = "Logged out";
      indicator.title = "";
      const stale = document.getElementById("feed-banner");
      if (stale) stale.hidden = true; // the prompt says why nothing updates
      const next = location.pathname + location.search + location.hash;
      const login = `${body.dataset.login || "/console/login/"}?next=${encodeURIComponent(next)}`;
      const dialog = el("dialog", { id: "session-ended", "aria-labelledby": "session-ended-title" },
        el("h2", { id: "session-ended-title" }, "Your session has ended"),
        el("p", {}, "You were logged out (in another tab or window, or the session expired). What this page shows has stopped updating."),
        el("div", { class: "buttons" }, el("a", { class: "button", href: login, autofocus: true }, "Log in again")));
      dialog.addEventListener("cancel", (event) => event.preventDefault()); // Escape would leave it stale
      document.body.append(dialog);
      dialog.showModal();
    },
  };

  function queuePath(name) { return `queues/${encodeURIComponent(name)}`; }

  /* el("td", {class: "num"}, "12") — text children are text nodes, never HTML. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /* A live table is rebuilt whole on each update; the keyboard's place must survive it: a control focused
     in it (a button, a link) is focused again in the new row with the same key (its data-* attributes;
     the same position when it has none), at the same place among the row's controls. */
  const FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";
  const rowKey = (tr) => JSON.stringify(Object.entries(tr.dataset));
  function fill(tbody, rows, columns, emptyText) {
    const focused = document.activeElement;
    const tr = focused && focused !== tbody && tbody.contains(focused) ? focused.closest("tr") : null;
    const was = tr && { key: rowKey(tr), row: [...tbody.rows].indexOf(tr), at: [...tr.querySelectorAll(FOCUSABLE)].indexOf(focused) };
    tbody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: columns, class: "empty" }, emptyText))]));
    if (!was || was.at < 0) return;
    const now = was.key !== "[]" ? [...tbody.rows].find((r) => rowKey(r) === was.key) : tbody.rows[was.row];
    const target = now && now.querySelectorAll(FOCUSABLE)[was.at];
    if (target) target.focus({ preventScroll: true });
  }

  const fmt = {
    num(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); },
    rate(n) { return n === null || n === undefined ? "–" : (n >= 100 ? Math.round(n).toLocaleString("en-US") : Number(n).toFixed(1)); },
    bytes(n) {
      if (!n && n !== 0) return "–";
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let i = 0; let v = n;
      while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
      return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
    },
    time(ms) { return ms ? new Date(Number(ms)).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "–"; },
    ago(ms) {
      if (!ms) return "–";
      const s = Math.round((serverClock.now() - Number(ms)) / 1000);
      if (Math.abs(s) < 60) return s >= 0 ? `${s}s ago` : `in ${-s}s`;
      const m = Math.round(s / 60);
      if (Math.abs(m) < 60) return m >= 0 ? `${m} min ago` : `in ${-m} min`;
      return fmt.time(ms);
    },
  };

  /* A relative time as an element that counts on by itself (every second): a table read again only on
     events (the message groups) would otherwise say "3s ago" an hour later. */
  function ago(ms) {
    if (!ms) return "–";
    return el("time", { datetime: new Date(Number(ms)).toISOString(), title: fmt.time(ms), dataset: { ago: ms } }, fmt.ago(ms));
  }
  setInterval(() => {
    for (const node of document.querySelectorAll("time[data-ago]")) {
      const text = fmt.ago(node.dataset.ago);
      if (node.textContent !== text) node.textContent = text;
    }
  }, 1000);

  function toast(text, bad) {
    if (bad && session.ended) return; // the failure is the ended session: the log-in prompt says so
    const box = document.getElementById("toast");
    box.textContent = text;
    box.className = bad ? "bad" : "";
    box.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { box.hidden = true; }, bad ? 8000 : 4000);
  }

  /* A toast for the next page: an action that leaves the page (a deletion) keeps its result in sight. */
  const NEXT_TOAST = "sb:toast";
  function toastNext(text) {
    try { sessionStorage.setItem(NEXT_TOAST, text); } catch (e) { /* storage refused: no toast */ }
  }
  function toastLeft() {
    let text = null;
    try { text = sessionStorage.getItem(NEXT_TOAST); sessionStorage.removeItem(NEXT_TOAST); } catch (e) { return; }
    if (text) toast(text);
  }

  /* A loader whose calls may overlap (a live update and an action's refresh, a filter changed while the
     page's first load is under way): load() fetches, show(data) renders, and only the call started last
     renders, so an older answer arriving later cannot put back what an action has just changed or rows of
     a filter no longer chosen. A failed fetch renders nothing but failed(error), the last call's only. */
  function latest(load, show, failed = () => {}) {
    let seq = 0;
    return async () => {
      const mine = ++seq;
      let data;
      try { data = await load(); } catch (e) { if (mine === seq) failed(e); return; }
      if (mine === seq) show(data);
    };
  }

  /* Every administrative action asks first. Resolves true when confirmed.
     The dialog's close event is a queued task, and a key press outranks it: Escape then Enter can show the
     dialog again before the first close event arrives. So the question still waiting is answered when the
     next one is asked (the dialog is closed by then and its returnValue is that answer), and a close event
     that finds the dialog open again is a stale one, not this question's answer. */
  let answer = null; // the question waiting for the dialog's close event: (confirmed) => void
  function confirmAction(text, okLabel) {
    const dialog = document.getElementById("confirm");
    if (dialog.open) return Promise.resolve(false); // already asking (a second click): not confirmed
    if (answer) answer(dialog.returnValue === "ok");
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-ok").textContent = okLabel || "Confirm";
    dialog.returnValue = "";
    return new Promise((resolve) => {
      const closed = () => { if (!dialog.open) settle(dialog.returnValue === "ok"); };
      const settle = (confirmed) => {
        dialog.removeEventListener("close", closed);
        answer = null;
        resolve(confirmed);
      };
      answer = settle;
      dialog.addEventListener("close", closed);
      dialog.showModal();
    });
  }

  function progress(title) {
    const dialog = document.getElementById("progress");
    const bar = document.getElementById("progress-bar");
    const text = document.getElementById("progress-text");
    document.getElementById("progress-title").textContent = title;
    bar.removeAttribute("value");
    text.textContent = "";
    dialog.showModal();
    return {
      update(done, total, note) {
        if (total) { bar.max = total; bar.value = Math.min(done, total); } else bar.removeAttribute("value");
        text.textContent = note || (total ? `${fmt.num(done)} of ${fmt.num(total)}` : `${fmt.num(done)} done`);
      },
      close() { dialog.close(); },
    };
  }

  /* A long call with a progress dialog; poll() (optional) says {done, total} while it runs. */
  async function tracked(title, call, poll) {
    const bar = progress(title);
    let running = true;
    (async () => {
      while (running && poll) {
        try { const s = await poll(); if (s && running) bar.update(s.done, s.total); } catch (e) { /* keep going */ }
        await new Promise((r) => setTimeout(r, 400));
      }
    })();
    try { return await call(bar); } finally { running = false; bar.close(); }
  }

  /* Runs an administrative API call after confirmation; reports the outcome. */
  async function act(text, okLabel, run) {
    if (!(await confirmAction(text, okLabel))) return null;
    try {
      const result = await run();
      return result === undefined ? {} : (result || {});
    } catch (error) {
      toast(error.message, true);
      return null;
    }
  }

  /* The live feed. Reconnects with back-off; the header's indicator says whether it is connected, whether
     the broker's store answers (the server's `status` message, every half second) and whether updates stopped
     coming at all (stale after STALE_MS of silence). */
  // The server's status arrives every half second: two seconds of silence (checked every STALE_CHECK_MS) is
  // a stalled server, shown within STALE_MS + STALE_CHECK_MS = 2 s of the last message.
  const STALE_MS = 1750; const STALE_CHECK_MS = 250;
  const SESSION_EXPIRED = 4401; // the feed's close code when the session has ended (gateway/ws/events.py)
  function live(query, onMessage, onOpen) {
    const indicator = document.getElementById("live");
    const label = indicator.querySelector(".label");
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${body.dataset.events}${query ? `?${query}` : ""}`;
    // lastMessage: when any message came (the staleness check), on the monotonic clock (performance.now():
    // a step of the wall clock must not make the feed read stale, nor hide a stall); lastUpdate (above):
    // the last one with figures (the banner's "last update": the status messages keep coming while the
    // broker is unavailable, the figures do not)
    let socket = null; let delay = 500; let closedByUs = false; let lastMessage = 0;
    const state = (name, text) => { indicator.dataset.state = name; label.textContent = text; banner(name, lastUpdate); };
    setInterval(() => {
      if (socket && socket.readyState === WebSocket.OPEN && performance.now() - lastMessage > STALE_MS
          && indicator.dataset.state === "connected") {
        state("stale", "Stale — no updates");
      }
    }, STALE_CHECK_MS);
    function connect() {
      if (session.ended) return;
      socket = new WebSocket(url);
      socket.addEventListener("open", () => {
        delay = 500; lastMessage = performance.now(); state("connected", "Live");
        if (onOpen) onOpen(handle);
      });
      socket.addEventListener("message", (event) => {
        lastMessage = performance.now();
        let data; try { data = JSON.parse(event.data); } catch (e) { return; }
        serverClock.fromFeed(data.ts);
        if (data.type === "status") {
          if (data.session === "expired") { session.end(); return; }
          if (data.broker === "unavailable") state("unavailable", "Broker unavailable");
          else state("connected", "Live");
          indicator.title = data.detail || "";
          return;
        }
        if (data.type !== "error") lastUpdate = data.ts || serverClock.now();  // (the server's time, as every time shown)
        if (indicator.dataset.state === "stale") state("connected", "Live");
        if (data.type === "error") toast(data.detail, true);
        onMessage(data);
      });
      socket.addEventListener("close", (event) => {
        if (event.code === SESSION_EXPIRED) session.end();
        if (closedByUs || session.ended) return;
        state("disconnected", "Disconnected — reconnecting");
        setTimeout(connect, delay);
        delay = Math.min(delay * 2, 10000);
      });
    }
    const handle = {
      send(obj) { if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(obj)); },
      close() { closedByUs = true; if (socket) socket.close(); },
      get socket() { return socket; },
    };
    window.addEventListener("beforeunload", () => { closedByUs = true; });
    connect();
    feeds.push(handle);
    return handle;
  }

  /* Under the header, a banner says what the indicator says when the figures have stopped updating
     (broker unavailable, stale, disconnected), and since when; gone again when the feed is live. */
  const BANNER = {
    unavailable: "Broker unavailable: Redis does not answer. The figures below are not updating",
    stale: "Stale: no updates from the server. The figures below are not updating",
    disconnected: "Disconnected from the server, reconnecting. The figures below are not updating",
  };
  function banner(name, since) {
    let node = document.getElementById("feed-banner");
    if (!BANNER[name]) { if (node) node.hidden = true; return; }
    if (!node) {
      node = el("p", { id: "feed-banner", class: "feed-banner", role: "alert" });
      document.getElementById("main").prepend(node);
    }
    node.dataset.state = name;
    // (in UTC, as every time in the console; written only when it changes: the node is an alert, and a
    // screen reader may announce every change)
    const text = `${BANNER[name]}${since ? ` (last update ${fmt.time(since)})` : ""}.`;
    if (node.textContent !== text) node.textContent = text;
    node.hidden = false;
  }

  /* The page's destination deleted while the page is open (its statistics come back empty): the page
     blanks its figures and says so here, in words that stay (a toast goes after a few seconds and left
     the last figures reading as live), until the destination exists again: gone(null). */
  function gone(text) {
    let node = document.getElementById("gone");
    if (!text) { if (node) node.hidden = true; return; }
    if (!node) {
      node = el("p", { id: "gone", class: "feed-banner", role: "alert" });
      document.getElementById("main").prepend(node);
    }
    if (node.textContent !== text) node.textContent = text;
    node.hidden = false;
  }

  /* Rates from cumulative counters: rate(counters) gives per-second deltas since the previous call. */
  function rateTracker(names) {
    let last = null;
    return function (counters, ts) {
      const now = ts || Date.now();
      let out = null;
      if (last && now > last.ts) {
        out = {};
        for (const n of names) out[n] = Math.max(0, (counters[n] - last.values[n]) / ((now - last.ts) / 1000));
      }
      last = { ts: now, values: Object.fromEntries(names.map((n) => [n, counters[n]])) };
      return out;
    };
  }

  function meter(value, max, full) {
    const pct = max > 0 ? Math.min(100, (100 * value) / max) : 0;
    return el("span", { class: `meter${full ? " full" : ""}`, role: "meter", "aria-valuemin": 0, "aria-valuemax": max, "aria-valuenow": value,
      "aria-label": `${value} of ${max}` },
    el("span", { class: "track" }, el("span", { class: "fill", style: `width:${pct}%` })),
    el("span", { class: "meter-text" }, `${fmt.num(value)} / ${fmt.num(max)}`));
  }

  /* Consumers named as people know them: the client id, else the connection id, with the consumer id on
     hover (ids such as ws-9cd018b8d11343b5-1 mean nothing to a reader). learn() takes consumers as the API
     gives them (consumer_id, client_id, connection_id, added); node(id) is the name as an element. Two
     consumers of one client are told apart by their order of attaching (#1, #2). An id never learned
     (a consumer gone before the page saw it) is shown as it is. */
  const who = {
    known: new Map(),
    learn(consumers) {
      for (const c of consumers || []) {
        if (!c || !c.consumer_id) continue;
        this.known.set(c.consumer_id, { client: c.client_id || null, connection: c.connection_id || null, added: c.added || 0 });
      }
    },
    label(id) {
      const k = this.known.get(id);
      const base = k && (k.client || k.connection);
      if (!base) return id;
      const same = [...this.known.entries()].filter(([, o]) => (o.client || o.connection) === base)
        .sort((a, b) => a[1].added - b[1].added || (a[0] < b[0] ? -1 : 1));
      return same.length > 1 ? `${base} #${same.findIndex(([i]) => i === id) + 1}` : base;
    },
    node(id) {
      if (!id) return "–";
      const k = this.known.get(id);
      const title = k && k.connection && k.client ? `${id} (connection ${k.connection})` : id;
      return el("span", { class: "who-is", title, dataset: { consumer: id } }, this.label(id));
    },
  };

  function page() { const node = document.getElementById("page"); return node ? node.dataset : {}; }

  // A destination's "Recent events" list: newest first, the last 100 kept; returns the function that
  // adds a batch of events as the live feed delivers them.
  // Consumers in events (consumer=, owner=, ...) are named by `who`.
  const CONSUMER_FIELDS = new Set(["consumer", "owner", "previous", "from", "to"]);
  function eventLog(list) {
    return function show(recent) {
      for (const e of recent) {
        const { type, ts, id, ...rest } = e;
        const detail = Object.entries(rest).flatMap(([k, v]) => [" ", `${k}=`, CONSUMER_FIELDS.has(k) && who.known.has(v) ? who.node(v) : String(v)]);
        list.prepend(el("li", {}, `${fmt.time(Number(ts))} ${type}`, ...detail));
      }
      while (list.children.length > 100) list.lastChild.remove();
    };
  }

  // A page without a feed of its own (browse, message, routing, analytics, ...) still opens one, for the
  // header's indicator alone: it says whether the console's connection is up and the broker answers,
  // rather than "Connecting…" for ever.
  window.addEventListener("load", () => { if (!feeds.length) live("", () => {}); });
  toastLeft();

  window.SB = { api, ApiError, session, queuePath, el, fill, fmt, ago, toast, toastNext, gone, confirm: confirmAction, progress, tracked, act, live, latest, rateTracker, meter, page, feeds, eventLog, who };
})();
