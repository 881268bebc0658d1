/* The scheduled and delayed messages of a queue or a topic page (templates/console/_scheduled.html):
   GET …/scheduled (one implementation for both kinds, broker_core's browse of parked messages), the
   first SHOWN soonest due first, each with its due time, repeats or cron expression; Cancel for admins
   (DELETE …/messages/<id>, audited: a delayed message goes, a repeating job stops).
   Usage: const table = SB.scheduledTable({ base: "queues/<name>", admin, link: (id) => url | null });
   table.load() reads it again; table.stats(stats) with the page's statistics (null: the destination is
   gone) keeps the "first 50 of N" line on the Scheduled card's count (`scheduled`: jobs only, not the
   messages waiting for a redelivery delay that `parked` also counts) and reads again when it moves. */
"use strict";
(function () {
  const { api, el, fill, fmt, latest, act, toast } = window.SB;
  // The table lists the first SHOWN (soonest due first); the Scheduled card counts them all, so
  // a longer list says that it is cut, with that count (rather than 50 rows under a card of 55).
  const SHOWN = 50;
  const EMPTY = "No scheduled or delayed messages.";

  function scheduledTable({ base, admin, link }) {
    const body = document.querySelector("#scheduled tbody");
    const note = document.getElementById("scheduled-more");
    let cut = false; let jobs = null;

    function more() {
      note.hidden = !cut;
      const total = typeof jobs === "number" ? ` of ${fmt.num(jobs)}` : "";
      note.textContent = cut ? `The first ${SHOWN}${total}, the soonest due first.` : "";
    }

    async function cancel(m) {
      const what = m.period || m.cron ? `the repeating scheduled message ${m.message_id} (no further deliveries)` : `the scheduled message ${m.message_id}`;
      const done = await act(`Cancel ${what}?`, "Cancel it", () => api("DELETE", `${base}/messages/${encodeURIComponent(m.message_id)}`));
      if (done) { toast(`Cancelled ${m.message_id}`); load(); }
    }

    const load = latest(() => api("GET", `${base}/scheduled?limit=${SHOWN}`), (data) => {
      cut = Boolean(data.next_cursor);
      more();
      const rows = data.messages.map((m) => {
        const href = link && link(m.message_id);
        return el("tr", {},
          el("td", { class: "id" }, href ? el("a", { href }, m.message_id) : m.message_id),
          el("td", {}, fmt.time(m.timestamp)),
          el("td", { class: "due", title: m.due ? fmt.ago(m.due) : "" }, m.due ? fmt.time(m.due) : "–"),
          // a cron job (UTC): at each time of its expression, or a run of repeats + 1 from each
          el("td", {}, m.cron ? `cron ${m.cron} (UTC)${m.period ? `, each a run of ${fmt.num(m.repeats_left + 1)} every ${fmt.num(m.period)} ms` : ""}`
            : m.period ? `every ${fmt.num(m.period)} ms, ${fmt.num(m.repeats_left)} more` : "–"),
          el("td", {}, m.group_id || "–"), el("td", { class: "num" }, m.priority),
          el("td", {}, admin ? el("button", { type: "button", class: "small danger", onclick: () => cancel(m), "aria-label": `Cancel ${m.message_id}` }, "Cancel") : ""));
      });
      fill(body, rows, 7, EMPTY);
    });

    function stats(s) {
      if (!s) {  // gone, and its scheduled messages with it
        fill(body, [], 7, EMPTY);
        cut = false; jobs = null; more();
        return;
      }
      const moved = jobs !== null && s.scheduled !== jobs;  // one fired, was sent or cancelled elsewhere
      jobs = s.scheduled;
      more();
      if (moved) load();
    }

    return { load, stats };
  }

  window.SB.scheduledTable = scheduledTable;
})();
