// Documents attached to the next message: text files read here (UTF-8), a PDF's text from the
// server, sent whole with it;
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
  // A PDF's text comes from the server (pypdf): the page sends the file, then attaches the text.
  async function pdfText(file) {
    const body = new FormData();
    body.append("file", file);
    const token = document.querySelector("input[name=csrfmiddlewaretoken]");
    const response = await fetch(attachEl.dataset.pdfUrl, {
      method: "POST", body, headers: token ? { "X-CSRFToken": token.value } : {}, credentials: "same-origin",
    });
    const answer = await response.json().catch(() => ({ error: `${file.name} could not be read.` }));
    if (!response.ok) throw new Error(answer.error || `${file.name} could not be read.`);
    return answer.text;
  }
  attachEl.addEventListener("change", async () => {
    for (const file of attachEl.files) {
      if (/\.pdf$/i.test(file.name)) {
        try { pending.push({ name: file.name, text: await pdfText(file) }); } catch (err) { showError(err.message); }
        continue;
      }
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
