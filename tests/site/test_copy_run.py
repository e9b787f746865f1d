"""The code a chapter page shows runs when a reader copies it.

For every chapter page, the cells the page shows (none of ``hide-input``,
``remove-input``, ``remove-cell``), in order and without the hidden ones, run in a
fresh IPython shell, in an empty folder (a reader's, not the page's: no helper beside
the page is importable), in a process of its own (tests/copy_run_shell.py). A cell
that needs a service the site does not run (a Redis server) is tagged
``skip-copy-run`` and says so on the page; it is left out.

Pages run on COPY_RUN_WORKERS servers at once (default: the cores). A page that
passed is not run again while its shown cells and kvlib are unchanged: the results are
kept in ``_build/copy_run.json``, keyed by a hash of both.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from site_helpers import BUILD_DIR, ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from build_book import code_fingerprint  # noqa: E402
from measure_pages import NOT_ON_SITE_TAG, chapter_docnames, code_cells  # noqa: E402

pytestmark = pytest.mark.notebooks

PAGES = chapter_docnames((ROOT / "_toc.yml").read_text(encoding="utf-8"))
RESULTS = BUILD_DIR / "copy_run.json"
SHELL = ROOT / "tests" / "copy_run_shell.py"


def shown_cells(docname: str) -> list[str]:
    """The sources of the cells a page shows and a reader can run, in order."""
    text = (ROOT / f"{docname}.md").read_text(encoding="utf-8")
    return [c.source for c in code_cells(text) if c.shown and NOT_ON_SITE_TAG not in c.tags]


def _key(cells: list[str], code: str) -> str:
    return hashlib.sha256(json.dumps([code, cells]).encode()).hexdigest()


class Shell:
    """One copy_run_shell.py server: ``run(cells)`` is "" when every cell ran, else the
    failing cell and its traceback."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, str(SHELL)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd="/")
        assert self._reply() == {"ready": True}

    def _reply(self) -> dict[str, object]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"copy_run_shell.py ended (status {self.process.wait()})"
        return dict(json.loads(line))

    def run(self, cells: list[str]) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"cells": cells}) + "\n")
        self.process.stdin.flush()
        return str(self._reply()["error"])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=60)


@contextmanager
def shells(count: int) -> Iterator[list[Shell]]:
    """``count`` servers, started at once (each imports numpy, matplotlib and torch)."""
    started: list[Shell] = []
    try:
        with_threads: list[threading.Thread] = []
        for _ in range(count):
            thread = threading.Thread(target=lambda: started.append(Shell()))
            thread.start()
            with_threads.append(thread)
        for thread in with_threads:
            thread.join()
        assert len(started) == count, "a copy_run_shell.py server did not start"
        yield started
    finally:
        for shell in started:
            shell.close()


def run_pages(pages: dict[str, list[str]], count: int) -> dict[str, tuple[str, float]]:
    """Each page's error ("" when it ran) and seconds, ``count`` pages at a time."""
    todo: queue.Queue[str] = queue.Queue()
    for docname in pages:
        todo.put(docname)
    results: dict[str, tuple[str, float]] = {}

    def drain(shell: Shell) -> None:
        while True:
            try:
                docname = todo.get_nowait()
            except queue.Empty:
                return
            start = time.perf_counter()
            try:
                error = shell.run(pages[docname])
            except Exception as exc:  # noqa: BLE001 (a dead server fails its page, never passes it)
                error = f"copy_run_shell.py failed on this page: {exc!r}"
            results[docname] = error, time.perf_counter() - start

    with shells(count) as servers:
        threads = [threading.Thread(target=drain, args=(shell,)) for shell in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return results


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str]:
    """Each page's error ("" when its shown cells ran); only changed pages are run."""
    code = code_fingerprint()
    cells = {docname: shown_cells(docname) for docname in PAGES}
    keys = {docname: _key(cells[docname], code) for docname in PAGES}
    passed: set[str] = set()
    if RESULTS.is_file():
        passed = set(json.loads(RESULTS.read_text()).get("passed", []))
    todo = {d: cells[d] for d in PAGES if cells[d] and keys[d] not in passed}
    workers = int(os.environ.get("COPY_RUN_WORKERS", "0")) or os.cpu_count() or 1
    start = time.perf_counter()
    results = run_pages(todo, min(workers, len(todo))) if todo else {}
    print(f"copy-and-run: {len(todo)} of {len(PAGES)} pages run on {workers} processes in "
          f"{time.perf_counter() - start:.0f} s")
    # A page to run that has no result failed: it was never reported as run.
    errors = {d: results[d][0] if d in results else "not run" if d in todo else ""
              for d in PAGES}
    BUILD_DIR.mkdir(exist_ok=True)
    now_passed = {keys[d] for d in PAGES if not errors[d]} | (passed & set(keys.values()))
    RESULTS.write_text(json.dumps({"passed": sorted(now_passed)}, indent=1))
    return errors


def test_a_page_runs_as_a_reader_s_copy() -> None:
    """The runner reports what a reader would hit: a name a hidden cell defined, a helper
    beside the page, a module the page never imported; the page's own names and imports
    work, and each page starts afresh (one server runs them all, in turn)."""
    pages = {
        "ok": ["x = 6 * 7", "import numpy as np\nprint(np.arange(x).sum())",
               "import os\nassert os.listdir('.') == [], os.listdir('.')\nopen('f', 'w')"],
        "hidden": ["print(name_from_a_hidden_cell)"],
        "helper": ["import measure_pages"],
        "not-imported": ["np.arange(3)"],
        "afresh": ["import os\nassert os.listdir('.') == []\nassert 'x' not in dir()"],
        "path": ["import sys\nassert sys.path[0] == '', sys.path"],
        "exits": ["import os\nos._exit(0)"],
    }
    results = {name: error for name, (error, _) in run_pages(pages, 1).items()}
    assert results["ok"] == "" and results["afresh"] == "" and results["path"] == ""
    assert "NameError" in results["hidden"] and "name_from_a_hidden_cell" in results["hidden"]
    assert "ModuleNotFoundError" in results["helper"], results["helper"]
    assert "NameError" in results["not-imported"] and "'np'" in results["not-imported"]
    assert results["hidden"].startswith("cell 1 of 1:\nprint(name_from_a_hidden_cell)")
    assert "ended without a result" in results["exits"]  # as a dead kernel fails its page


@pytest.mark.parametrize("docname", PAGES)
def test_shown_cells_run_when_copied(outcomes: dict[str, str], docname: str) -> None:
    assert not outcomes[docname], (
        "the page's shown cells, run in order in a fresh kernel without the hidden ones, "
        "fail; define or import every name in a shown cell (or tag a cell that cannot run "
        f"off the site `{NOT_ON_SITE_TAG}` and say so on the page):\n{outcomes[docname]}"
    )
