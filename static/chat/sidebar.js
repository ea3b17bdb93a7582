// The sidebar's list of conversations: the mark of an answer in progress, a new conversation's
// entry, the rename / delete forms, and the drawer's settings and documents entries.
window.PagodaSidebar = (function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  function markRunning(id, running) {
    const entry = id && document.querySelector(`#conversation-list .conv[data-id="${id}"]`);
    if (!entry) return;
    entry.classList.toggle("running", running);
    const mark = entry.querySelector(".running-mark");
    if (running && !mark) {
      const m = document.createElement("span");
      m.className = "running-mark"; m.title = "An answer is being written"; m.textContent = "● ";
      const hidden = document.createElement("span");
      hidden.className = "visually-hidden"; hidden.textContent = "answer in progress";
      m.appendChild(hidden);
      entry.querySelector(".conv-title").after(m);
    } else if (!running && mark) mark.remove();
  }

  function addSidebarEntry(conv) {
    const list = $("conversation-list");
    list.querySelectorAll(".conv.active").forEach((e) => e.classList.remove("active"));
    const entry = document.createElement("div");
    entry.className = "conv active"; entry.dataset.id = conv.id;
    const link = document.createElement("a");
    link.className = "conv-title"; link.href = `/c/${conv.id}/`; link.textContent = conv.title || "New chat";
    entry.appendChild(link);
    list.prepend(entry);
  }

  document.querySelectorAll(".rename-form").forEach((form) => form.addEventListener("submit", (event) => {
    const title = prompt("Rename the conversation", form.elements.title.value);
    if (!title || !title.trim()) { event.preventDefault(); return; }
    form.elements.title.value = title;
  }));
  document.querySelectorAll(".delete-form").forEach((form) => form.addEventListener("submit", (event) => {
    if (!confirm("Delete this conversation?")) event.preventDefault();
  }));

  // The drawer's entries for what a phone's toolbar has no room for: the settings, attaching documents.
  const settingsEntry = $("drawer-settings");
  if (settingsEntry) settingsEntry.addEventListener("click", () => {
    if (window.PagodaDrawer) window.PagodaDrawer.close();
    const panel = document.querySelector("details.settings");
    panel.open = true;
    panel.querySelector(".settings-panel select, .settings-panel input, .settings-panel textarea").focus();
  });
  document.querySelectorAll('label.side-link[for="attach"]').forEach((label) => label.addEventListener("click", () => {
    if (window.PagodaDrawer) window.PagodaDrawer.close();
  }));

  // Import: the chosen export is sent at once (the server recreates its conversations, or says why not).
  const importFile = $("import-file");
  if (importFile) importFile.addEventListener("change", () => { if (importFile.files.length) $("import-form").submit(); });

  return { markRunning, addSidebarEntry };
})();
