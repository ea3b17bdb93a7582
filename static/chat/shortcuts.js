// Keyboard shortcuts of the chat page, and the help overlay that lists them (? or Ctrl+/).
// They drive the page's own controls (the Stop button, the ‹ › of a message...), so a shortcut
// does exactly what a click does.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const help = $("shortcuts-help"), promptEl = $("prompt"), statusEl = $("shortcut-status");
  const mod = (e) => e.ctrlKey || e.metaKey;
  const typing = (el) => el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));

  function announce(text) {
    statusEl.textContent = text;
    setTimeout(() => { if (statusEl.textContent === text) statusEl.textContent = ""; }, 2500);
  }

  function copyLastAnswer() {
    const answers = document.querySelectorAll(".message.assistant[data-id]");
    const last = answers[answers.length - 1];
    if (!last) { announce("There is no answer to copy yet."); return; }
    const text = last.dataset.content || last.querySelector(".body").innerText;
    const done = () => announce("Copied the last answer.");
    if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => announce("Copying was refused."));
    else {
      const t = document.createElement("textarea"); t.value = text; document.body.appendChild(t);
      t.select(); document.execCommand("copy"); t.remove(); done();
    }
  }

  // The focused message's versions, else the last message on the page that has versions.
  function moveBranch(step) {
    const focused = document.activeElement && document.activeElement.closest(".message");
    const withVersions = [...document.querySelectorAll(".message")].filter((m) => m.querySelector(".branches"));
    const target = focused && focused.querySelector(".branches") ? focused : withVersions[withVersions.length - 1];
    const button = target && target.querySelector(step < 0 ? ".branch-prev" : ".branch-next");
    if (!button || button.disabled) { announce(target ? "No other version that way." : "No message has other versions."); return; }
    button.focus();
    button.click();
  }

  function openHelp() {
    if (!help.open) help.showModal();
  }

  document.addEventListener("keydown", (e) => {
    if (e.isComposing) return;
    const key = e.key.toLowerCase();
    if (mod(e) && e.shiftKey && key === "o") { e.preventDefault(); location.href = "/"; return; }
    if (mod(e) && e.shiftKey && key === "c") { e.preventDefault(); copyLastAnswer(); return; }
    if (mod(e) && key === "/") { e.preventDefault(); openHelp(); return; }
    if (e.altKey && e.shiftKey && (e.key === "ArrowLeft" || e.key === "ArrowRight")) {
      e.preventDefault(); moveBranch(e.key === "ArrowLeft" ? -1 : 1); return;
    }
    if (help.open) return; // the dialog handles its own Escape
    const settings = document.querySelector("details.settings");
    if (e.key === "Escape" && e.shiftKey) { e.preventDefault(); settings.open = false; promptEl.focus(); return; }
    if (e.key === "Escape" && settings.open && settings.contains(e.target)) {
      e.preventDefault(); settings.open = false; settings.querySelector("summary").focus(); return;
    }
    if (e.key === "Escape" && !e.target.classList.contains("edit-box")) {
      const stop = $("stop");
      if (!stop.hidden) { e.preventDefault(); stop.click(); announce("Stopping the answer."); }
      return;
    }
    if (e.key === "?" && !typing(e.target) && !mod(e) && !e.altKey) { e.preventDefault(); openHelp(); }
  });
  $("shortcuts-open").addEventListener("click", openHelp);
  $("shortcuts-close").addEventListener("click", () => help.close());
})();
