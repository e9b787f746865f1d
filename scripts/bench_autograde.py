"""Autograde seconds per submission: chapter 1 against an empty notebook.

Both assignments are graded in one course, in one run, by ``nbgrader
autograde`` with the course's settings (sandboxed kernel, hidden tests
checked outside it). The time per submission is read from nbgrader's own
log timestamps, from one student's "Sanitizing" line to the next, so the
command's start-up is left out of both figures. The target is a ratio of at
most 1.2: grading chapter 1 should cost little more than starting a kernel.

Usage: ``python scripts/bench_autograde.py [--students N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlib.grading.course import make_course, run_nbgrader  # noqa: E402

CHAPTER = "01_kv_cache"
EMPTY = "00_empty"
ANSWERS = {
    "answer_bytes_per_token": "bytes_per_token = 2 * 48 * 8 * 128 * 1",
    "answer_seats": "seats = (30 * 2**30) // (10_000 * 131_072)",
    "answer_prefill_s": "prefill_s = 2 * 32e9 * 6000 / 400e12",
}
_LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) .*Sanitizing .*/submitted/([^/]+)/")
_LOG_ARGS = (
    "--Application.log_datefmt=%H:%M:%S",
    "--Application.log_format=%(asctime)s.%(msecs)03d %(message)s",
)


def _empty_assignment(course: Path) -> None:
    """An assignment whose notebook has one graded cell and nothing else to run."""
    cell = nbformat.v4.new_code_cell("", id="only")
    cell.metadata["nbgrader"] = {
        "schema_version": 3, "grade": True, "solution": False, "locked": True,
        "grade_id": "only", "points": 1,
    }  # fmt: skip
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    (course / "solutions" / EMPTY).mkdir(parents=True)
    nbformat.write(nb, course / "solutions" / EMPTY / "empty.ipynb")


def _submit(course: Path, assignment: str, students: list[str]) -> None:
    release = next((course / "exercises" / assignment).glob("*.ipynb"))
    nb = nbformat.read(release, as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.source = ANSWERS.get(grade_id, cell.source)
    for student in students:
        target = course / "submitted" / student / assignment / release.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)


def _per_submission_s(log: str) -> list[float]:
    """Seconds between consecutive students' "Sanitizing" lines."""
    stamps = [
        datetime.strptime(m.group(1), "%H:%M:%S.%f")
        for m in map(_LINE.match, log.splitlines())
        if m
    ]
    return [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:], strict=False)]


def _grade(course: Path, assignment: str) -> list[float]:
    shutil.rmtree(course / "autograded", ignore_errors=True)
    log = run_nbgrader(course, "autograde", assignment, *_LOG_ARGS)
    return _per_submission_s(log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=6, help="submissions per assignment")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    args = parser.parse_args(argv)
    students = [f"student{i:02d}" for i in range(args.students + 1)]
    with tempfile.TemporaryDirectory(prefix="kvlib-bench-") as tmp:
        course = make_course(Path(tmp), ROOT, [CHAPTER], sandbox="auto")
        _empty_assignment(course)
        for assignment in (CHAPTER, EMPTY):
            run_nbgrader(course, "generate_assignment", assignment, "--force")
            _submit(course, assignment, students)
        times: dict[str, list[float]] = {CHAPTER: [], EMPTY: []}
        for _ in range(args.rounds):
            for assignment in (EMPTY, CHAPTER):
                times[assignment] += _grade(course, assignment)
    chapter, empty = statistics.median(times[CHAPTER]), statistics.median(times[EMPTY])
    print(f"submissions timed: {len(times[CHAPTER])} per assignment ({args.rounds} rounds)")
    print(f"empty notebook: {empty:.2f} s per submission (median)")
    print(f"chapter 1:      {chapter:.2f} s per submission (median)")
    print(f"ratio:          {chapter / empty:.2f}x (target <= 1.2x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
