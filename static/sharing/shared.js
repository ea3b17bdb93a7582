// A shared conversation, read-only: the snapshot from the page's JSON, rendered the way the chat
// page renders it -- model output as Markdown through markdown-it with raw HTML off, then DOMPurify;
// user messages as plain text. No WebSocket, no input: nothing here talks back to the server.
(function () {
  "use strict";
  const state = JSON.parse(document.getElementById("shared-state").textContent);
  const messagesEl = document.getElementById("messages");

  const md = window.markdownit({
    html: false, linkify: true, breaks: false,
    highlight(code, lang) {
      if (lang && hljs.getLanguage(lang)) {
        try { return hljs.highlight(code, { language: lang, ignoreIllegals: true }).value; } catch (e) { /* plain */ }
      }
      return ""; // markdown-it escapes it
    },
  });
  // As on the chat page: table alignment as classes (the CSP refuses style attributes) ...
  md.core.ruler.push("align_by_class", (s) => {
    for (const token of s.tokens) {
      const style = token.attrGet("style");
      if (style === null) continue;
      token.attrs = token.attrs.filter(([name]) => name !== "style");
      const align = /^text-align:(left|right|center)$/.exec(style);
      if (align) token.attrJoin("class", `align-${align[1]}`);
    }
  });
  // ... and images only from this site or data: (a remote URL could carry the page away).
  const isLocalImage = (src) => {
    try { const url = new URL(src, location.href); return url.protocol === "data:" || url.origin === location.origin; }
    catch (e) { return false; }
  };
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.nodeName === "IMG" && !isLocalImage(node.getAttribute("src") || "")) {
      const alt = document.createElement("span");
      alt.className = "blocked-image"; alt.title = "remote image not loaded";
      alt.textContent = node.getAttribute("alt") || "image";
      node.replaceWith(alt);
    }
  });
  const renderMarkdown = (text) => DOMPurify.sanitize(md.render(text), { USE_PROFILES: { html: true }, FORBID_ATTR: ["style"] });

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
})();
