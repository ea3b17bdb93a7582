// While a version validates, poll models.json: move its progress bar; reload when it settles.
(function () {
  const table = document.getElementById("versions");
  async function poll() {
    if (!table.querySelector('tr[data-status="validating"]')) return;
    const response = await fetch(table.dataset.url, {credentials: "same-origin"});
    if (response.ok) {
      for (const v of (await response.json()).versions) {
        const row = table.querySelector(`tr[data-version="${v.id}"]`);
        if (!row) continue;
        if (v.status !== row.dataset.status) { window.location.reload(); return; }
        const bar = row.querySelector("progress"), step = row.querySelector(".step");
        if (bar) bar.value = v.progress;
        if (step) step.textContent = v.step;
      }
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
