// The chat page: one WebSocket (/ws/chat/) carries turns out and streamed deltas back.
// Model output is Markdown rendered by render.js (markdown-it, raw HTML off, then DOMPurify);
// user messages are plain text (textContent), so neither can inject markup or script.
(function () {
  "use strict";
  const state = JSON.parse(document.getElementById("chat-state").textContent);
  const $ = (id) => document.getElementById(id);
  const messagesEl = $("messages"), promptEl = $("prompt"), sendBtn = $("send"), stopBtn = $("stop");
  const modelEl = $("model"), connectionEl = $("connection");

  const { renderMarkdown, addCopyButtons } = window.PagodaRender;
  const attached = window.PagodaDocuments((text) => showError(text), () => promptEl.focus());
  const documentChips = attached.chips;
  const citations = window.PagodaCitations($("passage-panel").dataset.url);
  const { markRunning, addSidebarEntry } = window.PagodaSidebar;

  let conversationId = state.conversation ? state.conversation.id : null;
  let socket = null, streaming = null; // streaming: {el, body, text, frame}

  // ---------------------------------------------------------------- settings
  if (state.model) modelEl.value = state.model;
  $("system-prompt").value = state.system_prompt || "";
  const settingsPanel = window.PagodaSettings(state, (frame) => send(frame, false));
  const settings = () => Object.assign({ model: modelEl.value }, settingsPanel.collect());

  // ---------------------------------------------------------------- scrolling
  const nearBottom = () => messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < 40;
  function keepScroll(update) {
    const stick = nearBottom();
    update();
    if (stick) messagesEl.scrollTop = messagesEl.scrollHeight; // else the reader's position stays
  }

  // A phone's on-screen keyboard shrinks the visual viewport, not always the layout (iOS): the
  // page takes the visual viewport's height (--app-height, chat.css), so the composer stays just
  // above the keyboard and the last message in view.
  const viewport = window.visualViewport;
  if (viewport) {
    const fit = () => {
      if (Math.abs(viewport.scale - 1) > 0.01) return;  // pinch-zoomed: the layout stays as it is
      const stick = nearBottom();
      document.documentElement.style.setProperty("--app-height", `${Math.round(viewport.height)}px`);
      if (viewport.offsetTop > 0 && document.activeElement === promptEl) window.scrollTo(0, 0);
      if (stick) messagesEl.scrollTop = messagesEl.scrollHeight;
    };
    viewport.addEventListener("resize", fit);
    fit();
  }

  // ---------------------------------------------------------------- messages
  function setAssistantBody(body, text) {
    body.innerHTML = renderMarkdown(text);
    addCopyButtons(body);
  }

  function metaText(m) {
    const parts = [];
    if (m.model) parts.push(m.model);
    if (m.completion_tokens) parts.push(`${m.completion_tokens} tokens`);
    if (m.tokens_per_s) parts.push(`${m.tokens_per_s.toFixed(1)} tok/s`);
    if (m.prompt_tokens) parts.push(`prefix cache ${Math.round(100 * (m.cached_prompt_tokens || 0) / m.prompt_tokens)}%`);
    if (m.finish_reason === "abort") parts.push("stopped");
    else if (m.finish_reason === "length") parts.push("cut at max tokens");
    return parts.join(" · ");
  }

  function messageEl(m) {
    const el = document.createElement("article");
    el.className = `message ${m.role}`;
    if (m.id) el.dataset.id = m.id;
    const body = document.createElement("div");
    body.className = "body";
    el.appendChild(body);
    const footer = document.createElement("div");
    footer.className = "footer";
    el.appendChild(footer);
    if (m.siblings && m.siblings.length > 1) footer.appendChild(branchNav(m));
    if (m.role === "user") {
      body.textContent = m.content;
      if (m.documents && m.documents.length) el.insertBefore(documentChips(m.documents), body);
      const edit = document.createElement("button");
      edit.type = "button"; edit.className = "link edit"; edit.textContent = "Edit";
      edit.addEventListener("click", () => startEdit(el));
      footer.appendChild(edit);
    } else {
      if (m.id) el.dataset.content = m.content || ""; // the Markdown, for "copy the last answer"
      setAssistantBody(body, m.content || "");
      citations.decorate(body, footer, m.sources);
      const meta = document.createElement("span");
      meta.className = "meta"; meta.textContent = metaText(m);
      footer.appendChild(meta);
      const again = document.createElement("button");
      again.type = "button"; again.className = "link regenerate"; again.textContent = "Regenerate";
      again.addEventListener("click", () => send({ type: "regenerate", conversation: conversationId, message: m.id }));
      footer.appendChild(again);
    }
    return el;
  }

  // "‹ 2/3 ›": the versions of a message (edits, answers again); moving shows that version's branch.
  function branchNav(m) {
    const nav = document.createElement("span");
    nav.className = "branches"; nav.setAttribute("role", "group");
    nav.setAttribute("aria-label", `Version ${m.index} of ${m.siblings.length}`);
    const step = (delta, label, text) => {
      const b = document.createElement("button");
      b.type = "button"; b.className = "link branch-" + (delta < 0 ? "prev" : "next"); b.textContent = text;
      b.setAttribute("aria-label", label);
      const target = m.siblings[m.index - 1 + delta];
      b.disabled = target === undefined;
      b.addEventListener("click", () => switchTo(target));
      return b;
    };
    const count = document.createElement("span");
    count.className = "branch-count"; count.textContent = `${m.index}/${m.siblings.length}`;
    nav.append(step(-1, "Previous version", "‹"), count, step(1, "Next version", "›"));
    return nav;
  }

  function switchTo(messageId) {
    if (messageId === undefined || streaming || !socket || socket.readyState !== WebSocket.OPEN) return;
    socket.send(JSON.stringify({ type: "switch", conversation: conversationId, message: messageId }));
  }

  function renderPath(messages) {
    messagesEl.querySelectorAll(".message, .error-banner").forEach((e) => e.remove());
    messages.forEach((m) => messagesEl.appendChild(messageEl(m)));
    refreshEmptyState();
  }

  // A link to a message on another branch (a search result): show the branch it is on.
  let linkedMessage = null;
  function followLink() {
    const target = /^#message-(\d+)$/.exec(location.hash);
    if (target && !messagesEl.querySelector(`.message[data-id="${target[1]}"]`)) {
      linkedMessage = Number(target[1]); switchTo(linkedMessage);
    }
  }
  window.addEventListener("hashchange", followLink);
  function onPath(msg) {
    if (msg.conversation !== conversationId) return;
    if (linkedMessage !== null) { // opened from a link: the page's own hash handling marks it now
      linkedMessage = null; renderPath(msg.messages); window.dispatchEvent(new HashChangeEvent("hashchange")); return;
    }
    const focused = document.activeElement && document.activeElement.closest(".message");
    const at = focused ? [...messagesEl.querySelectorAll(".message")].indexOf(focused) : -1;
    const cls = document.activeElement && document.activeElement.classList.contains("branch-prev") ? ".branch-prev" : ".branch-next";
    keepScroll(() => renderPath(msg.messages));
    // Keyboard users stay on the control they used.
    const again = at >= 0 && messagesEl.querySelectorAll(".message")[at];
    if (again && again.querySelector(cls)) again.querySelector(cls).focus();
  }

  function refreshEmptyState() {
    $("empty-state").hidden = messagesEl.querySelectorAll(".message").length > 0;
  }

  function startEdit(el) {
    if (streaming || el.querySelector("textarea")) return;
    const body = el.querySelector(".body");
    const original = body.textContent;
    const box = document.createElement("textarea");
    box.value = original; box.rows = Math.min(12, original.split("\n").length + 1); box.className = "edit-box";
    const save = document.createElement("button");
    save.type = "button"; save.className = "primary"; save.textContent = "Save & send";
    const cancel = document.createElement("button");
    cancel.type = "button"; cancel.className = "link"; cancel.textContent = "Cancel";
    body.replaceChildren(box, save, cancel);
    box.focus();
    cancel.addEventListener("click", () => { body.textContent = original; });
    save.addEventListener("click", () => {
      if (!box.value.trim()) return;
      send({ type: "edit", conversation: conversationId, message: Number(el.dataset.id), content: box.value });
      body.textContent = box.value;
    });
  }

  function showError(text) {
    const el = document.createElement("div");
    el.className = "error-banner"; el.setAttribute("role", "alert"); el.textContent = text;
    keepScroll(() => messagesEl.appendChild(el));
  }

  // ---------------------------------------------------------------- streaming
  function setBusy(busy) {
    sendBtn.hidden = busy; stopBtn.hidden = !busy;
    messagesEl.classList.toggle("busy", busy);
  }

  function scheduleRender() {
    if (!streaming || streaming.frame) return;
    // One render per animation frame however many deltas arrived: no flicker, no wasted work.
    streaming.frame = requestAnimationFrame(() => {
      streaming.frame = 0;
      keepScroll(() => setAssistantBody(streaming.body, streaming.text));
    });
  }

  function showStreaming(msg, text) {
    settingsPanel.clearError();
    if (msg.type === "start") attached.clear();
    unsent = "";
    if (conversationId !== msg.conversation.id) {
      conversationId = msg.conversation.id;
      history.replaceState(null, "", `/c/${conversationId}/`);
      addSidebarEntry(msg.conversation);
    }
    markRunning(conversationId, true);
    document.querySelectorAll(".error-banner").forEach((e) => e.remove());
    // The path up to the (new, edited or repeated) question; the answer follows it.
    renderPath(msg.path);
    const el = messageEl({ role: "assistant", content: "", model: msg.model });
    el.classList.add(text ? "streaming" : "waiting");
    if (!text) el.querySelector(".body").innerHTML = '<span class="typing" aria-label="Waiting for the first token"><i></i><i></i><i></i></span>';
    messagesEl.appendChild(el);
    messagesEl.scrollTop = messagesEl.scrollHeight;
    streaming = { el, body: el.querySelector(".body"), text, frame: 0 };
    if (text) scheduleRender();
    refreshEmptyState();
    setBusy(true);
  }
  const onStart = (msg) => showStreaming(msg, "");
  // An answer already running (a reload, another tab, a reconnect): the text so far, then its deltas.
  const onResume = (msg) => { finishStreaming(); showStreaming(msg, msg.text || ""); };
  function onIdle() {
    // The page was rendered while the answer ran, and it has ended since: load it as stored.
    const last = messagesEl.querySelector(".message:last-of-type");
    if (state.running && last && last.classList.contains("user")) { state.running = false; location.reload(); }
    state.running = false;
    markRunning(conversationId, false);
  }

  function onDelta(msg) {
    if (!streaming) return;
    if (streaming.el.classList.contains("waiting")) { streaming.el.classList.remove("waiting"); streaming.el.classList.add("streaming"); }
    streaming.text += msg.text;
    scheduleRender();
  }

  function finishStreaming() {
    if (!streaming) return null;
    if (streaming.frame) cancelAnimationFrame(streaming.frame);
    const s = streaming; streaming = null;
    s.el.classList.remove("waiting", "streaming");
    setBusy(false);
    return s;
  }

  function onDone(msg) {
    markRunning(conversationId, false);
    const s = finishStreaming();
    if (!s) return;
    if (msg.message) {
      const m = Object.assign({}, msg.message, { tokens_per_s: msg.tokens_per_s });
      keepScroll(() => s.el.replaceWith(messageEl(m)));
    } else {
      s.el.remove(); // stopped before the first token
    }
  }

  let unsent = ""; // the message just sent, given back to the box if the turn is refused before it starts
  function onError(msg) {
    if (!streaming && unsent && !promptEl.value) promptEl.value = unsent;
    unsent = "";
    // A refused turn leaves the answer already running (if any) as it is.
    if (["busy", "server_shutting_down"].indexOf(msg.code) >= 0) { showError(msg.message); return; }
    settingsPanel.showError(msg);
    markRunning(conversationId, false);
    const s = finishStreaming();
    if (s && !s.text) s.el.remove();
    showError(msg.message || "Something went wrong.");
  }

  // ---------------------------------------------------------------- socket
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(`${scheme}://${location.host}/ws/chat/`);
    socket.addEventListener("open", () => {
      connectionEl.textContent = "connected"; connectionEl.className = "connection ok";
      // An answer of this conversation may be running (written while the page was away): follow it.
      if (conversationId) socket.send(JSON.stringify({ type: "attach", conversation: conversationId }));
      followLink();
    });
    socket.addEventListener("message", (event) => {
      const msg = JSON.parse(event.data);
      ({ start: onStart, resume: onResume, idle: onIdle, path: onPath, presets: settingsPanel.onPresets, delta: onDelta, done: onDone, error: onError }[msg.type]
        || (() => {}))(msg);
    });
    socket.addEventListener("close", (event) => {
      connectionEl.textContent = "disconnected"; connectionEl.className = "connection bad";
      // The answer keeps running on the server; the next socket attaches to it again.
      const s = finishStreaming();
      if (s) s.el.remove();
      if (event.code === 4401) { location.href = "/accounts/login/?next=" + encodeURIComponent(location.pathname); return; }
      setTimeout(connect, event.code === 4429 ? 15000 : 1500);  // 4429: too many sockets open
    });
  }

  function send(payload, turn = true) {
    if (!socket || socket.readyState !== WebSocket.OPEN) { showError("Not connected to the server; retrying…"); return false; }
    if (turn && !modelEl.value) { showError("No model is active. Activate one in the admin first."); return false; }
    socket.send(JSON.stringify(turn ? Object.assign(settings(), payload) : payload));
    return true;
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const content = promptEl.value;
    if (!content.trim() || streaming) return;
    const shown = messagesEl.querySelectorAll(".message[data-id]");
    const parent = shown.length ? Number(shown[shown.length - 1].dataset.id) : null;  // continue the branch shown
    if (send({ type: "send", conversation: conversationId, parent, content, documents: attached.pending() })) {
      unsent = content; promptEl.value = "";
    }
  });
  promptEl.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  stopBtn.addEventListener("click", () => socket && socket.send(JSON.stringify({ type: "stop", conversation: conversationId })));

  // ---------------------------------------------------------------- start
  state.messages.forEach((m) => messagesEl.appendChild(messageEl(m)));
  refreshEmptyState();
  messagesEl.scrollTop = messagesEl.scrollHeight;
  connect();
  promptEl.focus();
})();
