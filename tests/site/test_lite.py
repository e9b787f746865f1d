"""The exercises in JupyterLite: the browser's "Check your work" against ``kvlib grade``,
and chapter 5's notebook run end to end in headless Chromium, offline.

1. ``kvlib_lite.check`` (lite/py, shipped in the site) grades without nbgrader. On the
   same saved notebook and student it must give ``kvlib grade``'s report exactly (every
   score and hint): checked on honest answers (the solutions'), blank ones (as
   released) and typical wrong ones (each answer scaled by a slip: milliseconds for
   seconds, a percentage for a share, all requests admitted).
2. The built lite site (scripts/build_lite.py) in Chromium, every host but 127.0.0.1
   unresolvable and every request recorded: open ``05_rate_limiting``, answer the
   student-id question, run all on the notebook as released (it must reach the end:
   every challenge's numbers printed, each check saying it is not answered), fill in
   the solutions' answers, save, run all; the draws are
   the given student's, the check cell prints the full score; then one wrong answer
   (milliseconds), saved, and the check cell run again names that mistake. The
   browser's report must equal the one ``kvlib_lite.check`` gives in CPython for the
   notebook the browser saved. The student id is asked in the page (no browser
   prompt). After a reload the edited notebook and the id are still there, and the id
   is not asked again.
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

from course.apps.selfcheck import format_report  # noqa: E402
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


def _numbers_output(student: str) -> str:
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


@pytest.mark.site
def test_exercise_runs_in_the_browser_offline() -> None:
    import bench_lite
    import build_lite

    site = build_lite.build()
    answers = solution_answers()
    data = check.assignment_data(ROOT)
    first_numbers = next(g for g in data[ASSIGNMENT]["rate_limiting"]["cells"]
                         if g.startswith("numbers_"))
    native: list[str] = []
    with bench_lite.browser_page(site) as (page, base, recorder):
        def answer(dialog: Any) -> None:
            if dialog.type != "beforeunload":  # "leave the page?" on reload (unsaved outputs)
                native.append(dialog.type)  # none expected: the id is asked in the page
            dialog.accept()

        page.on("dialog", answer)
        page.goto(f"{base}lab/index.html?path={ASSIGNMENT}/rate_limiting.ipynb")
        asked = bench_lite.answer_student_id(page, STUDENT)
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        # Run All on the notebook as released: it stops nowhere, every challenge prints its
        # numbers and its check says it is not answered yet; the check grades it 0.
        bench_lite.save_and_run_all(page)
        bench_lite.output_of(page, "self_check", r": 0 / \d+ points")
        blank = {gid: out for gid, _, out in bench_lite.cells(page)}
        bench_lite.set_sources(page, answers)
        bench_lite.save_and_run_all(page)
        report = bench_lite.output_of(page, "self_check", r": (\d+) / \1 points")
        drawn = next(out for gid, _, out in bench_lite.cells(page) if gid == first_numbers)
        saved_right = page.evaluate(
            "async (p) => (await window.jupyterapp.serviceManager.contents.get(p, "
            "{content: true, type: 'notebook'})).content",
            f"{ASSIGNMENT}/rate_limiting.ipynb",
        )
        # One wrong answer, the notebook saved again, the check cell run again.
        name = answer_names()["answer_p95_wait_s"]
        bench_lite.set_sources(page, {"answer_p95_wait_s": wrong_answers()["answer_p95_wait_s"]})
        bench_lite.save_and_run_cell(page, "self_check")
        wrong_report = bench_lite.output_of(page, "self_check", r"missed")
        # A reload keeps the learner's work and id (the browser's storage): not asked again.
        page.reload()
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        kept = {gid: src for gid, src, _ in bench_lite.cells(page)}["answer_p95_wait_s"]
        shown_id = page.locator("#kvlib-id-button").get_attribute("data-student-id")
        asked_again = page.locator("#kvlib-id-dialog[open]").count()
        stored_id = page.evaluate(
            "async () => (await window.jupyterapp.serviceManager.contents.get("
            "'kvlib_student_id.txt', {content: true})).content"
        )
        remote = recorder.remote()

    assert remote == [], f"requests left the site: {remote}"
    challenges = [g[len("answer_"):] for g in answers]
    for challenge in challenges:
        assert blank[f"numbers_{challenge}"].strip(), challenge
        assert "is not answered yet" in blank[f"check_{challenge}"], challenge
    assert native == []
    # The in-page question says what the id is for and how to change it later.
    assert "numbers" in asked and "change it later" in asked
    assert stored_id.strip() == STUDENT
    assert shown_id == STUDENT and asked_again == 0
    assert kept == wrong_answers()["answer_p95_wait_s"]
    # The numbers were drawn for the id given, which draws other numbers than the default.
    assert drawn.strip() == _numbers_output(STUDENT).strip()
    assert _numbers_output(STUDENT) != _numbers_output("self-study")
    expected = check.grade_notebook(saved_right, STUDENT, data)
    assert expected.score == expected.max_score > 0
    assert format_report(expected) in report
    assert f"{expected.score:g} / {expected.max_score:g} points" in report
    # The named mistake for the wrong answer, the rest still right.
    line = next(li for li in wrong_report.splitlines() if li.strip().startswith(name))
    assert "missed" in line and "milliseconds" in line
    assert wrong_report.count("missed") == 1
