"""The chapter 4 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, every named mistake stays out of the tolerance,
the grader answers each mistake's value with its hint, and no hint quotes the answer.

Each hidden test of ``solutions/04_quantization/quantization.ipynb`` is swept
(``sweep.py``): run with ``numbers`` returning each combination of its choices in turn
and ``expect`` replaced by a recorder, so the right value and the mistakes are the
hidden test's own, not a copy.
"""

from __future__ import annotations

import math
import re

import pytest

import kvlib.grading as grading
from assignments import sweep
from assignments.sweep import REAL_EXPECT

NOTEBOOK = sweep.Notebook("04_quantization/quantization.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
UNITS = NOTEBOOK.units  # what the setup cell imports


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    hidden = sweep.HIDDEN.search(CELLS[grade_id])
    solution = sweep.SOLUTION.search(CELLS[f"answer_{grade_id}"])
    assert hidden is not None and solution is not None
    challenge, choices = sweep.choices(hidden.group(1))
    draws = 0
    for draw in sweep.draws(challenge, choices):
        draws += 1
        answer = sweep.run(solution.group(1), draw, N=draw, **UNITS)[grade_id]
        graded = sweep.run(hidden.group(1), draw, **{grade_id: answer})["_expect"]
        right, rel = graded["expected"], graded.get("rel", 1e-9)
        assert right > 0, (draw, right)
        if graded.get("integer"):
            assert right >= 1, f"{draw}: no seat fits, not a sensible problem"
        assert math.isclose(answer, right, rel_tol=max(rel, 1e-12)), (draw, answer, right)
        for hint, wrong in graded["mistakes"].items():
            assert not math.isclose(wrong, right, rel_tol=2 * max(rel, 1e-9)), (
                f"{draw}: the mistake {hint!r} gives {wrong}, too close to {right}"
            )
            # The slip's value gets its own hint, and no hint quotes the answer.
            kwargs = {k: v for k, v in graded.items() if k != "expected"}
            with pytest.raises(AssertionError) as failure:
                REAL_EXPECT(wrong, right, **kwargs)
            assert hint in str(failure.value), (draw, hint, str(failure.value))
            # Numbers as the learner reads them: not "16" in fp16, nor the 20 of 2^20.
            for quoted in re.findall(r"(?<![\w.^])\d+(?:\.\d+)?(?![\w^])", hint.replace(",", "")):
                assert not math.isclose(float(quoted), right, rel_tol=5e-3), (draw, hint)
    assert draws == math.prod(len(list(c)) for c in choices.values())


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    check = CELLS[f"check_{grade_id}"]
    for _, right in NOTEBOOK.right_values(grade_id):
        exec(sweep.compiled(check), {"plausible": grading.plausible, grade_id: right})


def test_five_challenges_worth_thirteen_points() -> None:
    points = NOTEBOOK.points
    assert len(TESTS) == 5 and sum(points) == 13
