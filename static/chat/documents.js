// Documents attached to the next message: text files read here (UTF-8) and sent whole with it;
// the server refuses one that is not text, or that does not fit the model's context.
window.PagodaDocuments = function (showError, focusPrompt) {
  "use strict";
  const $ = (id) => document.getElementById(id);
  let pending = []; // [{name, text}] read from the files chosen, sent with the next message
  const attachEl = $("attach"), attachmentsEl = $("attachments");
  function documentChips(names, removable) {
    const list = document.createElement("ul");
    list.className = "documents";
    names.forEach((name, i) => {
      const chip = document.createElement("li");
      chip.textContent = name;
      if (removable) {
        const remove = document.createElement("button");
        remove.type = "button"; remove.className = "link"; remove.textContent = "×";
        remove.setAttribute("aria-label", `Remove ${name}`);
        remove.addEventListener("click", () => { pending.splice(i, 1); renderPending(); focusPrompt(); });
        chip.appendChild(remove);
      }
      list.appendChild(chip);
    });
    return list;
  }
  function renderPending() {
    attachmentsEl.replaceChildren(pending.length ? documentChips(pending.map((d) => d.name), true) : "");
  }
  attachEl.addEventListener("change", async () => {
    for (const file of attachEl.files) {
      const text = await file.text();
      if (text.indexOf("\u0000") >= 0) { showError(`${file.name} is not a text file.`); continue; }
      pending.push({ name: file.name, text });
    }
    attachEl.value = "";
    renderPending();
  });

  return {
    chips: (names) => documentChips(names, false),
    pending: () => pending,
    clear() { pending = []; renderPending(); },
  };
};
