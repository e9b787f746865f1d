"""Chapter 6's graded notebook, for every draw of every challenge's numbers.

``tests/assignments/test_assignments.py`` grades the notebook through nbgrader for a few
students. Here each challenge's hidden test runs in-process for *every*
combination its ``numbers(...)`` call can draw: the reference solution must
pass, the visible check must accept it, and each named mistake must fail with
its own hint (so no mistake lands within the tolerance of the right value,
and no two mistakes give the same number without sharing a hint).
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import math
import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

import kvlib.grading
from kvlib.grading import Numbers

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "solutions" / "06_timing" / "timing.ipynb"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
ANSWERS = {
    "intensity": "intensity",
    "ridge_batch": "ridge_batch",
    "ttft_s": "ttft_s",
    "copy_fraction": "fraction",
}


def _cells() -> dict[str, str]:
    notebook = nbformat.read(SOURCE, as_version=4)
    return {
        cell.metadata["nbgrader"]["grade_id"]: cell.source
        for cell in notebook.cells
        if "nbgrader" in cell.metadata
    }


CELLS = _cells()


def _draws(source: str) -> tuple[str, list[dict[str, Any]]]:
    """The challenge name and every combination its ``numbers(...)`` call can draw."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "numbers":
            challenge = ast.literal_eval(node.args[0])
            choices = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
            names = list(choices)
            combos = itertools.product(*(choices[n] for n in names))
            return challenge, [dict(zip(names, combo, strict=True)) for combo in combos]
    raise AssertionError("no numbers(...) call")


@pytest.mark.parametrize("grade_id", sorted(ANSWERS))
def test_every_draw(grade_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (hidden,) = HIDDEN.findall(CELLS[grade_id])
    (solution,) = SOLUTION.findall(CELLS[f"answer_{grade_id}"])
    challenge, draws = _draws(hidden)
    assert _draws(CELLS[f"numbers_{grade_id}"]) == (challenge, draws)
    real_expect = kvlib.grading.expect
    seen: list[tuple[Any, float, dict[str, Any]]] = []

    def recording_expect(answer: Any, expected: float, **kwargs: Any) -> None:
        seen.append((answer, expected, kwargs))
        real_expect(answer, expected, **kwargs)

    monkeypatch.setattr(kvlib.grading, "expect", recording_expect)
    name = ANSWERS[grade_id]
    student_cells = [compile(CELLS[c], c, "exec") for c in ("setup", f"numbers_{grade_id}")]
    student_cells.append(compile(solution, "solution", "exec"))
    student_cells.append(compile(CELLS[f"check_{grade_id}"], "check", "exec"))
    hidden_code = compile(hidden, "hidden", "exec")
    for values in draws:
        drawn = Numbers(challenge, values)
        monkeypatch.setattr(kvlib.grading, "numbers", lambda *a, _d=drawn, **k: _d)
        student: dict[str, Any] = {}
        with contextlib.redirect_stdout(io.StringIO()):
            for code in student_cells:  # numbers, solution, then the visible check
                exec(code, student)
        exec(hidden_code, {name: student[name]})  # the reference solution passes
        answer, right, kwargs = seen[-1]
        assert answer == student[name]
        mistakes = kwargs["mistakes"]
        tolerance = max(kwargs.get("rel", 0.0), 1e-9)
        wrongs = list(mistakes.values())
        for i, (hint, wrong) in enumerate(mistakes.items()):
            assert not math.isclose(wrong, right, rel_tol=tolerance), (values, hint)
            assert all(not math.isclose(wrong, other, rel_tol=1e-6)
                       for other in wrongs[i + 1 :]), (values, hint)  # fmt: skip
            with pytest.raises(AssertionError) as failure:
                real_expect(wrong, right, **kwargs)
            assert hint in str(failure.value), (values, hint, str(failure.value))
            assert repr(right) not in hint and f"{right:,}" not in hint


def test_hidden_tests_name_the_three_classic_mistakes() -> None:
    hidden = "".join(HIDDEN.findall("".join(CELLS.values())))
    assert "with sparsity" in hidden  # datasheet sparse FLOP/s
    assert "without synchronize" in hidden  # timing without synchronising
    assert "reads them and writes them" in hidden  # bytes counted once
