"""Per-student flags: what grading repaired or could not do, carried to the export and feedback.

A flag is one sentence ("hidden-test cell seats was deleted: restored",
"answer_seats: the kernel used more than 2 GiB of memory; ..."). Flags live in
the graded notebook's metadata under ``kvlib.flags`` (written by the repairing
reader and the execute step, never taken from a student's file) and are shown:

- in ``grades.csv``, a ``flags`` column (:class:`FlaggedCsvExport`, nbgrader's
  CSV columns plus that one, properly quoted);
- at the top of the student's feedback (:class:`FlagsInFeedback`);
- in the gradebook, as the notebook's ``flagged`` mark that nbgrader's
  formgrader lists (:class:`RecordFlags`).
"""

from __future__ import annotations

import csv
import os
from typing import Any

import nbformat
from nbformat import NotebookNode
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins import ExportPlugin
from nbgrader.preprocessors import NbGraderPreprocessor

__all__ = [
    "CSV_COLUMNS",
    "FlaggedCsvExport",
    "FlagsInFeedback",
    "RecordFlags",
    "add_flag",
    "flags_of",
]

_KEY = "kvlib"
CSV_COLUMNS = (
    "assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
    "raw_score", "late_submission_penalty", "score", "max_score", "flags",
)


def add_flag(nb: NotebookNode, text: str) -> None:
    """Record ``text`` on the notebook being graded."""
    nb.metadata.setdefault(_KEY, {}).setdefault("flags", []).append(text)


def flags_of(nb: NotebookNode) -> list[str]:
    """The flags recorded on a graded notebook (empty when none)."""
    flags = nb.metadata.get(_KEY, {}).get("flags", [])
    return [str(f) for f in flags] if isinstance(flags, list) else []


class FlagsInFeedback(NbGraderPreprocessor):  # type: ignore[misc]
    """Feedback: a first cell listing the flags, when there are any."""

    def preprocess(
        self, nb: NotebookNode, resources: dict[str, Any]
    ) -> tuple[NotebookNode, dict[str, Any]]:
        flags = flags_of(nb)
        if flags:
            lines = "\n".join(f"- {flag}" for flag in flags)
            text = (
                f"**Notes from the grader** (what happened while grading this notebook):\n\n{lines}"
            )
            nb.cells.insert(0, nbformat.v4.new_markdown_cell(text))  # type: ignore[no-untyped-call]
        return nb, resources


class RecordFlags(NbGraderPreprocessor):  # type: ignore[misc]
    """Autograde: mark a notebook with flags as ``flagged`` in the gradebook."""

    def preprocess(
        self, nb: NotebookNode, resources: dict[str, Any]
    ) -> tuple[NotebookNode, dict[str, Any]]:
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            notebook = gb.find_submission_notebook(
                info["notebook"], info["assignment"], info["student"]
            )
            notebook.flagged = bool(flags_of(nb))
            gb.db.commit()
        return nb, resources


def _flags(coursedir: Any, student: str, assignment: Any) -> list[str]:
    """Flags of every notebook of ``student``'s graded ``assignment``."""
    folder = coursedir.format_path(coursedir.autograded_directory, student, assignment.name)
    found = []
    for notebook in assignment.notebooks:
        path = os.path.join(folder, f"{notebook.name}.ipynb")
        if os.path.isfile(path):
            found += flags_of(nbformat.read(path, as_version=4))  # type: ignore[no-untyped-call]
        else:
            found.append(f"{notebook.name}.ipynb was not graded: see the grading log")
    return found


class FlaggedCsvExport(ExportPlugin):  # type: ignore[misc]
    """nbgrader's CSV export with a ``flags`` column (``"; "``-separated sentences)."""

    def export(self, gradebook: Gradebook) -> None:
        dest = self.to or "grades.csv"
        coursedir = getattr(self.parent, "coursedir", None)
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        self.log.info("Exporting grades to %s", dest)
        with open(dest, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_COLUMNS)
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    writer.writerow(self._row(gradebook, coursedir, assignment, student))

    @staticmethod
    def _row(gradebook: Gradebook, coursedir: Any, assignment: Any, student: Any) -> list[str]:
        row: dict[str, Any] = {
            "assignment": assignment.name,
            "duedate": assignment.duedate,
            "student_id": student.id,
            "last_name": student.last_name,
            "first_name": student.first_name,
            "email": student.email,
            "max_score": assignment.max_score,
        }
        try:
            submission = gradebook.find_submission(assignment.name, student.id)
        except MissingEntry:
            row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0)
            row["flags"] = "no submission"
        else:
            penalty = submission.late_submission_penalty
            row.update(
                timestamp=submission.timestamp,
                raw_score=submission.score,
                late_submission_penalty=penalty,
                score=max(0.0, submission.score - penalty),
            )
            flags = _flags(coursedir, student.id, assignment) if coursedir is not None else []
            row["flags"] = "; ".join(flags)
        return ["" if row[k] is None else str(row[k]) for k in CSV_COLUMNS]
