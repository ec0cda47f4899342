// pallas-course: size each embedded kernelsim player to its content (same origin, no network).
(function () {
  function fit(frame) {
    try {
      var doc = frame.contentDocument;
      if (!doc || !doc.body) return;
      frame.style.height = (doc.documentElement.scrollHeight + 8) + "px";
    } catch (e) { /* a player opened from another origin keeps its CSS height */ }
  }
  function attach(root) {
    root.querySelectorAll(".ks-player-embed iframe").forEach(function (frame) {
      if (frame.dataset.ksFit) return;
      frame.dataset.ksFit = "1";
      frame.addEventListener("load", function () {
        fit(frame);
        var doc = frame.contentDocument;
        if (doc && window.ResizeObserver) new ResizeObserver(function () { fit(frame); })
          .observe(doc.documentElement);
      });
      if (frame.contentDocument && frame.contentDocument.readyState === "complete") fit(frame);
    });
  }
  // Material's instant navigation replaces the page body: re-attach on each new page
  if (window.document$ && window.document$.subscribe) {
    window.document$.subscribe(function () { attach(document); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { attach(document); });
  }
})();
