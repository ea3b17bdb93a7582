// Refreshes the workers table every two seconds from workers.json.
(function () {
  "use strict";
  const { cell, emptyRow, refreshEvery } = window.PagodaLive;
  const body = document.querySelector("#workers tbody");
  const uncovered = document.getElementById("uncovered");

  const secs = (v) => (v === null || v === undefined ? "–" : v.toFixed(3));
  const pct = (v) => (v === null || v === undefined ? "–" : Math.round(v * 100) + " %");
  // speculative decoding: draft tokens accepted, tokens per drafting step (as the page's template)
  const drafts = (w) => (w.spec_acceptance_rate === null || w.spec_acceptance_rate === undefined ? "–"
    : pct(w.spec_acceptance_rate) + ", " + w.spec_tokens_per_step.toFixed(2) + "/step");

  // The effective engine settings, folded; a fold left open stays open across refreshes.
  function settingsCell(settings, isOpen) {
    const td = document.createElement("td");
    td.className = "engine-settings";
    const details = document.createElement("details");
    details.open = isOpen;
    const summary = document.createElement("summary");
    summary.textContent = "effective";
    details.appendChild(summary);
    for (const [name, value] of Object.entries(settings)) {
      const code = document.createElement("code");
      code.textContent = name + "=" + (value === null ? "None" : String(value));
      details.append(code, document.createElement("br"));
    }
    td.appendChild(details);
    return td;
  }

  function render(data) {
    const openRows = new Set([...body.querySelectorAll("tr")].filter((tr) => tr.querySelector("details[open]"))
      .map((tr) => tr.dataset.worker));
    body.replaceChildren();
    for (const w of data.workers) {
      const tr = document.createElement("tr");
      tr.className = "state-" + w.state;
      tr.dataset.worker = w.worker_id;
      [w.state + (w.draining ? " (draining)" : ""), w.model, w.version, w.host, w.pid, w.uptime_s + " s",
       w.heartbeat_age_s + " s ago", w.num_running, w.num_waiting, pct(w.kv_cache_usage),
       pct(w.prefix_cache_hit_rate), w.tokens_per_s.toFixed(1), secs(w.ttft_p50), secs(w.ttft_p95),
       secs(w.itl_p50), secs(w.itl_p95), drafts(w), w.num_preemptions + " / " + w.num_paused_steps].forEach((v) => tr.appendChild(cell(String(v))));
      tr.appendChild(settingsCell(w.engine_settings || {}, openRows.has(w.worker_id)));
      body.appendChild(tr);
    }
    if (!data.workers.length) body.appendChild(emptyRow("No workers.", 19));
    uncovered.replaceChildren(...data.uncovered.map((item) => {
      const p = document.createElement("p");
      p.className = "warning";
      p.textContent = `No worker serves ${item.model} v${item.version}.`;
      return p;
    }));
  }

  refreshEvery(render, { immediately: true });
})();
