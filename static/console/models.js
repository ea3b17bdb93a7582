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

// The memory estimate of each version's settings form, for the values being edited.
(function () {
  for (const line of document.querySelectorAll(".memory-estimate")) {
    const form = line.closest("form"), out = line.querySelector("small");
    let timer = null;
    async function update() {
      const params = new URLSearchParams(new FormData(form));
      params.delete("csrfmiddlewaretoken");
      try {
        const response = await fetch(line.dataset.url + "?" + params, {credentials: "same-origin"});
        const data = await response.json();
        out.textContent = data.ok ? "Memory: " + data.text : "Memory: cannot estimate: " + data.error;
      } catch (err) {
        out.textContent = "Memory: estimate unavailable";
      }
    }
    const later = () => { clearTimeout(timer); timer = setTimeout(update, 300); };
    form.addEventListener("input", later);
    form.addEventListener("change", later);
    line.closest("details").addEventListener("toggle", (e) => { if (e.target.open) update(); });
  }
})();
