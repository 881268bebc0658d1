/* Send: ActiveMQ's send page fields, posted to POST /api/v1/queues/<q>/messages as one batch. */
"use strict";
(function () {
  const { api, el, fmt, toast, live } = window.SB;
  const form = document.getElementById("send-form");
  const props = document.querySelector("#props tbody");
  const result = document.getElementById("send-result");

  function addProp() {
    const row = el("tr", {},
      el("td", {}, el("input", { "aria-label": "Property name", class: "p-name" })),
      el("td", {}, el("input", { "aria-label": "Property value", class: "p-value" })),
      el("td", {}, el("select", { "aria-label": "Property type", class: "p-type" }, ...["string", "int", "long", "double", "boolean"].map((t) => el("option", {}, t)))),
      el("td", {}, el("button", { type: "button", class: "small secondary", onclick: () => row.remove() }, "Remove")));
    props.append(row);
    row.querySelector("input").focus();
  }
  document.getElementById("add-prop").addEventListener("click", addProp);

  // Edit distance (Levenshtein), for the names close to one that does not exist: a typo's likely target.
  function distance(a, b) {
    let row = Array.from({ length: b.length + 1 }, (_, j) => j);
    for (let i = 1; i <= a.length; i++) {
      const next = [i];
      for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
      row = next;
    }
    return row[b.length];
  }

  // Existing names close to `name`: those sharing its first or last three characters (the list's search,
  // server-side, so any number of destinations), ranked by edit distance, at most 3.
  async function closeNames(kind, name) {
    const found = new Set();
    for (const part of new Set([name.slice(0, 3), name.slice(-3)])) {
      try {
        const page = await api("GET", `destinations?${new URLSearchParams({ kind: kind === "topics" ? "topic" : "queue", search: part, ordering: "name", limit: 1000 })}`);
        for (const d of page.results) found.add(d.name);
      } catch (e) { /* suggestions are a help, not a condition */ }
    }
    const limit = name.length < 5 ? 1 : 2; // a typo: a letter wrong, missing, extra, or two swapped
    return [...found].map((n) => [distance(name.toLowerCase(), n.toLowerCase()), n]).filter(([d]) => d <= limit)
      .sort((a, b) => a[0] - b[0] || a[1].localeCompare(b[1])).slice(0, 3).map(([, n]) => n);
  }

  // Sending to a name that does not exist creates it (as ActiveMQ does): ask first, naming close existing
  // ones. True to go on.
  async function confirmNew(kind, name) {
    try { await api("GET", `${kind}/${encodeURIComponent(name)}`); return true; } catch (e) { if (e.status !== 404) return true; }
    const scheme = kind === "topics" ? "topic://" : "queue://";
    const close = await closeNames(kind, name);
    const hint = close.length ? ` Did you mean ${close.map((n) => scheme + n).join(", ")}?` : "";
    if (await window.SB.confirm(`${scheme}${name} does not exist: sending creates it.${hint}`, "Create and send")) return true;
    result.replaceChildren(`Not sent: ${scheme}${name} does not exist.`, ...close.map((n) => el("button", {
      type: "button", class: "small suggestion", onclick: () => { document.getElementById("destination").value = scheme + n; result.textContent = ""; document.getElementById("destination").focus(); },
    }, `Use ${scheme}${n}`)));
    return false;
  }

  function value(id) { return document.getElementById(id).value.trim(); }
  function number(id) { const v = value(id); return v === "" ? 0 : Number(v); }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    result.textContent = ""; result.className = "";
    let destination = value("destination");
    if (!destination) { result.textContent = "Name a destination."; result.className = "error"; return; }
    const kind = destination.startsWith("topic://") ? "topics" : "queues";
    destination = destination.replace(/^(queue|topic):\/\//, "");
    if (!(await confirmNew(kind, destination))) return;
    const properties = {};
    for (const row of props.querySelectorAll("tr")) {
      const n = row.querySelector(".p-name").value.trim(); if (!n) continue;
      const raw = row.querySelector(".p-value").value; const type = row.querySelector(".p-type").value;
      properties[n] = type === "string" ? raw : type === "boolean" ? { type, value: raw === "true" } : { type, value: Number(raw) };
    }
    const envelope = { body: document.getElementById("body").value, persistent: document.getElementById("persistent").checked };
    // left empty: no priority given (the API's default, JMS's 4), not 0, the lowest
    if (value("priority") !== "") envelope.priority = number("priority");
    for (const f of ["correlation_id", "reply_to", "type", "group_id"]) if (value(f)) envelope[f] = value(f);
    if (number("group_seq")) envelope.group_seq = number("group_seq");
    if (number("ttl")) envelope.ttl = number("ttl");
    if (number("delay")) envelope.delay = number("delay");
    if (number("period")) envelope.period = number("period");
    if (number("repeat")) envelope.repeat = number("repeat");
    const count = Math.max(1, number("count") || 1);
    const header = value("count_header") || "JMSXMessageNumber";
    const button = document.getElementById("send-button"); button.disabled = true;
    let sent = 0;
    try {
      for (let start = 0; start < count; start += 1000) { // the API takes batches of up to 1000
        const n = Math.min(1000, count - start);
        const messages = Array.from({ length: n }, (_, i) => ({ ...envelope, properties: count > 1 ? { ...properties, [header]: { type: "int", value: start + i + 1 } } : properties }));
        const reply = await api("POST", `${kind}/${encodeURIComponent(destination)}/messages`, { messages });
        sent += reply.message_ids.length;
        result.textContent = `Sending… ${fmt.num(sent)} of ${fmt.num(count)}`;
      }
      result.textContent = `Sent ${fmt.num(sent)} message${sent === 1 ? "" : "s"} to ${destination}.`;
      toast(result.textContent);
    } catch (e) {
      result.textContent = `Not sent${sent ? ` after ${fmt.num(sent)}` : ""}: ${e.message}`;
      result.className = "error";
    } finally { button.disabled = false; }
  });
  live("", () => {});
})();
