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

import pytest

from assignments import sweep
from assignments.sweep import REAL_EXPECT

NOTEBOOK = sweep.Notebook("04_quantization/quantization.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
UNITS = NOTEBOOK.units  # what the setup cell imports


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    # Two slips may coincide (1 byte per element vs no factor 2 on a 2-byte cache): the
    # grader then names both, which the loop below checks.
    for g in sweep.assert_solved_with_distinct_mistakes(NOTEBOOK, grade_id, distinct=False):
        if g.kwargs.get("integer"):
            assert g.right >= 1, f"{g.draw}: no seat fits, not a sensible problem"
        for hint, wrong in g.mistakes:
            # The grader answers the slip's value with that slip's hint.
            with pytest.raises(AssertionError) as failure:
                REAL_EXPECT(wrong, g.right, **g.kwargs)
            assert hint in str(failure.value), (g.draw, hint, str(failure.value))


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    sweep.assert_visible_check_accepts_right_answers(NOTEBOOK, grade_id)


def test_five_challenges_worth_twelve_points() -> None:
    points = NOTEBOOK.points
    assert TESTS == ["weights_gb", "clip_limit", "tokens_per_s", "max_error", "kv_seats"]
    assert sum(points) == 12


def test_vllms_warm_up_leaves_headroom_and_llm_compressor_none() -> None:
    """On every draw of challenge 2, llm-compressor's scale saturates exactly at the
    calibration maximum, vLLM's at 448 / 200 = 2.24 times it for keys and 4.48 for values."""
    factor = {
        ("llm-compressor", "keys"): 1,
        ("llm-compressor", "values"): 1,
        ("vLLM warm-up", "keys"): 448 / 200,
        ("vLLM warm-up", "values"): 448 / 100,
    }
    for draw, right in NOTEBOOK.right_values("clip_limit"):
        assert math.isclose(right, factor[draw.rule, draw.tensor] * draw.calib_max), draw
