// Model output as safe HTML: Markdown rendered by markdown-it with raw HTML off, then sanitized by
// DOMPurify; code blocks highlighted by highlight.js and given a Copy button.
window.PagodaRender = (function () {
  "use strict";
  const md = window.markdownit({
    html: false, linkify: true, breaks: false,
    highlight(code, lang) {
      if (lang && hljs.getLanguage(lang)) {
        try { return hljs.highlight(code, { language: lang, ignoreIllegals: true }).value; } catch (e) { /* plain */ }
      }
      return ""; // markdown-it escapes it
    },
  });
  // Table alignment as classes, not style attributes: the CSP refuses inline style, even while
  // DOMPurify parses the markup.
  md.core.ruler.push("align_by_class", (state) => {
    for (const token of state.tokens) {
      const style = token.attrGet("style");
      if (style === null) continue;
      token.attrs = token.attrs.filter(([name]) => name !== "style");
      const align = /^text-align:(left|right|center)$/.exec(style);
      if (align) token.attrJoin("class", `align-${align[1]}`);
    }
  });
  // Images only from this site or data: (the page's CSP says the same; a remote image URL in model
  // output could carry the conversation away): others become their alt text. Style attributes
  // are dropped too.
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

  function addCopyButtons(root) {
    root.querySelectorAll("pre").forEach((pre) => {
      if (pre.querySelector(".copy")) return;
      const button = document.createElement("button");
      button.type = "button"; button.className = "copy"; button.textContent = "Copy";
      button.setAttribute("aria-label", "Copy the code");
      button.addEventListener("click", () => {
        const text = pre.querySelector("code") ? pre.querySelector("code").innerText : pre.innerText;
        const done = () => { button.textContent = "Copied"; setTimeout(() => (button.textContent = "Copy"), 1200); };
        if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done);
        else { const t = document.createElement("textarea"); t.value = text; document.body.appendChild(t);
          t.select(); document.execCommand("copy"); t.remove(); done(); }
      });
      pre.appendChild(button);
    });
  }

  return { renderMarkdown, addCopyButtons };
})();
