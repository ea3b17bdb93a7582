// The chat page's search: live results under the sidebar's search box, and, when the page was
// opened from a result (/c/<id>/#message-<id>), that message scrolled into view and marked.
// Results arrive as text segments and are built with textContent: nothing from a message can
// become markup here.
(function () {
  "use strict";
  const input = document.getElementById("sidebar-search");
  const dropdown = document.getElementById("search-dropdown");

  function showTarget() {
    const match = /^#message-(\d+)$/.exec(location.hash);
    if (!match) return;
    const el = document.querySelector(`#messages .message[data-id="${match[1]}"]`);
    if (!el) return;
    document.querySelectorAll(".message.search-target").forEach((e) => e.classList.remove("search-target"));
    el.classList.add("search-target");
    el.scrollIntoView({ block: "center" });
  }
  showTarget();
  window.addEventListener("hashchange", showTarget);

  if (!input || !dropdown) return;
  let pending = null, timer = 0, selected = -1;

  function resultEl(result) {
    const link = document.createElement("a");
    link.href = result.url; link.setAttribute("role", "option");
    const title = document.createElement("span");
    title.className = "result-title"; title.textContent = result.conversation.title;
    const role = document.createElement("span");
    role.className = "result-role";
    role.textContent = result.role === "title" ? "title" : result.role === "user" ? "you" : "answer";
    const snippet = document.createElement("span");
    snippet.className = "result-snippet";
    for (const part of result.snippet) {
      const node = part.hit ? document.createElement("mark") : document.createTextNode("");
      node.textContent = part.text;
      snippet.appendChild(node);
    }
    link.append(title, role, snippet);
    return link;
  }

  function render(results) {
    selected = -1;
    dropdown.replaceChildren(...(results.length ? results.map(resultEl) : [Object.assign(
      document.createElement("div"), { className: "empty", textContent: "No matches" })]));
    dropdown.hidden = false;
  }

  function close() { dropdown.hidden = true; selected = -1; }

  async function lookUp() {
    const q = input.value.trim();
    if (pending) pending.abort();
    if (!q) { close(); return; }
    pending = new AbortController();
    try {
      const url = `${input.dataset.suggestUrl}?q=${encodeURIComponent(q)}`;
      const response = await fetch(url, { signal: pending.signal, headers: { Accept: "application/json" } });
      if (!response.ok) { close(); return; }
      render((await response.json()).results);
    } catch (e) {
      if (e.name !== "AbortError") close();
    }
  }

  function move(step) {
    const links = [...dropdown.querySelectorAll("a")];
    if (!links.length) return;
    selected = (selected + step + links.length) % links.length;
    links.forEach((a, i) => a.classList.toggle("selected", i === selected));
    links[selected].scrollIntoView({ block: "nearest" });
  }

  input.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(lookUp, 150); });
  input.addEventListener("keydown", (event) => {
    if (event.key === "ArrowDown") { event.preventDefault(); move(1); }
    else if (event.key === "ArrowUp") { event.preventDefault(); move(-1); }
    else if (event.key === "Escape") { close(); }
    else if (event.key === "Enter" && selected >= 0 && !dropdown.hidden) {
      event.preventDefault();
      dropdown.querySelectorAll("a")[selected].click();
    }
  });
  document.addEventListener("click", (event) => { if (!event.target.closest(".sidebar-search")) close(); });
})();
