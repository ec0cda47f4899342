// pallas-course: a lesson's figures fit the column; where one is shown smaller than drawn (a
// phone), a tap or Enter shows it at its full size, scrolling sideways inside its own box.
(() => {
  const HINT = "Tap the figure to see it at full size.";

  function setUp(img) {
    const box = img.parentElement;
    if (box.classList.contains("ks-figure")) return;
    box.classList.add("ks-figure");
    const shrunk = () => img.naturalWidth > img.getBoundingClientRect().width + 1;
    const hint = document.createElement("p");
    hint.className = "ks-figure-hint";
    hint.textContent = HINT;
    // under the figure's output row, not in it: JupyterLab lays that row out as a flex row,
    // where a hint beside the figure took half a phone's width from it
    (box.closest(".jp-OutputArea-child") || box).after(hint);
    const update = () => {
      const full = box.classList.contains("ks-full");
      hint.style.display = full || shrunk() ? "block" : "none";
      hint.textContent = full ? "Tap the figure again to fit it to the page." : HINT;
      if (full || shrunk()) {
        img.setAttribute("tabindex", "0");
        img.setAttribute("role", "button");
        img.setAttribute("aria-pressed", String(full));
      } else {
        for (const a of ["tabindex", "role", "aria-pressed"]) img.removeAttribute(a);
      }
    };
    const toggle = () => {
      if (!box.classList.contains("ks-full") && !shrunk()) return;
      box.classList.toggle("ks-full");
      update();
    };
    img.addEventListener("click", toggle);
    img.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); toggle(); }
    });
    if (img.complete) update(); else img.addEventListener("load", update);
    addEventListener("resize", update);
  }

  const start = () => document.querySelectorAll(".jupyter-wrapper .jp-OutputArea-output > img")
    .forEach(setUp);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
