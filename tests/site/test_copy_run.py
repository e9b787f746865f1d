"""The code a chapter page shows runs when a reader copies it.

For every chapter page, the cells the page shows (none of ``hide-input``,
``remove-input``, ``remove-cell``), in order and without the hidden ones, run in a
fresh kernel, in an empty folder (a reader's, not the page's: no helper beside the page
is importable). A cell that needs a service the site does not run (a Redis server) is
tagged ``skip-copy-run`` and says so on the page; it is left out.

Pages run in parallel processes (COPY_RUN_WORKERS, default: the cores). A page that
passed is not run again while its shown cells and kvlib are unchanged: the results are
kept in ``_build/copy_run.json``, keyed by a hash of both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import pytest
from site_helpers import BUILD_DIR, ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from build_book import code_fingerprint  # noqa: E402
from measure_pages import NOT_ON_SITE_TAG, chapter_docnames, code_cells  # noqa: E402

pytestmark = pytest.mark.notebooks

PAGES = chapter_docnames((ROOT / "_toc.yml").read_text(encoding="utf-8"))
RESULTS = BUILD_DIR / "copy_run.json"
CELL_TIMEOUT_S = 120
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of IPython's tracebacks


def shown_cells(docname: str) -> list[str]:
    """The sources of the cells a page shows and a reader can run, in order."""
    text = (ROOT / f"{docname}.md").read_text(encoding="utf-8")
    return [c.source for c in code_cells(text) if c.shown and NOT_ON_SITE_TAG not in c.tags]


def _key(cells: list[str], code: str) -> str:
    return hashlib.sha256(json.dumps([code, cells]).encode()).hexdigest()


def run_cells(cells: list[str]) -> str:
    """Run ``cells`` in a fresh kernel in an empty folder: "" if all pass, else the error."""
    import nbformat
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory() as folder:
        # Unix sockets in this page's own folder, not TCP ports: a port that jupyter_client
        # picks is free until the kernel binds it, and kernels that other processes start
        # meanwhile (the book's build, the grader) can take it. No transport warning either.
        kernel = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                    ip=os.path.join(folder, "kernel"))
        client = NotebookClient(notebook, km=kernel, timeout=CELL_TIMEOUT_S,
                                resources={"metadata": {"path": folder}})
        try:
            client.execute(env=env, cleanup_kc=True)  # the kernel it was given, too
        except CellExecutionError as exc:
            return ANSI.sub("", str(exc))[-3000:]
    return ""


def _run_page(cells: list[str]) -> tuple[str, float]:
    start = time.perf_counter()
    return run_cells(cells), time.perf_counter() - start


@pytest.fixture(scope="module")
def outcomes() -> dict[str, str]:
    """Each page's error ("" when its shown cells ran); only changed pages are run."""
    code = code_fingerprint()
    cells = {docname: shown_cells(docname) for docname in PAGES}
    keys = {docname: _key(cells[docname], code) for docname in PAGES}
    passed: set[str] = set()
    if RESULTS.is_file():
        passed = set(json.loads(RESULTS.read_text()).get("passed", []))
    todo = [d for d in PAGES if cells[d] and keys[d] not in passed]
    workers = int(os.environ.get("COPY_RUN_WORKERS", "0")) or os.cpu_count() or 1
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(todo, pool.map(_run_page, [cells[d] for d in todo]), strict=True))
    print(f"copy-and-run: {len(todo)} of {len(PAGES)} pages run on {workers} processes in "
          f"{time.perf_counter() - start:.0f} s")
    errors = {d: results[d][0] if d in results else "" for d in PAGES}
    BUILD_DIR.mkdir(exist_ok=True)
    now_passed = {keys[d] for d in PAGES if not errors[d]} | (passed & set(keys.values()))
    RESULTS.write_text(json.dumps({"passed": sorted(now_passed)}, indent=1))
    return errors


def test_a_page_with_an_undefined_name_fails() -> None:
    """The runner reports what a reader would hit: a name a hidden cell defined."""
    # In a child process, as the pages run.
    with ProcessPoolExecutor(max_workers=1) as pool:
        ok, error = pool.map(run_cells, [["x = 6 * 7", "print(x)"],
                                         ["print(name_from_a_hidden_cell)"]])
    assert ok == ""
    assert "NameError" in error and "name_from_a_hidden_cell" in error


@pytest.mark.parametrize("docname", PAGES)
def test_shown_cells_run_when_copied(outcomes: dict[str, str], docname: str) -> None:
    assert not outcomes[docname], (
        "the page's shown cells, run in order in a fresh kernel without the hidden ones, "
        "fail; define or import every name in a shown cell (or tag a cell that cannot run "
        f"off the site `{NOT_ON_SITE_TAG}` and say so on the page):\n{outcomes[docname]}"
    )
