// Refreshes the workers table every two seconds from workers.json.
(function () {
  "use strict";
  const REFRESH_MS = 2000;
  const label = document.getElementById("refreshed");
  const body = document.querySelector("#workers tbody");
  const uncovered = document.getElementById("uncovered");

  const secs = (v) => (v === null || v === undefined ? "–" : v.toFixed(3));
  const pct = (v) => (v === null || v === undefined ? "–" : Math.round(v * 100) + " %");

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function render(data) {
    body.replaceChildren();
    for (const w of data.workers) {
      const tr = document.createElement("tr");
      tr.className = "state-" + w.state;
      tr.dataset.worker = w.worker_id;
      [w.state + (w.draining ? " (draining)" : ""), w.model, w.version, w.host, w.pid, w.uptime_s + " s",
       w.heartbeat_age_s + " s ago", w.num_running, w.num_waiting, pct(w.kv_cache_usage),
       pct(w.prefix_cache_hit_rate), w.tokens_per_s.toFixed(1), secs(w.ttft_p50), secs(w.ttft_p95),
       secs(w.itl_p50), secs(w.itl_p95)].forEach((v) => tr.appendChild(cell(String(v))));
      body.appendChild(tr);
    }
    if (!data.workers.length) {
      const tr = document.createElement("tr");
      const td = cell("No workers.");
      td.colSpan = 16;
      tr.appendChild(td);
      body.appendChild(tr);
    }
    uncovered.replaceChildren(...data.uncovered.map((item) => {
      const p = document.createElement("p");
      p.className = "warning";
      p.textContent = `No worker serves ${item.model} v${item.version}.`;
      return p;
    }));
    label.textContent = "live · updated " + new Date().toLocaleTimeString();
  }

  async function refresh() {
    try {
      const response = await fetch(label.dataset.url, { headers: { Accept: "application/json" } });
      if (response.ok) render(await response.json());
      else label.textContent = "refresh failed (" + response.status + ")";
    } catch (err) {
      label.textContent = "refresh failed";
    }
  }

  setInterval(refresh, REFRESH_MS);
  refresh();
})();
