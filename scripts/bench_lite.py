"""Cold start and page weight of the exercises in JupyterLite, in headless Chromium.

Builds the lite site when it is not current (scripts/build_lite.py), or takes one
built before (``--site``, to compare builds on the same machine), serves it on
127.0.0.1, opens an exercise notebook in a fresh browser profile (nothing cached, no
service worker yet), then reloads it (warm: the browser's cache), and prints a
learner's timeline, cold and warm, in seconds from navigation:

- first paint: anything on screen (the loading view; before it, a white page);
- the notebook editor shown (JupyterLab has restored its layout);
- the kernel ready (idle);
- the first check: the notebook's "Check your work" cell run and its report printed;

and the page weight: bytes the browser received for the cold start, over how many
requests, and the size of the whole lite site on disk.

Every address but 127.0.0.1 is unresolvable in the browser (``--host-resolver-rules``)
and any request to one is counted and printed. The figures are printed, not checked:
the course's target is 15 s cold on its 2-core machine.

The functions that drive JupyterLab (through ``window.jupyterapp``, which the build
exposes) are shared with tests/site/test_lite_learner.py.

Usage: ``python scripts/bench_lite.py [--notebook NN_slug/name.ipynb] [--runs N]
[--site DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import shutil
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import build_lite  # scripts/, this script's folder, is first on sys.path

from course.book.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    OFFLINE_ARGS,
    browser_cpu_seconds,
    leaves_the_machine,
)

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_NOTEBOOK = "05_rate_limiting/rate_limiting.ipynb"
WAIT_MS = 300_000  # a cold kernel on a busy 2-core machine
PANEL = "window.jupyterapp?.shell?.currentWidget"
KERNEL_IDLE = f"() => {PANEL}?.sessionContext?.session?.kernel?.status === 'idle'"
# The text of a cell's outputs, read from the model (JupyterLab renders only the cells
# in view): streams, plain-text results and error messages.
OUTPUT_TEXT_JS = """const outputText = (cell) => !cell.model.outputs ? '' :
  cell.model.outputs.toJSON().map(o => [].concat(
    o.text || (o.data && o.data['text/plain']) || o.evalue || '').join('')).join('');"""
# The current notebook's cells as [grade_id, source, output text].
CELLS_JS = "() => { " + OUTPUT_TEXT_JS + """
  return window.jupyterapp.shell.currentWidget.content.widgets.map(cell => [
    (cell.model.getMetadata('nbgrader') || {}).grade_id || '',
    cell.model.sharedModel.getSource(),
    outputText(cell),
  ]);
}"""
SET_SOURCES_JS = """(sources) => {
  for (const cell of window.jupyterapp.shell.currentWidget.content.widgets) {
    const id = (cell.model.getMetadata('nbgrader') || {}).grade_id;
    if (id in sources) cell.model.sharedModel.setSource(sources[id]);
  }
}"""
EXECUTE_JS = """async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const future = kernel.requestExecute({code});
  const text = [];
  future.onIOPub = (msg) => {
    if (msg.content.text) text.push(msg.content.text);
    if (msg.content.evalue) text.push(msg.content.ename + ': ' + msg.content.evalue);
  };
  await future.done;
  return text.join('');
}"""


@dataclass
class Recorder:
    """Every request the browser made, and the bytes the server sent."""

    base: str
    served: list[int]  # bytes of each file the server sent
    urls: list[str] = field(default_factory=list)

    def remote(self) -> list[str]:
        """Requests to any host but the local server's."""
        return [u for u in self.urls if leaves_the_machine(u)]

    def on_request(self, request: Any) -> None:
        self.urls.append(request.url)



class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site and adds the bytes of every file sent to ``served`` (the page
    weight as the server sees it: requests a worker or service worker makes count too)."""

    served: list[int]

    def copyfile(self, source: Any, outputfile: Any) -> None:
        start = source.tell()
        # A request the browser dropped half-way still counts what was sent.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            shutil.copyfileobj(source, outputfile)
        self.served.append(source.tell() - start)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@contextmanager
def counting_server(directory: Path) -> Iterator[tuple[str, list[int]]]:
    """Serve ``directory`` on 127.0.0.1; yields the base URL and the list of bytes sent."""
    served: list[int] = []
    handler = functools.partial(
        type("Handler", (_CountingHandler,), {"served": served}), directory=str(directory)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def browser_page(site: Path) -> Iterator[tuple[Any, str, Recorder]]:
    """A page in a fresh headless Chromium profile, the site served on 127.0.0.1.

    The profile is a real one in a temporary folder (a disk cache, as a learner's
    browser has), not an incognito context, whose memory cache keeps no file as large as
    Pyodide's 9 MiB WebAssembly module: a reload would fetch it again."""
    from playwright.sync_api import sync_playwright

    with counting_server(site) as (base, served), sync_playwright() as playwright, \
            tempfile.TemporaryDirectory(prefix="kvlib-chromium-") as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *OFFLINE_ARGS]
        )
        try:
            recorder = Recorder(base, served)
            context.on("request", recorder.on_request)
            yield context.new_page(), base, recorder
        finally:
            context.close()


def answer_student_id(page: Any, student: str) -> str:
    """Wait for the page's student-id dialog, type ``student`` and save; the dialog's
    text (what the id is for, how to change it)."""
    dialog = page.locator("#kvlib-id-dialog[open]")
    dialog.wait_for(timeout=WAIT_MS)
    text = str(dialog.inner_text())
    page.fill("#kvlib-id-input", student)
    page.locator("#kvlib-id-dialog button[type=submit]").click()
    page.locator("#kvlib-id-dialog[open]").wait_for(state="detached", timeout=WAIT_MS)
    # The id kept: the one typed, or the default for a blank answer.
    page.wait_for_function("(id) => [id, 'self-study'].includes(document.getElementById("
                           "'kvlib-id-button')?.dataset.studentId || null)",
                           arg=student.strip() or "self-study", timeout=WAIT_MS)
    return text


def timeline(page: Any) -> dict[str, float]:
    """Seconds from navigation to each step the page recorded: first paint (the loading
    view), the editor shown (JupyterLab restored), the kernel's files downloaded, the
    kernel ready (lite/loading.js keeps the marks)."""
    marks = page.evaluate("""() => {
      const paint = performance.getEntriesByName('first-contentful-paint')[0];
      return {painted: paint ? paint.startTime : null, ...(window.kvlibLoading?.marks || {})};
    }""")
    return {name: ms / 1000 for name, ms in marks.items() if ms is not None}


def execute(page: Any, code: str) -> str:
    """Run ``code`` in the notebook's kernel; its printed text and error."""
    return str(page.evaluate(EXECUTE_JS, code))


def cells(page: Any) -> list[tuple[str, str, str]]:
    """(grade_id, source, output text) of each cell of the open notebook."""
    return [(str(g), str(src), str(out)) for g, src, out in page.evaluate(CELLS_JS)]


def set_sources(page: Any, sources: dict[str, str]) -> None:
    """Replace the source of the cells with these nbgrader ids."""
    page.evaluate(SET_SOURCES_JS, sources)


def save_and_run_all(page: Any) -> None:
    """Save the notebook (the check grades the saved copy), then run every cell."""
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(f"() => !{PANEL}.context.model.dirty", timeout=WAIT_MS)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def save_and_run_cell(page: Any, grade_id: str) -> None:
    """Save the notebook, then run the one cell with this nbgrader id (a run of all cells
    stops at the first cell that raises, as in any Jupyter)."""
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(f"() => !{PANEL}.context.model.dirty", timeout=WAIT_MS)
    page.evaluate(
        """(id) => {
          const notebook = window.jupyterapp.shell.currentWidget.content;
          notebook.activeCellIndex = notebook.widgets.findIndex(
            c => (c.model.getMetadata('nbgrader') || {}).grade_id === id);
          return window.jupyterapp.commands.execute('notebook:run-cell');
        }""",
        grade_id,
    )


def output_of(page: Any, grade_id: str, pattern: str) -> str:
    """The output of cell ``grade_id`` once it matches the regular expression."""
    page.wait_for_function(
        "([id, pattern]) => { " + OUTPUT_TEXT_JS + """
          const cell = window.jupyterapp.shell.currentWidget.content.widgets.find(
            c => (c.model.getMetadata('nbgrader') || {}).grade_id === id);
          return cell && new RegExp(pattern).test(outputText(cell));
        }""",
        arg=[grade_id, pattern],
        timeout=WAIT_MS,
    )
    return next(out for gid, _, out in cells(page) if gid == grade_id)


def site_bytes(site: Path) -> int:
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file())


# Kept in the page by an init script (any build of the site, old or new): milliseconds
# from navigation until JupyterLab has restored its layout and until the notebook's
# kernel is first idle.
RECORD_STEPS_JS = """
window.__benchSteps = {};
const benchPoll = setInterval(() => {
  const steps = window.__benchSteps, app = window.jupyterapp;
  if (app && app.restored && !steps.hooked) {
    steps.hooked = true;
    app.restored.then(() => { steps.editor = performance.now(); });
  }
  const panels = app?.shell ? Array.from(app.shell.widgets('main')) : [];
  const kernel = panels.find(w => w.sessionContext)?.sessionContext?.session?.kernel;
  if (kernel && kernel.status === 'idle' && !steps.kernel) {
    steps.kernel = performance.now();
    clearInterval(benchPoll);
  }
}, 50);
"""
STEPS = ("painted", "editor", "kernel", "check")
STEP_NAMES = {
    "painted": "first paint (anything on screen)",
    "editor": "notebook editor shown",
    "kernel": "kernel ready (idle)",
    "check": "first check (Check your work)",
}


def _load(page: Any, notebook: str, student: str) -> dict[str, float]:
    """Wait for the notebook's kernel (answering the student-id question, in the page or
    in a browser prompt, if asked), run its "Check your work" cell; seconds from
    navigation to each of :data:`STEPS`."""
    page.wait_for_function("() => document.querySelector('#kvlib-id-dialog[open]') "
                           "|| window.__benchSteps?.kernel", timeout=WAIT_MS)
    if page.locator("#kvlib-id-dialog[open]").count():
        answer_student_id(page, student)
    page.wait_for_function("() => window.__benchSteps?.kernel", timeout=WAIT_MS)
    save_and_run_cell(page, "self_check")
    output_of(page, "self_check", r"points")
    checked = page.evaluate("() => performance.now()")
    steps = page.evaluate("""() => ({
      painted: performance.getEntriesByName('first-contentful-paint')[0]?.startTime,
      editor: window.__benchSteps.editor, kernel: window.__benchSteps.kernel})""")
    steps["check"] = checked
    return {name: float(steps[name]) / 1000 for name in STEPS}


def run_once(site: Path, notebook: str) -> dict[str, Any]:
    """A cold start (a fresh browser profile), then a warm one (a reload: the browser's
    cache and the stored student id); the figures printed by :func:`main`."""
    with browser_page(site) as (page, base, recorder):
        page.on("dialog", lambda dialog: dialog.accept(""))  # an old site's prompt
        page.add_init_script(RECORD_STEPS_JS)
        page.goto(f"{base}lab/index.html?path={notebook}")
        cold = _load(page, notebook, "")
        cpu_s = browser_cpu_seconds()
        requests, served = len(recorder.urls), list(recorder.served)
        page.reload()
        warm = _load(page, notebook, "")
        remote = recorder.remote()
        if remote:
            print("bench_lite: requests that left the site:", *remote, sep="\n  ")
        return {"cold": cold, "warm": warm, "cpu_s": cpu_s, "requests": requests,
                "bytes": sum(served), "files": len(served), "remote": len(remote)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--notebook", default=DEFAULT_NOTEBOOK)
    parser.add_argument("--runs", type=int, default=1, help="cold starts to time")
    parser.add_argument("--site", type=Path, default=None,
                        help="a lite site already built (default: build this checkout's)")
    args = parser.parse_args(argv)
    site = args.site or build_lite.build()
    runs = [run_once(site, args.notebook) for _ in range(args.runs)]
    print(f"bench_lite: {args.notebook}, {args.runs} run(s) in headless Chromium; seconds "
          "from navigation (median)")
    print(f"  {'':36} {'cold':>6} {'warm':>6}")
    for step in STEPS:
        cold = statistics.median(r["cold"][step] for r in runs)
        warm = statistics.median(r["warm"][step] for r in runs)
        print(f"  {STEP_NAMES[step]:36} {cold:6.1f} {warm:6.1f}")
    print(f"  browser CPU time, cold:  {statistics.median(r['cpu_s'] for r in runs):.1f} s "
          f"(load average {os.getloadavg()[0]:.1f} at the end; target 15 s to kernel "
          "ready, cold, on the course's quiet 2-core machine)")
    print(f"  page weight, cold:       {runs[0]['bytes'] / 2**20:.1f} MiB in "
          f"{runs[0]['files']:.0f} files sent by the server")
    print(f"  lite site on disk:       {site_bytes(site) / 2**20:.1f} MiB")
    print(f"  requests off the site:   {runs[0]['remote']:.0f}")
    return 0 if all(r["remote"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
