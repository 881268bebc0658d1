/* Routing page: GET /api/v1/virtual-destinations, one row per virtual destination. The configuration
   changes rarely and has no event stream, so the page re-reads it every 10 s. */
"use strict";
(function () {
  const { api, el, fill, toast } = window.SB;
  const TYPES = { compositeQueue: "composite queue", compositeTopic: "composite topic",
    virtualTopic: "virtual topic", mirroredQueue: "mirrored queues" };

  function target(f) {
    return el("li", {}, el("code", {}, f.destination), f.selector ? [" where ", el("code", {}, f.selector)] : null);
  }

  function row(r) {
    let forwards; let options;
    if (r.type.startsWith("composite")) {
      forwards = el("ul", { class: "plain" }, r.forwardTo.map(target));
      options = `forwardOnly=${r.forwardOnly}, sendWhenNotMatched=${r.sendWhenNotMatched}`;
    } else if (r.type === "virtualTopic") {
      forwards = ["queues ", el("code", {}, `${r.prefix}<topic>${r.postfix}`)];
      options = "–";
    } else {
      forwards = ["topics ", el("code", {}, `${r.prefix}<queue>${r.postfix}`)];
      options = "every queue";
    }
    return el("tr", { dataset: { type: r.type, name: r.name || "" } },
      el("td", {}, TYPES[r.type] || r.type), el("th", { scope: "row" }, r.name || "every queue"),
      el("td", {}, forwards), el("td", {}, options));
  }

  async function load() {
    let rows;
    try { rows = await api("GET", "virtual-destinations"); } catch (e) { toast(e.message, true); return; }
    fill(document.querySelector("#routing tbody"), rows.map(row), 4, "No virtual destinations are configured.");
  }
  load();
  setInterval(load, 10000);
})();
