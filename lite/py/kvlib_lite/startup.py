"""Run by IPython when the browser's kernel starts (``PYTHONSTARTUP``, set by the site).

- The learner's id: the challenges draw each learner's own numbers from it
  (:func:`course.checks.student_id` reads ``$KVLIB_STUDENT_ID``). The page asks for it
  in a dialog of its own (``student-id.js``, added to the site's JupyterLab page) and
  keeps it in ``kvlib_student_id.txt`` at the top of the browser's file storage, which
  outlives the tab; before each cell the kernel reads that file again (a cell that
  draws numbers may name neither kvlib nor course.checks: ``N = numbers(...)``), so an
  id changed from the page counts from the next cell run. A blank answer keeps
  the default ``self-study``, the id ``make check`` uses when none is set.
- A cell that imports numpy, matplotlib, torch or another package with no build this
  site can serve prints one line naming the local install instead of a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from course.checks import STUDENT_ENV

__all__ = ["ID_FILE", "LOCAL_ONLY", "install", "local_only_message", "stored_id"]

# The root of the browser's file storage as the kernel sees it (JupyterLite's DriveFS).
ID_FILE = Path("/drive/kvlib_student_id.txt")
# Packages the course uses that have no WebAssembly build on the package registries
# the site is built from: the cells that import them run only in the local install.
LOCAL_ONLY = frozenset(
    {"numpy", "matplotlib", "torch", "transformers", "simpy", "redis", "scipy", "pandas"}
)


def local_only_message(module: str) -> str:
    """The one line a cell prints when it imports a package the browser cannot have."""
    return (f"this cell needs the local install: make lab ({module} has no build that "
            "runs in the browser)")


def stored_id() -> str:
    """The id the page stored, or "" when there is none (yet)."""
    try:
        return ID_FILE.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _before_cell(info: Any) -> None:
    """Before each cell: take the stored id (read each time: the learner may have
    changed it from the page since the last cell, and any cell may draw numbers)."""
    student = stored_id()
    if student:
        os.environ[STUDENT_ENV] = student


def _local_only(shell: Any, etype: type, value: BaseException, tb: Any,
                tb_offset: int | None = None) -> Any:
    name = str(getattr(value, "name", "") or "").split(".")[0]
    if name in LOCAL_ONLY:
        print(local_only_message(name))
        return None
    return shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


def install(shell: Any) -> None:
    """Hook the two behaviours into IPython ``shell``."""
    shell.events.register("pre_run_cell", _before_cell)
    shell.set_custom_exc((ImportError,), _local_only)
