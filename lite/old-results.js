/*
 * A check result on screen is the current one, or says it is old. When a notebook is
 * opened (a reload included), the outputs of its check cells ("Check your work",
 * ``self_check``, and each challenge's sanity check, ``check_*``) come from the saved
 * file: from a run of earlier answers, maybe not the ones saved since. Each such output
 * gets a first line saying so and how to get the current result; running the cell
 * replaces it. The notebook is left unmodified (no unsaved mark): the line is added to
 * the view's model only, and goes to the file only if the learner saves before running
 * the cell again (it is then not added twice). Added to lab/index.html by
 * scripts/build_lite.py.
 */
(function () {
  "use strict";
  const CHECK_CELL = /^(self_check|check_.+)$/;
  const NOTE =
    "Result of an earlier run, before this page was loaded: it may not match the " +
    "answers saved since. Run this cell again for the current result.\n";
  const seen = new WeakSet();

  function isOld(outputs) {
    const first = outputs.length ? outputs.get(0).toJSON() : null;
    return Boolean(first && [].concat(first.text || "").join("") === NOTE);
  }

  function markOld(model) {
    const wasDirty = model.dirty;
    let marked = 0;
    for (let i = 0; i < model.cells.length; i++) {
      const cell = model.cells.get(i);
      const id = (cell.getMetadata("nbgrader") || {}).grade_id || "";
      if (cell.type !== "code" || !CHECK_CELL.test(id)) continue;
      const outputs = cell.outputs;
      if (!outputs.length || isOld(outputs)) continue;
      const old = outputs.toJSON();
      outputs.clear();
      outputs.add({ output_type: "stream", name: "stderr", text: NOTE });
      for (const output of old) outputs.add(output);
      marked++;
    }
    if (marked && !wasDirty) {
      // The model may report the change after this task (its shared document's events).
      model.dirty = false;
      window.setTimeout(() => { model.dirty = false; }, 0);
    }
    return marked;
  }

  function watch(app) {
    const visit = () => {
      for (const widget of app.shell.widgets("main")) {
        const context = widget.context;
        if (!context || seen.has(widget) || !context.path.endsWith(".ipynb")) continue;
        seen.add(widget);
        context.ready.then(() => markOld(context.model))
          .catch((err) => console.error("old results:", err));
      }
    };
    visit();
    app.shell.layoutModified.connect(visit);
    app.shell.currentChanged.connect(visit);
  }

  const poll = window.setInterval(function () {
    const app = window.jupyterapp; // exposeAppInBrowser in jupyter-lite.json
    if (app && app.restored) {
      window.clearInterval(poll);
      app.restored.then(() => watch(app)).catch((err) => console.error("old results:", err));
    }
  }, 100);
})();
