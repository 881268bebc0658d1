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

  function value(id) { return document.getElementById(id).value.trim(); }
  function number(id) { const v = value(id); return v === "" ? 0 : Number(v); }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    result.textContent = ""; result.className = "";
    let destination = value("destination");
    if (!destination) { result.textContent = "Name a destination."; result.className = "error"; return; }
    const kind = destination.startsWith("topic://") ? "topics" : "queues";
    destination = destination.replace(/^(queue|topic):\/\//, "");
    const properties = {};
    for (const row of props.querySelectorAll("tr")) {
      const n = row.querySelector(".p-name").value.trim(); if (!n) continue;
      const raw = row.querySelector(".p-value").value; const type = row.querySelector(".p-type").value;
      properties[n] = type === "string" ? raw : type === "boolean" ? { type, value: raw === "true" } : { type, value: Number(raw) };
    }
    const envelope = { body: document.getElementById("body").value, priority: number("priority"), persistent: document.getElementById("persistent").checked };
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
