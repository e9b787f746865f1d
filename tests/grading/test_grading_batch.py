"""course.apps.batch (``make grade``): the same results as serial ``nbgrader autograde``.

The same class (``grading_support.CLASS``) is graded twice, in two copies of one
course: once by ``nbgrader autograde`` and ``nbgrader export`` (one process, one
student after another) and once by ``make grade``'s batch with two workers.
Scores per cell, ``grades.csv`` (flags included) and the graded notebooks must be
equal. The class mixes right, wrong and blank answers with submissions that need
repairing, so the repair path is compared too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from grading_support import (
    ASSIGNMENT,
    CHALLENGES,
    CLASS,
    NOTEBOOK,
    cell_scores,
    graded_class,
    grades,
    read,
)

from course.apps.batch import main as make_grade

pytestmark = pytest.mark.notebooks


SCORES = {student: score for student, (score, _) in CLASS.items()}


@dataclass
class Runs:
    serial: Path
    parallel: Path
    status: int


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(*graded_class(tmp_path_factory))


def test_batch_succeeded(runs: Runs) -> None:
    assert runs.status == 0


def test_same_scores_cell_by_cell(runs: Runs) -> None:
    serial = cell_scores(runs.serial)
    assert len(serial) == len(CLASS) * len(CHALLENGES)  # every challenge of every student
    assert cell_scores(runs.parallel) == serial


def test_same_grades_csv(runs: Runs) -> None:
    serial = grades(runs.serial)
    assert {s: float(r["score"]) for s, r in serial.items()} == SCORES
    for student, (_, flag) in CLASS.items():
        assert flag in serial[student]["flags"] and bool(flag) == bool(serial[student]["flags"])
    assert grades(runs.parallel) == serial


def test_same_graded_notebooks(runs: Runs) -> None:
    def view(course: Path, student: str) -> list[Any]:
        nb = read(course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb")
        return [(c.cell_type, c.source, c.get("outputs"), c.metadata.get("nbgrader"))
                for c in nb.cells] + [nb.metadata.get("kvlib")]

    for student in grades(runs.serial):
        assert view(runs.parallel, student) == view(runs.serial, student), student


def test_regrade_skips_graded_work(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    """Run again (as after late submissions): nothing new, nothing regraded, same grades."""
    before = grades(runs.parallel)
    status = make_grade([ASSIGNMENT, "--jobs", "1", "--no-feedback", "--student", "right_1",
                         "--course", str(runs.parallel)])
    assert status == 0 and "right_1: up to date" in capsys.readouterr().out
    assert grades(runs.parallel) == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_assignment"], "no assignment solutions/no_such_assignment"),
        ([ASSIGNMENT, "--student", "nobody"], "nothing under submitted/*/01_kv_cache/"),
    ],
)
def test_clear_errors(
    runs: Runs, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert make_grade([*argv, "--course", str(runs.parallel)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"make grade: {message}"


def test_outside_a_course(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert make_grade([ASSIGNMENT, "--course", str(tmp_path)]) == 2
    assert "no course found" in capsys.readouterr().err
