// What the console's live tables share (jobs.js, workers.js): text-only cells, the row a table shows
// when it is empty, and the refresh every two seconds from the URL of the heading's #refreshed label,
// which says when the table was last updated.
window.PagodaLive = (function () {
  "use strict";
  const REFRESH_MS = 2000;

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function emptyRow(text, colSpan) {
    const tr = document.createElement("tr");
    const td = cell(text);
    td.colSpan = colSpan;
    tr.appendChild(td);
    return tr;
  }

  // Hands each JSON answer to render(data); ``immediately``: the first refresh does not wait.
  function refreshEvery(render, { immediately = false } = {}) {
    const label = document.getElementById("refreshed");
    async function refresh() {
      try {
        const response = await fetch(label.dataset.url, { headers: { Accept: "application/json" } });
        if (!response.ok) {
          label.textContent = "refresh failed (" + response.status + ")";
          return;
        }
        render(await response.json());
        label.textContent = "live · updated " + new Date().toLocaleTimeString();
      } catch (err) {
        label.textContent = "refresh failed";
      }
    }
    setInterval(refresh, REFRESH_MS);
    if (immediately) refresh();
  }

  return { cell, emptyRow, refreshEvery };
})();
