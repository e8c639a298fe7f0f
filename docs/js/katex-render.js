// The formulas, rendered by the KaTeX shipped with the site (docs/assets/katex): no network needed.
// pymdownx.arithmatex (generic mode) writes each formula as the text of an element of class
// "arithmatex": \( ... \) in a <span> (inline), \[ ... \] in a <div> (display).
function renderMath() {
  document.querySelectorAll(".arithmatex").forEach(function (element) {
    if (element.querySelector(".katex")) return;  // rendered already (instant navigation)
    var tex = element.textContent.trim();
    var display = tex.startsWith("\\[");
    if (tex.startsWith("\\(") || display) tex = tex.slice(2, -2);
    katex.render(tex, element, {displayMode: display, throwOnError: false});
  });
}

if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);  // Material for MkDocs: every page shown, with or without instant loading
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
