/*
 * Names and roles JupyterLab 4.6's notebook leaves out, which screen readers need and
 * axe-core reports as critical or serious on this page:
 *
 * - each cell's code editor (CodeMirror's role="textbox") has no name: it gets
 *   "Cell input";
 * - the cells' list (role="feed") holds cells without a role: each gets "article", the
 *   role a feed's items must have;
 * - the button that folds a markdown heading's section has no name: it gets "Fold or
 *   unfold this section".
 *
 * JupyterLab draws cells as they scroll into view, so the page checks again after each
 * change of its content (at most once per frame). Added to lab/index.html by
 * scripts/build_lite.py.
 */
(function () {
  "use strict";
  const FIXES = [
    [".jp-Notebook .cm-content[role='textbox']:not([aria-label])", "aria-label", "Cell input"],
    ["[role='feed'] > .jp-Cell:not([role])", "role", "article"],
    ["button.jp-collapseHeadingButton:not([aria-label])", "aria-label",
      "Fold or unfold this section"],
  ];
  let queued = false;

  function fix() {
    queued = false;
    for (const [selector, name, value] of FIXES) {
      for (const node of document.querySelectorAll(selector)) node.setAttribute(name, value);
    }
  }

  function queue() {
    if (!queued) {
      queued = true;
      window.requestAnimationFrame(fix);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    new MutationObserver(queue).observe(document.body, { childList: true, subtree: true });
    queue();
  });
})();
