"""The "Check your work" cell where nbgrader cannot run: in the browser, on Pyodide.

``kvlib grade`` (:mod:`course.apps.selfcheck`) autogrades with nbgrader, which needs a
Jupyter server, subprocess kernels and a database: none of them exists in a browser.
This module gives the same score and hints for the same saved notebook by doing what
that path does, in one process:

1. match the notebook to its assignment by its nbgrader cell ids (most in common);
2. put back every locked cell and test cell as the assignment's source has it
   (nbgrader's ``OverwriteCells``), so an edited test or set-up cell counts for nothing;
3. run the code cells in order in a fresh namespace, as the student being graded
   (:func:`course.checks.grading_student`); an error stops that cell only, like
   nbgrader's execute step; the self-check cell and cells tagged ``skip-execution``
   are not run;
4. for each test cell, read the plain values of the names it reads out of that
   namespace and run the hidden test on them with :func:`course.notebooks.hidden.run_hidden_test`,
   the function the course's grader calls: the score is the cell's points if it passes,
   else 0, and the hint is its message.

What it does not do: the grader's sandbox and its time, memory and output limits
(a cell that never ends hangs the browser tab, not a grader).

The assignments (hidden tests included) come from ``assignments.json`` beside this
file, written at build time by :func:`assignment_data` from ``solutions/``.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from course.notebooks.hidden import (
    Unreadable,
    free_names,
    rebuild_value,
    run_hidden_test,
    snapshot_expression,
)
from course.checks import grading_student, student_id

__all__ = [
    "DATA_FILE",
    "SKIPPED_IDS",
    "assignment_data",
    "check_notebook",
    "grade",
    "grade_notebook",
]

DATA_FILE = Path(__file__).with_name("assignments.json")
# The cell that calls this check; the grader never runs it either (course.notebooks.execute).
SKIPPED_IDS = frozenset({"self_check"})
SKIP_TAG = "skip-execution"  # nbclient leaves cells with this tag unrun


def _meta(cell: Mapping[str, Any]) -> dict[str, Any]:
    nbgrader = cell.get("metadata", {}).get("nbgrader", {})
    return dict(nbgrader) if isinstance(nbgrader, Mapping) else {}


def _source(cell: Mapping[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _is_test(cell: Mapping[str, Any]) -> bool:
    """A graded code cell that is not an answer cell (course.notebooks.execute.is_test_cell)."""
    meta = _meta(cell)
    return bool(cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution"))


def assignment_data(root: Path) -> dict[str, Any]:
    """Each assignment's notebooks as the grader's gradebook holds them.

    ``{assignment: {notebook: {"cells": {grade_id: cell}, "tests": [grade_id, ...]}}}``
    where a cell keeps its type, source and nbgrader flags. Read from
    ``root/solutions``: locked cells equal the released ones there, and test cells hold
    their hidden tests (which ``exercises/`` leaves out).
    """
    data: dict[str, Any] = {}
    for folder in sorted(p for p in (root / "solutions").iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.ipynb")):
            nb = json.loads(path.read_text(encoding="utf-8"))
            cells: dict[str, Any] = {}
            tests: list[str] = []
            for cell in nb["cells"]:
                meta = _meta(cell)
                grade_id = meta.get("grade_id")
                if not grade_id or grade_id in cells:
                    continue
                cells[grade_id] = {
                    "cell_type": cell["cell_type"],
                    "source": _source(cell),
                    "locked": bool(meta.get("locked")),
                    "grade": bool(meta.get("grade")),
                    "solution": bool(meta.get("solution")),
                    "points": float(meta.get("points") or 0),
                }
                if _is_test(cell):
                    tests.append(grade_id)
            if tests:
                data.setdefault(folder.name, {})[path.stem] = {"cells": cells, "tests": tests}
    return data


def _load_data() -> dict[str, Any]:
    if not DATA_FILE.is_file():
        raise FileNotFoundError(f"{DATA_FILE} is missing: the site was built without it")
    data: dict[str, Any] = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    return data


def _match(nb: Mapping[str, Any], data: Mapping[str, Any]) -> tuple[str, str]:
    """(assignment, notebook) sharing the most graded cell ids with ``nb``."""
    ids = {_meta(c).get("grade_id") for c in nb.get("cells", [])} - {None}
    best: tuple[int, str, str] | None = None
    for assignment, notebooks in sorted(data.items()):
        for name, source in sorted(notebooks.items()):
            overlap = len(ids & set(source["cells"]))
            if overlap and (best is None or overlap > best[0]):
                best = (overlap, assignment, name)
    if best is None:
        raise ValueError("this is not one of the course's notebooks (no graded cell matches)")
    return best[1], best[2]


def _overwrite(nb: Mapping[str, Any], source: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The notebook's cells with locked and test cells put back from the source (first
    copy of a duplicated id only, as nbgrader's DeduplicateIds keeps)."""
    seen: set[str] = set()
    cells = []
    for cell in nb.get("cells", []):
        cell = dict(cell)
        grade_id = str(_meta(cell).get("grade_id") or "")
        if grade_id and grade_id in seen:
            metadata = cell.get("metadata", {})
            cell["metadata"] = {k: v for k, v in metadata.items() if k != "nbgrader"}
        elif grade_id in source["cells"]:
            seen.add(grade_id)
            original = source["cells"][grade_id]
            if original["locked"] or original["grade"]:
                cell["cell_type"] = original["cell_type"]
                if original["locked"] or not original["solution"]:
                    cell["source"] = original["source"]
            meta = {**_meta(cell), **{k: original[k] for k in ("grade", "solution", "locked")},
                    "grade_id": grade_id, "points": original["points"]}
            cell["metadata"] = {**cell.get("metadata", {}), "nbgrader": meta}
        cells.append(cell)
    return cells


def _transform(source: str) -> str:
    """IPython's own rewriting of magics and shell escapes, where IPython is installed."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    transformed: str = TransformerManager().transform_cell(source)  # type: ignore[no-untyped-call]
    return transformed


def _read_value(name: str, namespace: dict[str, Any]) -> float | int | Unreadable:
    """``name``'s value as the grader reads it out of a kernel (course.notebooks.hidden)."""
    try:
        found = eval(snapshot_expression(name), namespace)  # noqa: S307 - the grader's own expression
    except Exception as err:  # the kernel's reply would carry the same error name
        return rebuild_value({"status": "error", "ename": type(err).__name__})
    return rebuild_value({"status": "ok", "data": {"text/plain": repr(found)}})


def _run_cell(source: str, namespace: dict[str, Any]) -> None:
    # An error costs this cell only, as in nbgrader's execute step.
    with contextlib.suppress(Exception, SystemExit):
        exec(compile(_transform(source), "<cell>", "exec"), namespace)


def grade_notebook(nb: Mapping[str, Any], student: str | None = None,
                   data: Mapping[str, Any] | None = None) -> Any:
    """Grade a notebook (parsed JSON) as ``student`` (default: this learner's id) and
    return :class:`course.apps.selfcheck.Report`."""
    from course.apps.selfcheck import Challenge, Report

    data = _load_data() if data is None else data
    assignment, name = _match(nb, data)
    source = data[assignment][name]
    student = student or student_id()
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    with contextlib.suppress(ImportError):
        from IPython import get_ipython

        namespace["get_ipython"] = get_ipython
    verdicts: dict[str, tuple[bool, str]] = {}
    sink = io.StringIO()
    with grading_student(student), contextlib.redirect_stdout(sink), \
            contextlib.redirect_stderr(sink):
        for cell in _overwrite(nb, source):
            grade_id = str(_meta(cell).get("grade_id") or "")
            tags = cell.get("metadata", {}).get("tags", [])
            if cell.get("cell_type") != "code" or grade_id in SKIPPED_IDS or SKIP_TAG in tags:
                continue
            if _is_test(cell) and grade_id in source["tests"]:
                code = _source(cell)
                values = {n: _read_value(n, namespace) for n in free_names(code)}
                verdict = run_hidden_test(code, values)
                verdicts.setdefault(grade_id, (verdict.passed, "" if verdict.passed
                                               else verdict.message))
            elif not _is_test(cell):
                _run_cell(_source(cell), namespace)
    challenges = []
    for grade_id in source["tests"]:
        points = float(source["cells"][grade_id]["points"])
        passed, hint = verdicts.get(grade_id, (False, "this test cell is missing from the "
                                               "notebook: start again from the exercise"))
        challenges.append(Challenge(grade_id, points if passed else 0.0, points, hint))
    return Report.of(assignment, name, challenges)


def grade(path: str | os.PathLike[str], student: str | None = None) -> Any:
    """Grade the notebook saved at ``path``; see :func:`grade_notebook`."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    return grade_notebook(nb, student)


def check_notebook(notebook: str | os.PathLike[str] | None = None) -> None:
    """Grade the saved copy of this notebook (or ``notebook``) and print the report, in
    the words and layout of :func:`course.apps.selfcheck.check_notebook`."""
    from course.apps.selfcheck import print_check

    print_check(notebook, grade, (ValueError, OSError))
