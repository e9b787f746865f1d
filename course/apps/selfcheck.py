"""``kvlib grade NOTEBOOK``: grade one notebook the way the course's grader will.

The notebook is matched to its assignment in ``solutions/`` by its nbgrader
cell ids, then graded with nbgrader itself (its Python API, in this process) in
a throwaway course directory: ``generate_assignment``, submit the notebook as
one student, ``autograde``.
Scores come from nbgrader's gradebook, hints from the hidden tests' messages.
The student is the one whose numbers the notebook drew
(:func:`course.checks.student_id`).

``--json`` prints ``{"score", "max_score", "challenges": [{"name", "score",
"max_score", "hint"}]}``.

:func:`check_notebook` is the same check from inside Jupyter: the last cell of
each exercise notebook calls it on the saved notebook and prints the same
report. Without nbgrader (kvlib installed alone) both say, in one line, which
extra to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MISSING_GRADER",
    "Challenge",
    "Report",
    "SelfCheckError",
    "check_notebook",
    "print_check",
    "this_notebook",
    "format_report",
    "grade",
    "grader_installed",
    "main",
]

MISSING_GRADER = (
    "grading needs nbgrader, which is not installed with kvlib alone: pip install 'kvlib[grading]'"
)
# nbgrader keeps each student in a folder named by the id.
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")


class SelfCheckError(Exception):
    """The notebook cannot be graded; the message says why, in one line."""


@dataclass(frozen=True)
class Challenge:
    """One point-bearing test: its id, score and the hint when it failed."""

    name: str
    score: float
    max_score: float
    hint: str


@dataclass(frozen=True)
class Report:
    """Scores for one notebook."""

    assignment: str
    notebook: str
    score: float
    max_score: float
    challenges: list[Challenge]

    @classmethod
    def of(cls, assignment: str, notebook: str, challenges: list[Challenge]) -> Report:
        """The report whose score and maximum are its challenges' sums."""
        score = sum(c.score for c in challenges)
        max_score = sum(c.max_score for c in challenges)
        return cls(assignment, notebook, score, max_score, challenges)

    def to_json(self) -> dict[str, Any]:
        """The documented JSON shape (assignment and notebook names left out)."""
        return {
            "score": self.score,
            "max_score": self.max_score,
            "challenges": [asdict(c) for c in self.challenges],
        }


def _read(path: Path) -> Any:
    import nbformat

    if not path.is_file():
        raise SelfCheckError(f"{path}: no such file")
    try:
        return nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    except Exception as err:  # nbformat raises several unrelated types
        raise SelfCheckError(f"{path}: not a Jupyter notebook ({type(err).__name__})") from None


def _grade_ids(nb: Any) -> set[str]:
    return {
        str(cell.metadata["nbgrader"]["grade_id"])
        for cell in nb.cells
        if "grade_id" in cell.metadata.get("nbgrader", {})
    }


def _match(nb: Any, root: Path, path: Path) -> tuple[str, str]:
    """(assignment, source notebook name) sharing the most cell ids with ``nb``."""
    from course.apps.scratch import assignment_ids

    ids = _grade_ids(nb)
    best: tuple[int, str, str] | None = None
    known = []
    for assignment in assignment_ids(root):
        for source in sorted((root / "solutions" / assignment).glob("*.ipynb")):
            known.append(f"{assignment}/{source.name}")
            overlap = len(ids & _grade_ids(_read(source)))
            if overlap and (best is None or overlap > best[0]):
                best = (overlap, assignment, source.stem)
    if best is None:
        raise SelfCheckError(
            f"{path} is not one of the course's notebooks (none of its graded cells match "
            f"{', '.join(known) or 'solutions/'}); grade the notebook from exercises/"
        )
    return best[1], best[2]


def _hint(cell: Any) -> str:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return str(output.get("evalue") or output.get("ename"))
    return ""


def grade(notebook: str | Path, *, timeout_s: int = 30) -> Report:
    """Autograde ``notebook`` against its assignment's source; raise SelfCheckError."""
    from nbgrader.api import Gradebook

    from course.apps.autograde import is_test_cell
    from course.apps.scratch import course_root, make_course, nbgrader_api, scripts_on_path
    from course.checks import STUDENT_ENV, student_id

    path = Path(notebook)
    nb = _read(path)
    # Graded as the learner whose numbers the notebook was drawn for.
    student = student_id()
    if not _SAFE_ID.match(student):
        raise SelfCheckError(
            f"the student id {student!r} cannot name a folder: set {STUDENT_ENV} to letters, "
            "digits and . _ @ + - only, and rerun the notebook"
        )
    try:
        root = course_root()
    except FileNotFoundError as err:
        raise SelfCheckError(str(err)) from None
    assignment, name = _match(nb, root, path)
    with tempfile.TemporaryDirectory(prefix="kvlib-grade-") as tmp:
        course = make_course(Path(tmp), root, [assignment], sandbox="auto", timeout_s=timeout_s)
        submitted = course / "submitted" / student / assignment
        submitted.mkdir(parents=True)
        shutil.copyfile(path, submitted / f"{name}.ipynb")
        api = nbgrader_api(course)
        with scripts_on_path():
            for result in (
                api.generate_assignment(assignment, force=True, create=True),
                api.autograde(assignment, student, force=True, create=True),
            ):
                if not result["success"]:
                    lines = str(result.get("error") or "grading failed").strip().splitlines()
                    raise SelfCheckError(lines[-1])
        graded = _read(course / "autograded" / student / assignment / f"{name}.ipynb")
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
            submission = gb.find_submission_notebook(name, assignment, student)
            scores = {g.name: (float(g.score), float(g.max_score)) for g in submission.grades}
    challenges = []
    for cell in graded.cells:
        if is_test_cell(cell):
            grade_id = cell.metadata["nbgrader"]["grade_id"]
            score, max_score = scores[grade_id]
            challenges.append(Challenge(grade_id, score, max_score, _hint(cell)))
    return Report.of(assignment, name, challenges)


def format_report(report: Report) -> str:
    """Score per challenge, then the hint for each one missed."""
    lines = [
        f"{report.assignment}/{report.notebook}.ipynb: "
        f"{report.score:g} / {report.max_score:g} points"
    ]
    width = max((len(c.name) for c in report.challenges), default=0)
    for c in report.challenges:
        mark = "ok" if c.score == c.max_score else "missed"
        line = f"  {c.name:<{width}}  {c.score:g} / {c.max_score:g}  {mark}"
        lines.append(f"{line}: {c.hint}" if c.hint else line)
    return "\n".join(lines)


def grader_installed() -> bool:
    """Whether nbgrader (and so the grader) can be imported here."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("nbgrader", "nbformat"))


def this_notebook() -> Path | None:
    """The notebook this kernel runs: Jupyter names it in ``$JPY_SESSION_NAME``; else the
    most recently saved notebook here that has the self-check cell (in the browser, the
    kernel runs in the notebook's folder of the browser's storage)."""
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session.endswith(".ipynb") and Path(session).is_file():
        return Path(session)
    found = []
    for path in Path.cwd().glob("*.ipynb"):
        with contextlib.suppress(OSError):
            if '"self_check"' in path.read_text(encoding="utf-8", errors="replace"):
                found.append(path)
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def check_notebook(notebook: str | os.PathLike[str] | None = None) -> None:
    """Grade the saved copy of this notebook (or ``notebook``) and print the report."""
    if not grader_installed():
        print(f"kvlib grade: {MISSING_GRADER}")
        return
    print_check(notebook, grade, SelfCheckError)


def print_check(
    notebook: str | os.PathLike[str] | None,
    grade_saved: Callable[[Path], Report],
    refusals: type[Exception] | tuple[type[Exception], ...],
) -> None:
    """What the "Check your work" cell prints, wherever it grades (here with nbgrader, in
    the browser without): which saved copy is graded, then the report, or one line saying
    why it cannot be (``refusals``: the errors ``grade_saved`` raises for such a copy)."""
    path = Path(notebook) if notebook is not None else this_notebook()
    if path is None:
        print("kvlib grade: cannot tell which notebook this is; call check_notebook('name.ipynb')")
        return
    if not path.is_file():
        print(f"kvlib grade: no notebook is saved at {path}; save it, or name the saved one")
        return
    saved = time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))
    print(f"Grading {path.name} as saved at {saved} ...", flush=True)
    try:
        report = grade_saved(path)
    except refusals as err:
        print(f"kvlib grade: {err}")
        return
    print(format_report(report))


def main(notebook: str, as_json: bool) -> int:
    """Grade ``notebook`` and print the report; 0 on success, 2 if it cannot be graded."""
    if not grader_installed():
        print(f"kvlib grade: {MISSING_GRADER}", file=sys.stderr)
        return 2
    try:
        report = grade(notebook)
    except SelfCheckError as err:
        print(f"kvlib grade: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json()) if as_json else format_report(report))
    return 0
