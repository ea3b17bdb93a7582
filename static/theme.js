// The colour theme of every page. Loaded in <head> without defer, so the theme is set before the
// first paint. The system's setting (prefers-color-scheme) rules unless the person pressed the
// toggle for the other theme; that choice is kept in this browser's localStorage (there is no
// per-user settings model on the server, and a theme is a property of a screen as much as of a
// person). Choosing the system's own theme again forgets the choice, so the page follows the
// system from then on. Stylesheets marked data-theme-sheet="light|dark" (the code highlighting)
// are switched with it; "pagoda:theme" is dispatched on window for what draws its own colours
// (the console's charts).
window.PagodaTheme = (function () {
  "use strict";
  const KEY = "pagoda-theme";
  const root = document.documentElement;
  const system = window.matchMedia("(prefers-color-scheme: dark)");

  function chosen() {
    try {
      const value = localStorage.getItem(KEY);
      return value === "light" || value === "dark" ? value : null;
    } catch (e) { return null; }  // storage refused (a locked-down browser): follow the system
  }
  const systemTheme = () => (system.matches ? "dark" : "light");
  const current = () => chosen() || systemTheme();

  function apply() {
    const theme = current();
    if (chosen()) root.dataset.theme = theme; else delete root.dataset.theme;  // CSS: color-scheme
    root.dataset.themeShown = theme;
    document.querySelectorAll("link[data-theme-sheet]").forEach((link) => {
      link.media = link.dataset.themeSheet === theme ? "all" : "not all";
    });
    document.querySelectorAll("[data-theme-toggle]").forEach((button) => {
      button.setAttribute("aria-pressed", String(theme === "dark"));
      button.title = theme === "dark" ? "Switch to the light theme" : "Switch to the dark theme";
    });
    window.dispatchEvent(new CustomEvent("pagoda:theme", { detail: { theme } }));
  }

  function toggle() {
    const next = current() === "dark" ? "light" : "dark";
    try {
      if (next === systemTheme()) localStorage.removeItem(KEY); else localStorage.setItem(KEY, next);
    } catch (e) { /* storage refused: nothing can be remembered */ }
    apply();
  }

  apply();
  system.addEventListener("change", apply);
  window.addEventListener("storage", (event) => { if (event.key === KEY) apply(); });  // another tab chose
  document.addEventListener("DOMContentLoaded", () => {
    apply();
    document.querySelectorAll("[data-theme-toggle]").forEach((button) => button.addEventListener("click", toggle));
  });
  return { current, toggle };
})();
