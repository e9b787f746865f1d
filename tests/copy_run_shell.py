"""Run a page's shown cells as a reader who copies them would: each page in a fresh IPython
shell, in an empty folder, with a fresh namespace, in a process of its own.

Started as ``python copy_run_shell.py`` (a fresh interpreter, so that nothing the test
process imported is importable by name), the server imports what a chapter's cells
import first and costs most to import (numpy, matplotlib, torch, IPython), then serves
one page a line: it reads ``{"cells": [...]}`` on stdin and writes ``{"error": ...}``
on stdout ("" when every cell ran). Each page runs in a process forked from the server,
so it starts with those libraries imported and nothing else: a name a hidden cell
defined, an import the page leaves out or a file beside the page fails as it would in a
reader's kernel, and the page pays for its own work only. Measured on a 2-core machine,
a new kernel costs 0.35 CPU seconds before its first cell, numpy and matplotlib's pyplot
another 1.0, torch another 2.6.

What the child has is what ``python -m ipykernel_launcher`` would have: the interpreter's
own ``sys.path`` with the page's folder first, nothing another page imported (each page
is its own fork), no kvlib module loaded (``kvlib.x`` without ``import kvlib.x`` fails
as in a kernel), and matplotlib's non-interactive backend (a kernel draws figures after
a cell, and an error there does not fail the cell). The one difference: a submodule of
numpy, matplotlib or torch that the server's imports loaded is reachable as an attribute
of its package without its own import.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from typing import Any

CELL_TIMEOUT_S = 120
# What a chapter's cells import most, and what costs most to import.
WARM_MODULES = ("numpy", "matplotlib.pyplot", "torch", "IPython.core.interactiveshell")


def kernel_sys_path() -> list[str]:
    """``sys.path`` of a fresh interpreter with this environment (PYTHONPATH included),
    as a kernel started now would have it, minus its working folder."""
    found = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path))"],
                           capture_output=True, text=True, check=True, cwd="/")
    return [entry for entry in json.loads(found.stdout) if entry]


class _CellTimeout(Exception):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _CellTimeout(f"a cell ran longer than {CELL_TIMEOUT_S} s")


def run_page(cells: list[str], path: list[str], folder: str) -> str:
    """In this (forked) process: ``cells`` in a fresh shell in the empty ``folder``; ""
    when they all ran, else the failing cell and its traceback."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    os.chdir(folder)
    sys.path[:] = ["", *path]  # "": the working folder, first, as in a kernel
    sys.argv = ["ipykernel_launcher"]
    config = Config()
    config.HistoryManager.enabled = False  # kernels share no history file among pages
    shell = InteractiveShell.instance(config=config)
    signal.signal(signal.SIGALRM, _on_alarm)
    for number, source in enumerate(cells, start=1):
        signal.alarm(CELL_TIMEOUT_S)
        result = shell.run_cell(source, store_history=False)
        signal.alarm(0)
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            shown = "".join(traceback.format_exception(error))
            return f"cell {number} of {len(cells)}:\n{source}\n\n{shown}"
    return ""


def _serve_one(cells: list[str], path: list[str]) -> str:
    """Fork; the child runs the page, its output to /dev/null, its result to a pipe."""
    folder = tempfile.mkdtemp(prefix="copy-run-")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_end)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            error = run_page(cells, path, folder)
        except BaseException as exc:  # noqa: BLE001 (the shell's own failure, reported too)
            error = "".join(traceback.format_exception(exc))
        with os.fdopen(write_end, "w") as out:
            out.write(json.dumps({"error": error}))
        os._exit(0)  # skip the server's exit handlers: they are not this page's
    os.close(write_end)
    with os.fdopen(read_end) as results:
        written = results.read()
    _, status = os.waitpid(pid, 0)
    shutil.rmtree(folder, ignore_errors=True)
    if not written:  # a cell ended the process (os._exit, a crash): as a kernel dying
        return f"the page's process ended without a result (wait status {status})"
    return str(json.loads(written)["error"])


def serve() -> None:
    """Import WARM_MODULES, say "ready", then run a page for each line of stdin."""
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    path = kernel_sys_path()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        error = _serve_one(json.loads(line)["cells"], path)
        print(json.dumps({"error": error}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    serve()
