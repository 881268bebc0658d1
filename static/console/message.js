/* One message: headers, properties and the body as text, pretty JSON or hex; delete, move, copy, retry. */
"use strict";
(function () {
  const { api, el, fill, fmt, toast, act, queuePath, page } = window.SB;
  const P = page();
  const path = `${queuePath(P.name)}/messages/${encodeURIComponent(P.message)}`;
  let message = null; let view = "text";
  for (const b of document.querySelectorAll(".dlq-only")) b.hidden = P.dlq !== "1";

  function bytes(m) {
    if (m.body_base64) return Uint8Array.from(atob(m.body_base64), (c) => c.charCodeAt(0));
    return new TextEncoder().encode(m.body || "");
  }

  function hex(data) {
    const lines = [];
    for (let i = 0; i < data.length; i += 16) {
      const chunk = Array.from(data.slice(i, i + 16));
      const h = chunk.map((b) => b.toString(16).padStart(2, "0")).join(" ");
      const a = chunk.map((b) => (b >= 32 && b < 127 ? String.fromCharCode(b) : ".")).join("");
      lines.push(`${i.toString(16).padStart(8, "0")}  ${h.padEnd(47)}  ${a}`);
    }
    return lines.join("\n") || "(empty)";
  }

  function showBody() {
    const pre = document.getElementById("body");
    if (!message) return;
    if (view === "hex") pre.textContent = hex(bytes(message));
    else if (view === "json") {
      try { pre.textContent = JSON.stringify(JSON.parse(message.body_base64 ? new TextDecoder().decode(bytes(message)) : message.body), null, 2); } catch (e) { pre.textContent = `Not JSON: ${e.message}`; }
    } else pre.textContent = message.body_base64 ? `(binary, ${bytes(message).length} bytes: see Hex)` : message.body;
    for (const tab of document.querySelectorAll("[role=tab]")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  }

  function render(m) {
    const headers = [["Message id", m.message_id], ["Destination", m.destination], ["Original destination", m.original_destination], ["State", m.state + (m.consumer_id ? ` (consumer ${m.consumer_id})` : "")],
      ["Timestamp", fmt.time(m.timestamp)], ["Priority", m.priority], ["Persistent", m.persistent ? "yes" : "no"],
      ["Expiration", m.expiration ? fmt.time(m.expiration) : "never"], ["Redelivered", m.redelivered ? `yes (delivery ${m.delivery_count})` : "no"],
      ["Correlation id", m.correlation_id], ["Reply to", m.reply_to], ["Type", m.type], ["Group", m.group_id], ["Sequence", m.group_seq],
      ["Content type", m.content_type]];
    fill(document.querySelector("#headers tbody"), headers.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, v === null || v === undefined || v === "" ? "–" : String(v)))), 2, "");
    const props = Object.entries(m.properties || {});
    fill(document.querySelector("#properties tbody"), props.map(([k, v]) => el("tr", {}, el("th", { scope: "row" }, k), el("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v)))), 2, "No properties.");
    if (!m.body_base64) { try { JSON.parse(m.body); view = "json"; } catch (e) { view = "text"; } } else view = "hex";
    showBody();
    showOrigin(m);
  }

  // A dead letter: where it was first sent, and where Retry takes it (the same place; none recorded: no Retry).
  function showOrigin(m) {
    if (P.dlq !== "1") return;
    document.getElementById("origin-destination").textContent = m.original_destination || "an unrecorded destination";
    const retry = document.getElementById("msg-retry");
    const note = document.getElementById("retry-target");
    if (m.original_destination) {
      if (retry) retry.textContent = `Retry to ${m.original_destination}`;
      note.textContent = P.admin === "1" ? `Retry sends it back to ${m.original_destination}.` : "";
    } else {
      if (retry) { retry.disabled = true; retry.title = "No original destination recorded"; }
      note.textContent = "No original destination is recorded, so it cannot be retried (move it instead).";
    }
  }

  for (const tab of document.querySelectorAll("[role=tab]")) tab.addEventListener("click", () => { view = tab.dataset.view; showBody(); });

  async function run(text, label, call, after) {
    const done = await act(text, label, call);
    if (done) { toast(`${label}: done`); if (after) after(); }
  }
  const target = () => document.getElementById("msg-target").value.trim();
  const back = () => { location.href = P.browse; };
  if (P.admin === "1") {
    document.getElementById("msg-delete").addEventListener("click", () => run(`Delete message ${P.message}?`, "Delete", () => api("DELETE", path), back));
    document.getElementById("msg-retry").addEventListener("click", () => run(`Send message ${P.message} back to ${message && message.original_destination || "its original destination"}?`, "Retry", () => api("POST", `${path}/retry`), back));
    document.getElementById("msg-move").addEventListener("click", () => { if (!target()) return toast("Name the target queue.", true); run(`Move message ${P.message} to ${target()}?`, "Move", () => api("POST", `${path}/move`, { target: target() }), back); });
    document.getElementById("msg-copy").addEventListener("click", () => { if (!target()) return toast("Name the target queue.", true); run(`Copy message ${P.message} to ${target()}?`, "Copy", () => api("POST", `${path}/copy`, { target: target() })); });
  }
  api("GET", path).then((m) => { message = m; render(m); }).catch((e) => { document.getElementById("body").textContent = e.message; toast(e.message, true); });
})();
