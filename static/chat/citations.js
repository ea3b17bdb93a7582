// An answer's citations: its [n] markers and its list of sources open the passage (document, page,
// the passage highlighted in its surrounding text) in a side panel. Markers are found in the text
// nodes of the already-sanitized answer and replaced by buttons made here; the passage arrives as
// JSON and is set as text (textContent), so nothing from a document is ever read as markup.
window.PagodaCitations = function (passageUrl) {
  "use strict";
  const panel = document.getElementById("passage-panel");
  const titleEl = document.getElementById("passage-title"), bodyEl = document.getElementById("passage-body");
  const MARKER = /\[(\d{1,2})\]/g;

  function where(source) {
    return source.document + (source.page ? `, page ${source.page}` : "");
  }
  function citeButton(source, label) {
    const b = document.createElement("button");
    b.type = "button"; b.className = "cite"; b.textContent = label;
    b.dataset.chunk = source.chunk;
    b.title = where(source);
    b.setAttribute("aria-label", `Source ${source.n}: ${where(source)}`);
    b.addEventListener("click", () => open(source));
    return b;
  }
  function linkMarkers(body, sources) {
    const byNumber = new Map(sources.map((s) => [String(s.n), s]));
    const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
    const nodes = [];
    while (walker.nextNode()) {
      const node = walker.currentNode;
      if (!node.parentElement.closest("pre, code, a, button") && MARKER.test(node.data)) nodes.push(node);
      MARKER.lastIndex = 0;
    }
    nodes.forEach((node) => {
      const parts = [];
      let position = 0;
      node.data.replace(MARKER, (match, n, offset) => {
        const source = byNumber.get(n);
        if (!source) return match;
        parts.push(node.data.slice(position, offset), citeButton(source, `[${n}]`));
        position = offset + match.length;
        return match;
      });
      if (!parts.length) return;
      parts.push(node.data.slice(position));
      node.replaceWith(...parts);
    });
  }
  function sourceList(sources) {
    const list = document.createElement("ol");
    list.className = "sources"; list.setAttribute("aria-label", "Sources");
    sources.forEach((s) => {
      const item = document.createElement("li");
      item.appendChild(citeButton(s, `[${s.n}] ${where(s)}`));
      list.appendChild(item);
    });
    return list;
  }
  async function open(source) {
    panel.hidden = false;
    titleEl.textContent = where(source);
    bodyEl.textContent = "Loading…";
    const response = await fetch(passageUrl.replace(/0$/, String(source.chunk)), { credentials: "same-origin" });
    const passage = await response.json().catch(() => ({ error: "This passage could not be loaded." }));
    if (!response.ok) { bodyEl.textContent = passage.error || "This passage could not be loaded."; return; }
    titleEl.textContent = passage.document + (passage.page ? `, page ${passage.page}` : "")
      + (passage.heading ? ` · ${passage.heading}` : "");
    const hit = document.createElement("mark");
    hit.className = "passage-hit"; hit.textContent = passage.text;
    bodyEl.replaceChildren(passage.before ? `…${passage.before}` : "", hit, passage.after ? `${passage.after}…` : "");
    hit.scrollIntoView({ block: "center" });
  }
  document.getElementById("passage-close").addEventListener("click", () => { panel.hidden = true; });
  panel.addEventListener("keydown", (e) => { if (e.key === "Escape") panel.hidden = true; });

  return {
    decorate(body, footer, sources) {
      if (!sources || !sources.length) return;
      linkMarkers(body, sources);
      footer.parentElement.insertBefore(sourceList(sources), footer);
    },
  };
};
