/*
 * The exercise notebooks draw each learner's own numbers from a student id. This page
 * asks for it once, the first time the site's JupyterLab opens in a browser, and keeps
 * it in kvlib_student_id.txt at the top of the browser's file storage (JupyterLite's
 * contents, which outlive the tab). The kernel reads that file before the first cell
 * that uses kvlib (kvlib_lite/startup.py). Delete the file and reload to change the id.
 * Added to lab/index.html by scripts/build_lite.py.
 */
(function () {
  "use strict";
  const FILE = "kvlib_student_id.txt";
  const DEFAULT_ID = "self-study"; // kvlib.grading.DEFAULT_STUDENT
  const QUESTION =
    "Your student id, as your course gives it (leave blank for self-study).\n" +
    "Your numbers are drawn from it; it is kept in this browser.";

  async function askOnce(app) {
    const contents = app.serviceManager.contents;
    try {
      await contents.get(FILE, { content: false });
      return; // asked before
    } catch (missing) {
      // not asked yet in this browser
    }
    const answer = window.prompt(QUESTION, "");
    const id = (answer || "").trim() || DEFAULT_ID;
    await contents.save(FILE, { type: "file", format: "text", content: id + "\n" });
  }

  const poll = window.setInterval(function () {
    const app = window.jupyterapp; // exposeAppInBrowser in jupyter-lite.json
    if (app && app.serviceManager) {
      window.clearInterval(poll);
      app.restored.then(() => askOnce(app)).catch((err) => console.error("student id:", err));
    }
  }, 100);
})();
