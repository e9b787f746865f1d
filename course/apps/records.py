"""What a grading run left half-done, found before ``make grade`` grades, and undone.

A student's grading writes in three places that no transaction spans: the
gradebook's rows (nbgrader's ``add_submission`` makes a submission with a
grade for each graded cell and a comment for each answer and task cell; the
autograde then fills them), the graded folder ``autograded/<id>/<a>/`` and the
feedback folder. A run killed, or a database that went away, between two of
those writes leaves a student *partial*, and nbgrader's own rule (skip a
student whose graded folder exists) then skips the student for good, or
fails on the missing row (``MissingEntry: No such taskcomment``) on every run.

:func:`partial` names each such student and why; :func:`undo` removes what
was half-written (the gradebook's submission when its rows are incomplete, the
graded and feedback folders) so the student is graded again from the
submission, as for the first time. Complete records are never removed (they
may hold a grader's manual scores).

A submission's bytes are also remembered when it is graded
(``.grading/<assignment>/<id>.sha256``): a submission changed after (or while)
it was graded is graded again, whatever its timestamp says.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

__all__ = ["digest", "missing_rows", "partial", "remember", "remembered", "undo"]

_STATE = Path(".grading")


def missing_rows(submission: Any) -> list[str]:
    """The rows nbgrader's ``add_submission`` makes for ``submission`` that are not there:
    a grade per graded (and task) cell, a comment per answer (and task) cell."""
    missing = []
    have = {nb.name: nb for nb in submission.notebooks}
    for notebook in submission.assignment.notebooks:
        nb = have.get(notebook.name)
        if nb is None:
            missing.append(f"notebook {notebook.name}")
            continue
        graded = {g.cell_id for g in nb.grades}
        commented = {c.cell_id for c in nb.comments}
        missing += [f"grade {notebook.name}/{c.name}"
                    for c in [*notebook.grade_cells, *notebook.task_cells] if c.id not in graded]
        missing += [f"comment {notebook.name}/{c.name}"
                    for c in [*notebook.solution_cells, *notebook.task_cells]
                    if c.id not in commented]
    return missing


def _folder_complete(folder: Path, notebooks: list[str], suffix: str) -> bool:
    return folder.is_dir() and all((folder / f"{n}{suffix}").is_file() for n in notebooks)


def partial(gb: Any, root: Path, assignment: str, students: list[str], *,
            feedback: bool) -> dict[str, str]:
    """Students whose grading was left half-done, with what is wrong (one phrase each).

    ``gb``: the course's nbgrader ``Gradebook``; ``feedback``: whether this run gives
    feedback (then a graded student without their feedback page is partial too)."""
    from nbgrader.api import MissingEntry

    try:
        notebooks = sorted(n.name for n in gb.find_assignment(assignment).notebooks)
    except MissingEntry:  # not in the gradebook yet: only folders can be left over
        notebooks = sorted(p.stem for p in (root / "solutions" / assignment).glob("*.ipynb"))
    found = {}
    for student in students:
        graded = root / "autograded" / student / assignment
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            submission = None
        if submission is None:
            if graded.exists():
                found[student] = "a graded folder without gradebook records"
            continue
        if missing := missing_rows(submission):
            shown = ", ".join(missing[:2]) + (f" and {len(missing) - 2} more"
                                              if len(missing) > 2 else "")
            found[student] = f"gradebook records partial (no {shown})"
        elif not graded.exists():
            found[student] = "gradebook records without a graded folder"
        elif not _folder_complete(graded, notebooks, ".ipynb"):
            found[student] = "a graded folder cut off before its notebooks were written"
        elif feedback and not _folder_complete(root / "feedback" / student / assignment,
                                               notebooks, ".html"):
            found[student] = "graded, but its feedback was never written"
    return found


def undo(gb: Any, root: Path, assignment: str, student: str) -> None:
    """Remove ``student``'s half-written grading: an incomplete submission's rows, the graded
    and feedback folders. Complete rows stay (the regrade overwrites their scores)."""
    from nbgrader.api import MissingEntry

    try:
        submission = gb.find_submission(assignment, student)
    except MissingEntry:
        submission = None
    if submission is not None and missing_rows(submission):
        gb.remove_submission(assignment, student)
    for folder in ("autograded", "feedback"):
        shutil.rmtree(root / folder / student / assignment, ignore_errors=True)


def digest(root: Path, assignment: str, student: str) -> str:
    """SHA-256 of the submission's regular files, names and bytes, in name order."""
    folder = root / "submitted" / student / assignment
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink():
            h.update(str(path.relative_to(folder)).encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _record(root: Path, assignment: str, student: str) -> Path:
    return root / _STATE / assignment / f"{student}.sha256"


def remembered(root: Path, assignment: str, student: str) -> str:
    """The digest of the submission as it was when it was last graded ("" if unknown)."""
    path = _record(root, assignment, student)
    return path.read_text().strip() if path.is_file() else ""


def remember(root: Path, assignment: str, student: str, value: str) -> None:
    """Record ``value``, the digest of the bytes that were graded."""
    path = _record(root, assignment, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
