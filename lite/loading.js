/*
 * The loading view of the exercise page (its markup, loading.html, is in lab/index.html
 * itself, so it is on screen from the first paint, before any script has run). It says
 * what is loading, in the order a learner waits for it:
 *
 * 1. the notebook editor: JupyterLab's scripts, until the app has restored its layout;
 * 2. Python in this tab: the kernel's files (Pyodide, its standard library, the wheels of
 *    IPython and kvlib; listed with their sizes in preload.json by scripts/build_lite.py)
 *    and its start, until the notebook's kernel is idle. The page fetches those files
 *    itself as soon as it opens, two at a time, while JupyterLab loads: the download
 *    overlaps the editor's start instead of following it, the bytes received are shown,
 *    and the kernel's worker then reads the same addresses from the browser's cache;
 * 3. ready.
 *
 * Once the editor is shown, the view shrinks to a panel in the corner (the notebook can
 * be read meanwhile) and leaves when the kernel is ready. Each step's time (milliseconds
 * since navigation) is kept in window.kvlibLoading.marks for scripts/bench_lite.py.
 */
(function () {
  "use strict";
  const PRELOAD = "../static/kvlib/preload.json";
  const PARALLEL = 2; // leaves the browser's other connections to JupyterLab's scripts
  const MIB = 1024 * 1024;
  const state = { marks: {}, received: 0, total: 0 };
  window.kvlibLoading = state;

  const byId = (id) => document.getElementById(id);
  const mark = (name) => {
    if (!(name in state.marks)) state.marks[name] = Math.round(performance.now());
  };

  function say(text) {
    const now = byId("kvlib-loading-now");
    if (now && now.textContent !== text) now.textContent = text;
  }

  function step(id, value) {
    const item = byId(id);
    if (item) item.dataset.state = value;
  }

  function showBytes() {
    const detail = byId("kvlib-python-detail");
    if (!detail || !state.total) return;
    const done = state.received >= state.total;
    detail.textContent = done ? "(downloaded)" :
      `(${(state.received / MIB).toFixed(1)} of ${(state.total / MIB).toFixed(1)} MiB)`;
  }

  async function fetchOne(url) {
    const response = await fetch(url, { priority: "low" });
    if (!response.ok || !response.body) return;
    const reader = response.body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      state.received += value.byteLength;
      showBytes();
    }
  }

  async function preload() {
    const files = await (await fetch(PRELOAD)).json();
    state.total = files.reduce((sum, file) => sum + file.bytes, 0);
    const queue = files.map((file) => new URL(file.url, new URL(PRELOAD, location.href)).href);
    const worker = async () => {
      while (queue.length) await fetchOne(queue.shift()).catch(() => undefined);
    };
    await Promise.all(Array.from({ length: PARALLEL }, worker));
    state.received = Math.max(state.received, state.total);
    showBytes();
    mark("downloaded");
  }

  // The notebook the page opened: the current tab, or the first notebook in the main
  // area (nothing is current while the student-id dialog holds the focus).
  function notebookPanel(app) {
    const current = app.shell.currentWidget;
    if (current && current.sessionContext) return current;
    for (const widget of app.shell.widgets("main")) {
      if (widget.sessionContext) return widget;
    }
    return null;
  }

  function kernelOf(app) {
    const panel = notebookPanel(app);
    const context = panel && panel.sessionContext;
    return context && context.session ? context.session.kernel : null;
  }

  function follow(app) {
    const view = byId("kvlib-loading");
    mark("editor");
    step("kvlib-step-editor", "done");
    step("kvlib-step-python", "active");
    view.classList.replace("kvlib-loading-full", "kvlib-loading-corner");
    const since = performance.now();
    const timer = window.setInterval(() => {
      if (!notebookPanel(app) && performance.now() - since > 5000) {
        window.clearInterval(timer); // no notebook open: nothing to start
        view.remove();
        return;
      }
      const kernel = kernelOf(app);
      const status = kernel ? kernel.status : "";
      if (status === "idle" || status === "busy") {
        window.clearInterval(timer);
        mark("kernel");
        step("kvlib-step-python", "done");
        step("kvlib-step-ready", "done");
        say("Python is ready: run the notebook from the top.");
        window.setTimeout(() => view.remove(), 4000);
      } else if (status === "dead") {
        say("Python could not start in this tab: reload the page to try again.");
      } else if (state.total && state.received < state.total) {
        say("Starting Python in this tab: downloading its files…");
      } else {
        say("Starting Python in this tab: loading IPython and kvlib…");
      }
    }, 250);
  }

  document.addEventListener("DOMContentLoaded", () => {
    const started = performance.now();
    const clock = window.setInterval(() => {
      const elapsed = byId("kvlib-loading-elapsed");
      if (!elapsed) return window.clearInterval(clock);
      elapsed.textContent = String(Math.round((performance.now() - started) / 1000));
    }, 1000);
    preload().catch((err) => console.warn("preload:", err));
    const poll = window.setInterval(() => {
      const app = window.jupyterapp; // exposeAppInBrowser in jupyter-lite.json
      if (app && app.restored) {
        window.clearInterval(poll);
        app.restored.then(() => follow(app)).catch((err) => console.error("loading:", err));
      }
    }, 100);
  });
})();
