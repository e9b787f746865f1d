/*
 * The calculator page: runs `kvlib size` itself in the browser on Pyodide.
 *
 * Pyodide's core (../pyodide/, copied from the npm package at build time) and kvlib's
 * pure-Python modules (kvlib.zip beside this file, packed by scripts/pack_kvlib.py)
 * load from this site only. The form is built from the size command's own parser
 * (kvcalc.describe), the inputs become its command line, and the page shows what the
 * command prints: the JSON of `kvlib size --json` in #kv-result, its table, its error
 * line next to the input it is about. No figure is computed in JavaScript.
 *
 * State for readers and tests: #kv-calculator[data-state] is loading, busy, ready,
 * error or failed; data-seq counts finished runs; data-plot is drawing or done;
 * data-load-ms is the time from navigation start to the first result (performance
 * marks kv-python-started, kv-kvlib-imported and kv-first-result break it down).
 */
(function () {
  "use strict";

  const script = document.currentScript;
  const ASSETS = new URL("./", script.src);
  const PYODIDE = new URL("../pyodide/", script.src);
  const SITE_DIR = "/home/pyodide/kvcalc_site";
  const PASTE = "__paste__";
  const DEBOUNCE_MS = 300;
  // Friendlier names for the flags the page knows; any other flag shows as itself.
  const LABELS = {
    model: "Model",
    context: "Context (tokens)",
    batch: "Batch (sequences)",
    kv_dtype: "KV cache dtype",
    weight_dtype: "Weight dtype",
    gpu: "GPU",
    gpu_memory_utilization: "GPU memory utilization",
    tp: "Tensor-parallel GPUs",
    kv_memory: "KV memory per GPU",
    block_size: "Block size (tokens)",
  };
  const SVG_NS = "http://www.w3.org/2000/svg";

  const root = document.getElementById("kv-calculator");
  if (!root) {
    return;
  }
  const $ = (id) => document.getElementById(id);
  let calc = null; // the kvcalc module (a PyProxy)
  let fields = [];
  let generation = 0;
  let timer = null;
  let unknownParams = []; // [name, value] of a link's parameters the command lacks

  function setStatus(text) {
    $("kv-status").textContent = text;
    $("kv-status").hidden = !text;
  }

  async function boot() {
    root.dataset.state = "loading";
    root.hidden = false;
    setStatus("Loading Python in your browser (Pyodide; cached after the first visit)…");
    const { loadPyodide } = await import(new URL("pyodide.mjs", PYODIDE).href);
    const pyodide = await loadPyodide({
      indexURL: PYODIDE.href,
      packageBaseUrl: PYODIDE.href,
      fullStdLib: false,
    });
    performance.mark("kv-python-started");
    const zip = await fetch(new URL("kvlib.zip", ASSETS));
    if (!zip.ok) {
      throw new Error(`kvlib.zip: HTTP ${zip.status}`);
    }
    pyodide.unpackArchive(await zip.arrayBuffer(), "zip", { extractDir: SITE_DIR });
    pyodide.runPython(
      `import os, sys\nsys.path.insert(0, ${JSON.stringify(SITE_DIR)})\n` +
        `os.makedirs("/home/pyodide/work", exist_ok=True)\nos.chdir("/home/pyodide/work")`
    );
    calc = pyodide.pyimport("kvcalc");
    performance.mark("kv-kvlib-imported");
    const description = JSON.parse(calc.describe_json());
    fields = description.fields;
    buildForm(description);
    applyParams(initialParams());
    for (const note of document.querySelectorAll(".kv-nojs")) {
      note.hidden = true;
    }
    setStatus("");
    await run();
  }

  function initialParams() {
    const query = new URLSearchParams(window.location.search);
    if ([...query.keys()].length > 0) {
      return query;
    }
    return new URLSearchParams(root.dataset.example || "");
  }

  // ---- the form -------------------------------------------------------------------

  function buildForm(description) {
    const form = $("kv-form");
    form.textContent = "";
    for (const field of fields) {
      const box = document.createElement("div");
      box.className = "kv-field";
      box.dataset.param = field.param;
      const label = document.createElement("label");
      label.htmlFor = `kv-in-${field.param}`;
      label.textContent = LABELS[field.param] || field.flag || field.param;
      box.append(label);
      let control;
      if (field.choices) {
        control = document.createElement("select");
        if (field.param === "model") {
          control.append(option("", "choose a model"));
        } else if (field.default === "") {
          control.append(option("", "(none)"));
        }
        for (const choice of field.choices) {
          control.append(option(choice, choice));
        }
        if (field.param === "model") {
          control.append(option(PASTE, "Paste a config.json…"));
        }
      } else if (field.switch) {
        control = document.createElement("input");
        control.type = "checkbox";
      } else {
        control = document.createElement("input");
        control.type = "text";
        control.spellcheck = false;
        control.autocomplete = "off";
        control.placeholder = field.default || "not given";
      }
      control.id = `kv-in-${field.param}`;
      control.name = field.param;
      control.dataset.default = field.default;
      control.title = field.help;
      control.addEventListener(control.tagName === "SELECT" ? "change" : "input", schedule);
      if (control.type === "checkbox") {
        control.addEventListener("change", schedule);
      }
      box.append(control);
      if (field.param === "model") {
        const paste = document.createElement("textarea");
        paste.id = "kv-paste";
        paste.rows = 8;
        paste.spellcheck = false;
        paste.placeholder = "{ \"model_type\": \"llama\", \"num_hidden_layers\": 32, … }";
        paste.setAttribute("aria-label", "config.json to size");
        paste.hidden = true;
        paste.addEventListener("input", schedule);
        control.addEventListener("change", () => {
          paste.hidden = control.value !== PASTE;
        });
        box.append(paste);
      }
      const hint = document.createElement("small");
      hint.className = "kv-hint";
      hint.textContent = `${field.flag || "CONFIG"}: ${field.help}`;
      box.append(hint);
      const error = document.createElement("div");
      error.className = "kv-error";
      error.id = `kv-error-${field.param}`;
      error.setAttribute("role", "alert");
      error.hidden = true;
      box.append(error);
      form.append(box);
    }
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      unknownParams = [];
      run();
    });
    const submit = document.createElement("button");
    submit.type = "submit";
    submit.textContent = "Compute";
    form.append(submit);
    root.dataset.command = description.command;
  }

  function option(value, text) {
    const element = document.createElement("option");
    element.value = value;
    element.textContent = text;
    return element;
  }

  function input(param) {
    return $(`kv-in-${param}`);
  }

  function applyParams(params) {
    for (const field of fields) {
      const element = input(field.param);
      const given = params.has(field.param) ? params.get(field.param) : field.default;
      if (element.type === "checkbox") {
        element.checked = ["1", "true", "yes", "on"].includes(String(given).toLowerCase());
      } else if (element.tagName === "SELECT") {
        // A linked value the list lacks is kept, so the command can say what is wrong.
        if (![...element.options].some((o) => o.value === given)) {
          element.append(option(given, given));
        }
        element.value = given;
      } else {
        element.value = given;
      }
    }
    // A link's parameters the command does not have go to kvlib once, which names them
    // (a misspelt parameter must not silently fall back to a default).
    unknownParams = [...params.keys()]
      .filter((key) => !fields.some((f) => f.param === key))
      .map((key) => [key, params.get(key)]);
  }

  function readForm() {
    const params = {};
    let pasted = null;
    for (const field of fields) {
      const element = input(field.param);
      if (field.param === "model" && element.value === PASTE) {
        pasted = $("kv-paste").value;
        continue;
      }
      if (element.type === "checkbox") {
        params[field.param] = element.checked ? "1" : "";
      } else {
        params[field.param] = element.value;
      }
    }
    for (const [key, value] of unknownParams) {
      params[key] = value;
    }
    return { params, pasted };
  }

  /* The page's address for these inputs: the model and every value off its default. */
  function linkQuery(request) {
    const query = new URLSearchParams();
    for (const field of fields) {
      const value = request.params[field.param];
      if (value !== undefined && value !== "" && value !== field.default) {
        query.set(field.param, value);
      }
    }
    for (const [key, value] of unknownParams) {
      query.set(key, value);
    }
    return query.toString();
  }

  // ---- running kvlib ----------------------------------------------------------------

  function schedule() {
    unknownParams = []; // the reader has seen the error and is editing the inputs
    clearTimeout(timer);
    timer = setTimeout(run, DEBOUNCE_MS);
  }

  async function run() {
    clearTimeout(timer);
    if (!calc) {
      return;
    }
    const gen = ++generation;
    const request = readForm();
    if (request.pasted !== null && !request.pasted.trim()) {
      setStatus("Paste the text of a config.json into the box under Model.");
      return;
    }
    setStatus("");
    root.dataset.state = "busy";
    // Yield once so the busy state can paint (not requestAnimationFrame: a hidden or
    // throttled tab may never run it).
    await new Promise((resolve) => setTimeout(resolve, 0));
    if (gen !== generation) {
      return;
    }
    let result;
    try {
      result = JSON.parse(calc.compute_json(JSON.stringify(request)));
    } catch (err) {
      fail(err);
      return;
    }
    const query = linkQuery(request);
    if (request.pasted === null) {
      window.history.replaceState(null, "", `${window.location.pathname}?${query}`);
    }
    show(result);
    root.dataset.query = query;
    root.dataset.seq = String(Number(root.dataset.seq || 0) + 1);
    if (root.dataset.loadMs === undefined) {
      performance.mark("kv-first-result");
      root.dataset.loadMs = String(Math.round(performance.now()));
    }
    root.dataset.state = result.status === 0 ? "ready" : "error";
    if (result.status === 0 && result.curve_contexts) {
      await drawCurve(gen, result);
    }
  }

  function clearErrors() {
    for (const element of root.querySelectorAll(".kv-error")) {
      element.textContent = "";
      element.hidden = true;
    }
    for (const element of root.querySelectorAll("[aria-invalid]")) {
      element.removeAttribute("aria-invalid");
    }
  }

  // The command's table as an HTML table: its own rows, split into label and value by
  // kvcalc.table_rows (nothing recomputed here). Values that start with a number are
  // right-aligned; the seat count, the figure the chapter's pages discuss, is marked.
  function showRows(rows) {
    const body = $("kv-table").tBodies[0];
    body.replaceChildren();
    for (const [label, value] of rows) {
      const row = body.insertRow();
      const head = document.createElement("th");
      head.scope = "row";
      head.textContent = label;
      row.appendChild(head);
      const cell = row.insertCell();
      cell.textContent = value;
      if (/^[0-9]/.test(value)) {
        cell.classList.add("kv-num");
      }
      if (label.startsWith("seats at")) {
        row.classList.add("kv-mark");
      }
    }
  }

  function show(result) {
    clearErrors();
    $("kv-command").textContent = result.command || "";
    $("kv-command-box").hidden = !result.command;
    if (result.status !== 0) {
      const slot = $(`kv-error-${result.field}`) || $("kv-error-general");
      slot.textContent = result.error;
      slot.hidden = false;
      const bad = input(result.field);
      if (bad) {
        bad.setAttribute("aria-invalid", "true");
      }
      $("kv-result").textContent = "";
      showRows([]);
      $("kv-output").hidden = true;
      $("kv-plot").textContent = "";
      delete root.dataset.plot;
      return;
    }
    $("kv-result").textContent = result.json;
    showRows(result.rows);
    $("kv-output").hidden = false;
    $("kv-plot").textContent = "";
    $("kv-plot-note").textContent = result.curve_contexts
      ? ""
      : "Choose a GPU (or give KV memory per GPU) to see how many sequences fit.";
    delete root.dataset.plot;
  }

  function fail(err) {
    // The page never shows a traceback: one line here, the whole error in the console.
    console.error(err);
    const lines = String(err && err.message ? err.message : err)
      .trim()
      .split("\n")
      .filter((line) => line.trim());
    const slot = $("kv-error-general");
    slot.textContent = `The calculator failed: ${lines[lines.length - 1] || "unknown error"}`;
    slot.hidden = false;
    root.dataset.state = "failed";
  }

  async function drawCurve(gen, result) {
    root.dataset.plot = "drawing";
    const points = [];
    const report = JSON.parse(result.json);
    for (const tokens of result.curve_contexts) {
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (gen !== generation) {
        return;
      }
      let seats;
      try {
        seats = JSON.parse(calc.seats_at_json(JSON.stringify(result.argv), tokens));
      } catch (err) {
        fail(err);
        return;
      }
      points.push([tokens, seats]);
      drawPlot(points, result.curve_contexts, report);
    }
    root.dataset.plot = "done";
  }

  // ---- the seats plot (inline SVG) --------------------------------------------------

  function tokensLabel(tokens) {
    if (tokens >= 1 << 20 && tokens % (1 << 20) === 0) {
      return `${tokens / (1 << 20)}M`;
    }
    if (tokens >= 1024 && tokens % 1024 === 0) {
      return `${tokens / 1024}K`;
    }
    return tokens.toLocaleString("en-US");
  }

  function svg(name, attributes, text) {
    const element = document.createElementNS(SVG_NS, name);
    for (const [key, value] of Object.entries(attributes)) {
      element.setAttribute(key, String(value));
    }
    if (text !== undefined) {
      element.textContent = text;
    }
    return element;
  }

  function drawPlot(points, contexts, report) {
    const width = 640;
    const height = 300;
    const margin = { left: 64, right: 20, top: 28, bottom: 52 };
    const innerW = width - margin.left - margin.right;
    const innerH = height - margin.top - margin.bottom;
    const lowX = Math.log2(contexts[0]);
    const highX = Math.log2(contexts[contexts.length - 1]);
    const maxSeats = Math.max(10, ...points.map(([, s]) => s || 0));
    const highY = Math.ceil(Math.log10(maxSeats));
    const x = (tokens) => margin.left + ((Math.log2(tokens) - lowX) / (highX - lowX || 1)) * innerW;
    const y = (seats) => margin.top + innerH - (Math.log10(Math.max(seats, 1)) / highY) * innerH;
    const gpu = report.gpu ? `${report.gpu} x ${report.tp}` : `${report.tp} GPU(s)`;
    const title = `Seats against context: ${report.model}, ${gpu}, KV ${report.kv_dtype}`;
    const plot = svg("svg", {
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": title,
      class: "kv-svg",
    });
    plot.append(svg("title", {}, title));
    plot.append(svg("text", { x: margin.left, y: 16, class: "kv-svg-title" }, title));
    for (let power = 0; power <= highY; power += 1) {
      const yy = y(10 ** power);
      plot.append(svg("line", { x1: margin.left, x2: width - margin.right, y1: yy, y2: yy, class: "kv-grid" }));
      plot.append(svg("text", { x: margin.left - 6, y: yy + 4, class: "kv-tick kv-tick-y" },
        (10 ** power).toLocaleString("en-US")));
    }
    for (const tokens of contexts) {
      if (!Number.isInteger(Math.log2(tokens))) {
        continue; // the chosen context is marked below, not given a tick
      }
      const xx = x(tokens);
      plot.append(svg("line", { x1: xx, x2: xx, y1: margin.top, y2: margin.top + innerH, class: "kv-grid" }));
      plot.append(svg("text", { x: xx, y: margin.top + innerH + 16, class: "kv-tick kv-tick-x" },
        tokensLabel(tokens)));
    }
    plot.append(svg("text", { x: margin.left + innerW / 2, y: height - 8, class: "kv-axis" },
      "context per sequence (tokens, log scale; K = 1,024)"));
    plot.append(svg("text", {
      x: 14, y: margin.top + innerH / 2, class: "kv-axis",
      transform: `rotate(-90 14 ${margin.top + innerH / 2})`,
    }, "seats (log scale)"));
    const seated = points.filter(([, seats]) => seats >= 1);
    if (seated.length > 1) {
      plot.append(svg("polyline", {
        points: seated.map(([t, s]) => `${x(t)},${y(s)}`).join(" "),
        class: "kv-line",
      }));
    }
    for (const [tokens, seats] of points) {
      const chosen = tokens === report.context_tokens;
      const dot = svg("circle", {
        cx: x(tokens), cy: y(seats), r: chosen ? 6 : 4,
        class: `kv-dot${chosen ? " kv-chosen" : ""}${seats >= 1 ? "" : " kv-zero"}`,
        "data-context": tokens, "data-seats": seats,
      });
      dot.append(svg("title", {}, `${tokens.toLocaleString("en-US")} tokens: ${seats} seats`));
      plot.append(dot);
      if (chosen) {
        const right = x(tokens) > margin.left + innerW * 0.7; // keep the label inside
        plot.append(svg("text", {
          x: x(tokens) + (right ? -8 : 8), y: y(seats) - 8, class: "kv-chosen-label",
          "text-anchor": right ? "end" : "start",
        }, `${seats} at ${tokens.toLocaleString("en-US")}`));
      }
    }
    $("kv-plot").replaceChildren(plot);
  }

  boot().catch((err) => {
    for (const note of document.querySelectorAll(".kv-nojs")) {
      note.hidden = false;
    }
    setStatus("");
    fail(err);
  });
})();
