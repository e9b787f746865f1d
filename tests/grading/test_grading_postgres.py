"""The gradebook on PostgreSQL: ``make grade`` against a real server (Debian's PostgreSQL).

A throwaway server on loopback (``postgres_support``) holds the gradebook of a
small class; several workers write to it at once. The scores, flags and
export must be those the SQLite gradebook gives, and nothing is written to a
``gradebook.db`` file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg2
import pytest
from grading_support import (
    ASSIGNMENT,
    CHALLENGES,
    CLASSIC_WRONG,
    NOTEBOOK,
    RIGHT,
    ROOT,
    TOTAL,
    built_once,
    duplicated_answer,
    grades,
    submitted,
    write,
)
from grading_support import submission as notebook
from postgres_support import postgres_available, postgres_server

from course.apps.batch import main as make_grade
from course.apps.scratch import make_course, run_nbgrader

pytestmark = pytest.mark.notebooks


def _grade_class(folder: Path) -> dict[str, Any]:
    """Grade a class into a fresh server; read back, while it runs, what the tests check."""
    assert postgres_available(), "install Debian's PostgreSQL: apt-get install postgresql"
    with postgres_server() as url:
        course = make_course(folder, ROOT, [ASSIGNMENT], db_url=url)
        release = ROOT / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
        students = {
            "ada": notebook(RIGHT, release),
            "ben": notebook({**RIGHT, "answer_seats": CLASSIC_WRONG["seats"][0]}, release),
            "cy": duplicated_answer(release, "answer_prefill_s"),
            "dee": notebook({}, release),
        }
        for name, nb in students.items():
            write(nb, submitted(course, name))
        status = make_grade([ASSIGNMENT, "--jobs", "2", "--course", str(course)])
        with psycopg2.connect(url) as db, db.cursor() as cur:
            cur.execute(
                "SELECT a.student_id, n.flagged FROM submitted_notebook n "
                "JOIN submitted_assignment a ON n.assignment_id = a.id ORDER BY a.student_id"
            )
            flagged = cur.fetchall()
            cur.execute("SELECT COUNT(*) FROM grade")
            cells = cur.fetchone()[0]
        # The plain nbgrader command, on the course's config, reads the same gradebook.
        (course / "grades.csv").rename(course / "make_grade.csv")
        run_nbgrader(course, "export")
    return {"status": status, "flagged": flagged, "cells": cells}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    course, result = built_once(tmp_path_factory, "postgres", _grade_class)
    return course, result


def test_graded_into_postgres(graded: tuple[Path, dict[str, Any]]) -> None:
    course, result = graded
    assert result["status"] == 0
    rows = grades(course)
    assert {s: float(r["score"]) for s, r in rows.items()} == {
        "ada": TOTAL, "ben": TOTAL - 2, "cy": TOTAL, "dee": 0.0
    }
    assert "answer_prefill_s appeared 2 times" in rows["cy"]["flags"]
    assert not (course / "gradebook.db").exists()


def test_gradebook_rows_in_the_server(graded: tuple[Path, dict[str, Any]]) -> None:
    _, result = graded
    assert [tuple(r) for r in result["flagged"]] == [
        ("ada", False), ("ben", False), ("cy", True), ("dee", False)
    ]
    assert result["cells"] == 4 * len(CHALLENGES)  # graded cells, 4 students


def test_nbgrader_cli_reads_the_same_gradebook(graded: tuple[Path, dict[str, Any]]) -> None:
    course, _ = graded
    assert (course / "grades.csv").read_text() == (course / "make_grade.csv").read_text()


def test_feedback_written(graded: tuple[Path, dict[str, Any]]) -> None:
    course, _ = graded
    html = course / "feedback" / "cy" / ASSIGNMENT / f"{NOTEBOOK}.html"
    assert "Notes from the grader" in html.read_text()
