// The sidebar as a drawer below 700 px (templates/shell.html): ☰ opens it over the page, the
// backdrop, × or Escape close it and give the focus back to ☰. While closed on a narrow screen
// it is hidden from focus and from screen readers (visibility, in base.css).
(function () {
  "use strict";
  const body = document.body;
  const sidebar = document.getElementById("sidebar");
  const opener = document.querySelector(".drawer-button");
  const backdrop = document.querySelector(".drawer-backdrop");
  if (!sidebar || !opener) return;

  function setOpen(open) {
    body.classList.toggle("drawer-open", open);
    opener.setAttribute("aria-expanded", String(open));
    backdrop.hidden = !open;
    if (open) {
      const first = sidebar.querySelector("a[href], button:not([hidden]), input:not([type=hidden])");
      if (first) first.focus();
    } else if (sidebar.contains(document.activeElement)) opener.focus();
  }
  window.PagodaDrawer = { open: () => setOpen(true), close: () => setOpen(false) };

  opener.addEventListener("click", () => setOpen(!body.classList.contains("drawer-open")));
  document.querySelectorAll("[data-drawer-close]").forEach((el) => el.addEventListener("click", () => setOpen(false)));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && body.classList.contains("drawer-open")) { event.stopPropagation(); setOpen(false); }
  }, true);
  // Back to a wide window: the sidebar is in the layout again, not a drawer.
  window.matchMedia("(min-width: 701px)").addEventListener("change", (m) => { if (m.matches) setOpen(false); });
})();
