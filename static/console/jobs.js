// Refreshes the jobs table every two seconds from jobs.json (rows built with textContent only).
(function () {
  "use strict";
  const REFRESH_MS = 2000;
  const label = document.getElementById("refreshed");
  const body = document.querySelector("#jobs tbody");

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function row(job) {
    const tr = document.createElement("tr");
    tr.className = "job-" + job.state;
    tr.dataset.job = job.id;
    tr.appendChild(cell(job.kind));
    const of = document.createElement("td");
    const link = document.createElement("a");
    link.href = job.link;
    link.textContent = job.subject;
    of.appendChild(link);
    tr.appendChild(of);
    const state = cell(job.state);
    state.className = "state";
    tr.append(state, cell(job.step));
    const progress = document.createElement("td");
    const bar = document.createElement("progress");
    bar.max = 100;
    bar.value = job.progress;
    bar.setAttribute("aria-label", "progress of " + job.subject);
    progress.append(bar, " " + job.progress + "%");
    tr.appendChild(progress);
    tr.append(cell(job.created), cell(job.duration_s === null ? "–" : job.duration_s + " s"));
    const result = cell(job.result.length > 120 ? job.result.slice(0, 119) + "…" : job.result);
    result.className = "result";
    tr.appendChild(result);
    return tr;
  }

  function render(data) {
    body.replaceChildren(...data.jobs.map(row));
    if (!data.jobs.length) {
      const tr = document.createElement("tr");
      const td = cell("No jobs yet.");
      td.colSpan = 8;
      tr.appendChild(td);
      body.appendChild(tr);
    }
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
})();
