/*
 * The exercise notebooks draw each learner's own numbers from a student id. The first
 * time the site's JupyterLab opens in a browser, this page asks for it in a dialog of its
 * own (an HTML <dialog>, part of the page: no browser prompt), says what it is for and
 * how to change it, and keeps it in kvlib_student_id.txt at the top of the browser's
 * file storage (JupyterLite's contents, which outlive the tab). The kernel reads that
 * file before each cell (kvlib_lite/startup.py), so a changed id counts
 * from the next cell run. A button at the top right of the page shows the id and opens
 * the same dialog to change it. Added to lab/index.html by scripts/build_lite.py.
 */
(function () {
  "use strict";
  const FILE = "kvlib_student_id.txt";
  const DEFAULT_ID = "self-study"; // course.checks.DEFAULT_STUDENT

  function element(tag, attributes, children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (name === "text") node.textContent = value;
      else node.setAttribute(name, value);
    }
    for (const child of children || []) node.append(child);
    return node;
  }

  async function storedId(contents) {
    try {
      const model = await contents.get(FILE, { content: true, format: "text", type: "file" });
      return String(model.content || "").trim();
    } catch (missing) {
      return null; // never asked in this browser
    }
  }

  function buildDialog() {
    const input = element("input", {
      id: "kvlib-id-input", name: "student-id", type: "text", autocomplete: "off",
      spellcheck: "false", placeholder: DEFAULT_ID,
    });
    const form = element("form", { method: "dialog" }, [
      element("h2", { id: "kvlib-id-title", text: "Your student id" }),
      element("p", { id: "kvlib-id-purpose" }, [
        "Each challenge draws its numbers from this id, and “Check your work” grades " +
        "your answers for it: use the id your course gave you, so that your numbers are " +
        "the ones your course grades. Studying on your own? Leave it blank: the id is then ",
        element("code", { text: DEFAULT_ID }), ".",
      ]),
      element("label", { for: "kvlib-id-input", text: "Student id" }),
      input,
      element("p", { id: "kvlib-id-keep" }, [
        "It is kept in this browser, in the file ", element("code", { text: FILE }),
        ". To change it later, use the “Student id” button at the top right of the " +
        "page, then run the notebook again from the top: your numbers change with it.",
      ]),
      element("div", { class: "kvlib-id-buttons" }, [
        element("button", { type: "submit", value: "save", text: "Save" }),
      ]),
    ]);
    const dialog = element("dialog", {
      id: "kvlib-id-dialog", "aria-labelledby": "kvlib-id-title",
      "aria-describedby": "kvlib-id-purpose kvlib-id-keep",
    }, [form]);
    document.body.append(dialog);
    return { dialog, input };
  }

  function buildButton() {
    const button = element("button", {
      id: "kvlib-id-button", type: "button", title: "Change your student id",
    });
    document.body.append(button);
    return button;
  }

  // Show the dialog (current id filled in) and resolve with the id saved.
  function ask(parts, current) {
    const { dialog, input } = parts;
    return new Promise((resolve) => {
      input.value = current && current !== DEFAULT_ID ? current : "";
      // Escape closes the dialog too: a learner who dismisses it keeps the id shown.
      const keep = () => { input.value = current || ""; };
      dialog.addEventListener("cancel", keep);
      dialog.addEventListener("close", () => {
        dialog.removeEventListener("cancel", keep);
        resolve(input.value.trim() || DEFAULT_ID);
      }, { once: true });
      dialog.showModal();
      input.focus();
    });
  }

  // A notebook opened while the dialog held the focus never became JupyterLab's current
  // tab (its toolbar and Run menu act on the current one): make it current now.
  function refocus(app) {
    if (app.shell.currentWidget) return;
    const notebook = Array.from(app.shell.widgets("main")).find((widget) => widget.context);
    if (notebook) app.shell.activateById(notebook.id);
  }

  async function start(app) {
    const contents = app.serviceManager.contents;
    const parts = buildDialog();
    const button = buildButton();
    let current = await storedId(contents);
    const show = (id) => {
      button.textContent = "Student id: " + id;
      button.dataset.studentId = id;
    };
    const change = async () => {
      const id = await ask(parts, current);
      refocus(app);
      await contents.save(FILE, { type: "file", format: "text", content: id + "\n" });
      current = id;
      show(id);
    };
    button.addEventListener("click", () => {
      change().catch((err) => console.error("student id:", err));
    });
    if (current === null) {
      await change();
    } else {
      show(current || DEFAULT_ID);
    }
  }

  const poll = window.setInterval(function () {
    const app = window.jupyterapp; // exposeAppInBrowser in jupyter-lite.json
    if (app && app.serviceManager) {
      window.clearInterval(poll);
      app.restored.then(() => start(app)).catch((err) => console.error("student id:", err));
    }
  }, 100);
})();
