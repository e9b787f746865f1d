"""Cold start and page weight of the exercises in JupyterLite, in headless Chromium.

Builds the lite site when it is not current (scripts/build_lite.py), serves it on
127.0.0.1, opens an exercise notebook in a fresh browser profile (nothing cached, no
service worker yet) and prints:

- the cold start: seconds from navigation until the kernel is idle, and until
  ``import kvlib.grading`` has run in it (the first notebook is usable);
- the page weight: bytes the browser received for that, over how many requests,
  and the size of the whole lite site on disk.

Every address but 127.0.0.1 is unresolvable in the browser (``--host-resolver-rules``)
and any request to one is counted and printed. The figures are printed, not checked:
the course's target is 15 s cold on its 2-core machine.

The functions that drive JupyterLab (through ``window.jupyterapp``, which the build
exposes) are shared with tests/site/test_lite.py.

Usage: ``python scripts/bench_lite.py [--notebook NN_slug/name.ipynb] [--runs N]``.
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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import build_lite  # scripts/, this script's folder, is first on sys.path

from course.browser import CHROMIUM, CHROMIUM_ARGS, browser_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_NOTEBOOK = "05_rate_limiting/rate_limiting.ipynb"
# Nothing but the local server resolves: a request elsewhere fails at once, and is
# recorded by the listener below.
OFFLINE_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"]
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
        host = urlsplit(self.base).hostname
        return [u for u in self.urls
                if urlsplit(u).scheme in ("http", "https", "ws", "wss")
                and urlsplit(u).hostname != host]

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
    """A page in a fresh headless Chromium profile, the site served on 127.0.0.1."""
    from playwright.sync_api import sync_playwright

    with counting_server(site) as (base, served), sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *OFFLINE_ARGS]
        )
        try:
            context = browser.new_context()
            recorder = Recorder(base, served)
            context.on("request", recorder.on_request)
            yield context.new_page(), base, recorder
        finally:
            browser.close()


def open_notebook(page: Any, base: str, notebook: str) -> float:
    """Open ``notebook`` in JupyterLab; seconds until its kernel is idle."""
    start = time.perf_counter()
    page.goto(f"{base}lab/index.html?path={notebook}")
    page.wait_for_function(KERNEL_IDLE, timeout=WAIT_MS)
    return time.perf_counter() - start


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


def run_once(site: Path, notebook: str) -> dict[str, float]:
    """One cold start; the figures printed by :func:`main`."""
    with browser_page(site) as (page, base, recorder):
        page.on("dialog", lambda dialog: dialog.accept(""))  # the student id: default
        start = time.perf_counter()
        idle_s = open_notebook(page, base, notebook)
        out = execute(page, "import kvlib.grading\nprint(kvlib.grading.student_id())")
        usable_s = time.perf_counter() - start
        cpu_s = browser_cpu_seconds()
        if "Error" in out:
            raise SystemExit(f"bench_lite: import kvlib failed in the browser: {out}")
        remote = recorder.remote()
        if remote:
            print("bench_lite: requests that left the site:", *remote, sep="\n  ")
        return {"idle_s": idle_s, "usable_s": usable_s, "cpu_s": cpu_s,
                "requests": len(recorder.urls),
                "bytes": sum(recorder.served), "files": len(recorder.served),
                "remote": len(remote)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--notebook", default=DEFAULT_NOTEBOOK)
    parser.add_argument("--runs", type=int, default=1, help="cold starts to time")
    args = parser.parse_args(argv)
    site = build_lite.build()
    runs = [run_once(site, args.notebook) for _ in range(args.runs)]
    idle = statistics.median(r["idle_s"] for r in runs)
    usable = statistics.median(r["usable_s"] for r in runs)
    weight = runs[0]["bytes"]
    print(f"bench_lite: {args.notebook}, {args.runs} cold start(s) in headless Chromium")
    print(f"  kernel idle:            {idle:.1f} s (median)")
    print(f"  kvlib imported:         {usable:.1f} s (median; target 15 s)")
    print(f"  browser CPU time:       {statistics.median(r['cpu_s'] for r in runs):.1f} s "
          f"(median; load average {os.getloadavg()[0]:.1f} at the end)")
    print(f"  page weight:            {weight / 2**20:.1f} MiB in {runs[0]['files']:.0f} files "
          "sent by the server")
    print(f"  lite site on disk:      {site_bytes(site) / 2**20:.1f} MiB")
    print(f"  requests off the site:  {runs[0]['remote']:.0f}")
    return 0 if all(r["remote"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
