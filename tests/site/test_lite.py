"""The exercises in JupyterLite: the browser's "Check your work" against ``kvlib grade``.

1. ``kvlib_lite.check`` (lite/py, shipped in the site) grades without nbgrader. On the
   same saved notebook and student it must give ``kvlib grade``'s report exactly (every
   score and hint): checked on honest answers (the solutions'), blank ones (as
   released) and typical wrong ones (each answer scaled by a slip: milliseconds for
   seconds, a percentage for a share, all requests admitted).
2. The built lite site in Chromium, a learner's whole session (opening, the id, running
   the notebook as released and answered, a reload, a link to another notebook) is
   tests/site/test_lite_learner.py's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from site_helpers import ROOT

sys.path.insert(0, str(ROOT / "lite" / "py"))
sys.path.insert(0, str(ROOT / "scripts"))

from kvlib_lite import check  # noqa: E402

from course.checks import grading_student  # noqa: E402

ASSIGNMENT = "05_rate_limiting"
SOLUTION = ROOT / "solutions" / ASSIGNMENT / "rate_limiting.ipynb"
RELEASED = ROOT / "exercises" / ASSIGNMENT / "rate_limiting.ipynb"
STUDENT = "lite-test-student"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.DOTALL)


def _meta(cell: dict[str, Any]) -> dict[str, Any]:
    return dict(cell.get("metadata", {}).get("nbgrader", {}))


def solution_answers() -> dict[str, str]:
    """grade_id -> source of each answer cell in the solution notebook."""
    nb = json.loads(SOLUTION.read_text(encoding="utf-8"))
    return {_meta(c)["grade_id"]: "".join(c["source"]) for c in nb["cells"]
            if _meta(c).get("solution")}


def answer_names() -> dict[str, str]:
    """grade_id of each answer cell -> the name its test reads (the last one assigned)."""
    names = {}
    for grade_id, source in solution_answers().items():
        assigned = re.findall(r"^(\w+)\s*=", source, re.MULTILINE)
        names[grade_id] = assigned[-1]
    return names


def wrong_answers() -> dict[str, str]:
    """The solutions with a typical slip on each answer: seconds given in milliseconds,
    a share as a percentage, a count of everything asked."""
    wrong = {}
    for grade_id, source in solution_answers().items():
        name = answer_names()[grade_id]
        factor = "100" if "fraction" in name or "share" in name else "1000"
        wrong[grade_id] = f"{source}\n{name} = {name} * {factor}\n"
    return wrong


def notebook_with(answers: dict[str, str] | None) -> dict[str, Any]:
    """The assignment as a learner would save it: the solution notebook without hidden
    tests, each answer cell holding ``answers[grade_id]`` (None: the released stub)."""
    nb = json.loads(SOLUTION.read_text(encoding="utf-8"))
    released = json.loads(RELEASED.read_text(encoding="utf-8"))
    stubs = {_meta(c).get("grade_id"): "".join(c["source"]) for c in released["cells"]}
    for cell in nb["cells"]:
        meta = _meta(cell)
        source = "".join(cell["source"])
        if meta.get("solution"):
            source = stubs[meta["grade_id"]] if answers is None else answers[meta["grade_id"]]
        cell["source"] = HIDDEN.sub("", source)
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return nb


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    """The assignments as the lite build ships them."""
    return check.assignment_data(ROOT)


@pytest.mark.notebooks
@pytest.mark.parametrize("variant", ["honest", "blank", "wrong"])
def test_browser_check_matches_kvlib_grade(
    variant: str, data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from course.apps.selfcheck import grade

    answers = {"honest": solution_answers(), "blank": None, "wrong": wrong_answers()}[variant]
    path = tmp_path / "rate_limiting.ipynb"
    path.write_text(json.dumps(notebook_with(answers)), encoding="utf-8")
    monkeypatch.setenv("KVLIB_STUDENT_ID", STUDENT)
    # nbgrader shells out to alembic, installed beside this interpreter.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    expected = grade(path).to_json()
    got = check.grade_notebook(json.loads(path.read_text()), STUDENT, data).to_json()
    assert got == expected
    scores = [c["score"] for c in got["challenges"]]
    if variant == "honest":
        assert got["score"] == got["max_score"] > 0
    else:  # every challenge missed, each with a hint
        assert scores == [0.0] * len(scores)
        assert all(c["hint"] for c in got["challenges"])


def test_wrong_answers_get_named_mistakes(data: dict[str, Any]) -> None:
    # The slips above are ones the hidden tests name, not generic "wrong" messages:
    # a seconds answer given in milliseconds is diagnosed as such.
    report = check.grade_notebook(notebook_with(wrong_answers()), STUDENT, data)
    hints = {c.name: c.hint for c in report.challenges}
    assert "milliseconds" in hints["p95_wait_s"]


def test_the_check_refuses_a_notebook_of_no_assignment(data: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="not one of the course's notebooks"):
        check.grade_notebook({"cells": [{"cell_type": "code", "source": "x = 1"}]}, STUDENT, data)


def numbers_output(student: str) -> str:
    """What the first numbers cell prints for ``student`` (run here, in CPython)."""
    nb = json.loads(RELEASED.read_text(encoding="utf-8"))
    namespace: dict[str, Any] = {}
    out = io.StringIO()
    with grading_student(student), contextlib.redirect_stdout(out):
        for cell in nb["cells"]:
            grade_id = _meta(cell).get("grade_id", "")
            if grade_id == "setup" or grade_id.startswith("numbers_"):
                out.seek(0)
                out.truncate()
                exec("".join(cell["source"]), namespace)
                if grade_id.startswith("numbers_"):
                    return out.getvalue()
    raise AssertionError("the notebook has no numbers cell")
