// The chat page's settings panel: every sampling parameter of the API, system prompt presets
// (everyone's from staff, and the user's own, saved over the socket) and staff's per-model
// defaults. The server checks every value against the API's limits; the inputs only help. Under
// each value the panel says where it comes from: the model's default (staff's, console "Chat
// defaults"), your setting, the page's or the engine's default.
window.PagodaSettings = function (state, sendFrame) {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const panel = document.querySelector("details.settings");
  const inputs = [...document.querySelectorAll(".settings-panel [data-param]")];
  const pageDefaults = {};
  inputs.forEach((el) => { pageDefaults[el.dataset.param] = el.value; });
  const presetEl = $("preset"), systemEl = $("system-prompt"), modelEl = $("model");
  let presets = state.presets || [];

  // ---- where each value comes from
  const SOURCES = { model: "model default", yours: "your setting", page: "page default", engine: "engine default",
                    none: "none" };
  const sourceEls = new Map();
  [...inputs, systemEl].forEach((el) => {
    const tag = document.createElement("span");
    tag.className = "source";
    tag.id = `${el.id}-source`;
    el.after(tag);
    el.setAttribute("aria-describedby", tag.id);
    sourceEls.set(el, tag);
  });
  const same = (a, b) => (a === "" || b === "" || isNaN(Number(a)) ? String(a) === String(b) : Number(a) === Number(b));
  function sourceOf(el) {
    const defaults = (state.defaults || {})[modelEl.value] || {};
    if (el === systemEl) {
      if (defaults.system_prompt && el.value === defaults.system_prompt) return "model";
      return el.value.trim() ? "yours" : "none";
    }
    const param = el.dataset.param, fromModel = (defaults.sampling || {})[param];
    const given = Array.isArray(fromModel) ? fromModel.join("\n") : fromModel;
    if (given !== undefined && given !== null && same(el.value, given)) return "model";
    if (el.value === "") return "engine";
    if (pageDefaults[param] !== "" && same(el.value, pageDefaults[param])) return "page";
    return "yours";
  }
  function showSources() {
    sourceEls.forEach((tag, el) => {
      const source = sourceOf(el);
      tag.className = `source ${source}`;
      tag.dataset.source = source;
      tag.textContent = SOURCES[source];
    });
  }
  [...inputs, systemEl].forEach((el) => el.addEventListener("input", showSources));

  function fill(sampling) {
    inputs.forEach((el) => {
      const value = sampling[el.dataset.param];
      if (value !== undefined && value !== null) el.value = Array.isArray(value) ? value.join("\n") : String(value);
    });
  }

  // A new conversation starts from the model's defaults; a saved one from its own last settings.
  function applyModelDefaults() {
    inputs.forEach((el) => { el.value = pageDefaults[el.dataset.param]; });
    const defaults = (state.defaults || {})[modelEl.value];
    if (defaults) {
      fill(defaults.sampling || {});
      if (defaults.system_prompt && !state.conversation) systemEl.value = defaults.system_prompt;
    }
  }

  // Knowledge bases: one checkbox each; the chosen ones travel with every turn and stay attached.
  const baseList = $("knowledge-list");
  function renderBases() {
    const attached = new Set(state.attached_bases || []);
    baseList.replaceChildren();
    (state.knowledge_bases || []).forEach((b) => {
      const label = document.createElement("label");
      label.className = "knowledge-base";
      const box = document.createElement("input");
      box.type = "checkbox"; box.value = String(b.id); box.checked = attached.has(b.id);
      box.dataset.knowledgeBase = b.name;
      label.append(box, " " + b.name + (b.team ? ` (team ${b.team})` : ""));
      baseList.append(label);
    });
    if (!(state.knowledge_bases || []).length) {
      const none = document.createElement("span");
      none.className = "muted small"; none.textContent = "None yet.";
      baseList.append(none);
    }
  }

  function collect() {
    const out = { system_prompt: systemEl.value };
    out.knowledge_bases = [...baseList.querySelectorAll("input[type=checkbox]:checked")].map((el) => Number(el.value));
    inputs.forEach((el) => {
      const name = el.dataset.param;
      // Numbers travel as their text (a seed may exceed what a JS number holds exactly).
      out[name] = name === "stop" ? el.value.split("\n").filter((s) => s.length) : (el.value === "" ? null : el.value);
    });
    return out;
  }

  function renderPresets() {
    const chosen = presetEl.value;
    presetEl.replaceChildren(new Option("(none)", ""));
    presets.forEach((p) => presetEl.appendChild(new Option(p.shared ? `${p.name} (shared)` : p.name, String(p.id))));
    if (presets.some((p) => String(p.id) === chosen)) presetEl.value = chosen;
    const current = presets.find((p) => String(p.id) === presetEl.value);
    $("preset-delete").disabled = !current || current.shared;
  }

  presetEl.addEventListener("change", () => {
    const preset = presets.find((p) => String(p.id) === presetEl.value);
    if (preset) systemEl.value = preset.text;
    // A preset that brings knowledge bases checks them (one without leaves the boxes as they are).
    if (preset && (preset.knowledge_bases || []).length) {
      const wanted = new Set(preset.knowledge_bases.map(String));
      baseList.querySelectorAll("input[type=checkbox]").forEach((box) => { box.checked = wanted.has(box.value); });
    }
    renderPresets();
    showSources();
  });
  $("preset-save").addEventListener("click", () => {
    const current = presets.find((p) => String(p.id) === presetEl.value);
    const name = window.prompt("Save this system prompt as", current && !current.shared ? current.name : "");
    if (name && name.trim()) sendFrame({ type: "preset_save", name: name.trim(), text: systemEl.value,
                                         knowledge_bases: collect().knowledge_bases });
  });
  $("preset-delete").addEventListener("click", () => {
    if (presetEl.value) sendFrame({ type: "preset_delete", id: Number(presetEl.value) });
  });
  modelEl.addEventListener("change", () => { if (!state.conversation) applyModelDefaults(); showSources(); });

  // A refused setting: the panel opens on the field the server named.
  function showError(msg) {
    const field = inputs.find((el) => el.dataset.param === msg.param);
    const errorEl = $("settings-error");
    errorEl.hidden = !field;
    if (!field) return;
    errorEl.textContent = msg.message;
    panel.open = true;
    field.setAttribute("aria-invalid", "true");
    field.focus();
  }
  function clearError() {
    $("settings-error").hidden = true;
    inputs.forEach((el) => el.removeAttribute("aria-invalid"));
  }

  applyModelDefaults();
  if (state.conversation) fill(state.sampling || {});
  renderPresets();
  renderBases();
  showSources();
  return {
    collect, showError, clearError,
    onPresets(msg) { presets = msg.presets; renderPresets(); const last = presets.find((p) => !p.shared && p.text === systemEl.value); if (last) { presetEl.value = String(last.id); renderPresets(); } },
  };
};
