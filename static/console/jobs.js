// Refreshes the jobs table every two seconds from jobs.json (rows built with textContent only).
(function () {
  "use strict";
  const { cell, emptyRow, refreshEvery } = window.PagodaLive;
  const body = document.querySelector("#jobs tbody");

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

  refreshEvery((data) => {
    body.replaceChildren(...data.jobs.map(row));
    if (!data.jobs.length) body.appendChild(emptyRow("No jobs yet.", 8));
  });
})();
