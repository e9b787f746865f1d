/*
 * Names, roles and states JupyterLab 4.6's page gets wrong or leaves out, which screen
 * readers need and axe-core reports as critical or serious on this page:
 *
 * - each cell's code editor (CodeMirror's role="textbox") has no name: it gets
 *   "Cell input";
 * - the cells' list (role="feed") holds cells without a role: each gets "article", the
 *   role a feed's items must have;
 * - the button that folds a markdown heading's section has no name: it gets "Fold or
 *   unfold this section";
 * - the toolbars' buttons (the toolkit's <jp-button>, a custom element without a role)
 *   get "aria-pressed" written on the element itself, where it is not allowed (only a
 *   button may be pressed). The element copies its pressed state onto the real <button>
 *   inside its shadow root, where it belongs: the page turns JupyterLab's writes of the
 *   attribute on the outer element into writes of the element's state (its ariaPressed
 *   property), so the inner button says pressed or not as before and the outer element
 *   carries no attribute it may not have. One written before this script ran is moved
 *   the same way;
 * - the filter box's clear button (inside the toolkit's <jp-search>) has no name: it
 *   gets "Clear the filter".
 * - reflow in a narrow window (a phone, or a laptop's window at 400% zoom: 320 CSS px):
 *   JupyterLab keeps its file browser open beside the notebook and widens the page past
 *   the window (450 px at least), the notebook squeezed out of view. Below NARROW_PX the
 *   page closes the side panels and shows one document at a time (JupyterLab's "simple"
 *   mode), once as the window narrows, so the learner may open them again; it puts the
 *   mode back when the window widens (or at the next wide start, the layout being kept).
 *
 * JupyterLab draws cells as they scroll into view and sets a button's state when it
 * changes, so the page checks again after each change of its content or of a button's
 * "aria-pressed" (at most once per frame). Added to lab/index.html by
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
  const TOOLKIT_BUTTON = "jp-button";
  const STATE = "aria-pressed";
  const CLEAR_BUTTON = "button.clear-button:not([aria-label])";
  let queued = false;

  // A <jp-button> the toolkit has upgraded (its ariaPressed is the element's own state).
  function toolkitButton(node) {
    const ButtonClass = customElements.get(TOOLKIT_BUTTON);
    return Boolean(ButtonClass) && node instanceof ButtonClass;
  }

  const setAttribute = Element.prototype.setAttribute;
  const removeAttribute = Element.prototype.removeAttribute;
  Element.prototype.setAttribute = function (name, value) {
    if (String(name).toLowerCase() === STATE && toolkitButton(this)) {
      this.ariaPressed = String(value);
      return undefined;
    }
    return setAttribute.call(this, name, value);
  };
  Element.prototype.removeAttribute = function (name) {
    if (String(name).toLowerCase() === STATE && toolkitButton(this)) this.ariaPressed = null;
    return removeAttribute.call(this, name);
  };

  function moveState() {
    for (const button of document.querySelectorAll(`${TOOLKIT_BUTTON}[${STATE}]`)) {
      if (!toolkitButton(button)) continue;
      const pressed = button.getAttribute(STATE);
      removeAttribute.call(button, STATE); // the element sets its state to null...
      button.ariaPressed = pressed; // ...and back
    }
    for (const search of document.querySelectorAll("jp-search")) {
      const clear = search.shadowRoot && search.shadowRoot.querySelector(CLEAR_BUTTON);
      if (clear) clear.setAttribute("aria-label", "Clear the filter");
    }
  }

  function fix() {
    queued = false;
    for (const [selector, name, value] of FIXES) {
      for (const node of document.querySelectorAll(selector)) node.setAttribute(name, value);
    }
    moveState();
  }

  function queue() {
    if (!queued) {
      queued = true;
      window.requestAnimationFrame(fix);
    }
  }

  customElements.whenDefined(TOOLKIT_BUTTON).then(queue);

  const NARROW_PX = 760; // JupyterLab's own breakpoint for small screens
  const SWITCHED = "kvlib-narrow-simple-mode"; // set while the page holds simple mode
  const narrow = window.matchMedia(`(max-width: ${NARROW_PX}px)`);

  function fitWidth(shell) {
    if (narrow.matches) {
      shell.collapseLeft();
      shell.collapseRight();
      if (shell.mode !== "single-document") {
        shell.mode = "single-document";
        window.localStorage.setItem(SWITCHED, "1");
      }
    } else if (window.localStorage.getItem(SWITCHED)) {
      window.localStorage.removeItem(SWITCHED);
      shell.mode = "multiple-document";
    }
  }

  const waitForApp = window.setInterval(() => {
    const app = window.jupyterapp; // exposeAppInBrowser in jupyter-lite.json
    if (!app || !app.restored) return;
    window.clearInterval(waitForApp);
    app.restored.then(() => {
      fitWidth(app.shell);
      narrow.addEventListener("change", () => fitWidth(app.shell));
    });
  }, 100);

  document.addEventListener("DOMContentLoaded", () => {
    new MutationObserver(queue).observe(document.body, {
      childList: true, subtree: true, attributes: true, attributeFilter: [STATE],
    });
    queue();
  });
})();
