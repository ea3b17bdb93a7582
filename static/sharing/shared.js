// A shared conversation, read-only: the snapshot from the page's JSON, rendered by the chat page's
// own renderer (static/chat/render.js: markdown-it with raw HTML off, then DOMPurify, remote images
// blocked); user messages as plain text. No WebSocket, no input: nothing here talks back to the server.
(function () {
  "use strict";
  const state = JSON.parse(document.getElementById("shared-state").textContent);
  const messagesEl = document.getElementById("messages");

  const { renderMarkdown, addCopyButtons } = window.PagodaRender; // static/chat/render.js

  function messageEl(m) {
    const el = document.createElement("article");
    el.className = `message ${m.role === "user" ? "user" : "assistant"}`;
    const body = document.createElement("div");
    body.className = "body";
    if (m.role === "user") body.textContent = m.content;
    else body.innerHTML = renderMarkdown(m.content || "");
    el.appendChild(body);
    if (m.role !== "user" && m.model) {
      const footer = document.createElement("div");
      footer.className = "footer";
      const meta = document.createElement("span");
      meta.className = "meta"; meta.textContent = m.model;
      footer.appendChild(meta);
      el.appendChild(footer);
    }
    return el;
  }

  messagesEl.replaceChildren(...state.messages.map(messageEl));
  addCopyButtons(messagesEl);
})();
