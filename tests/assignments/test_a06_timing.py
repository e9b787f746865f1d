"""Chapter 6's graded notebook, for every draw of every challenge's numbers.

``tests/assignments/test_assignments.py`` grades the notebook through nbgrader for a few
students. Here each challenge's hidden test is swept (``sweep.py``): it runs in-process
for *every* combination its ``numbers(...)`` call can draw: the reference solution must
pass, the visible check must accept it, and each named mistake must fail with
its own hint (so no mistake lands within the tolerance of the right value,
and no two mistakes give the same number without sharing a hint).
"""

from __future__ import annotations

import contextlib
import io
import math

import pytest

from assignments import sweep
from assignments.sweep import REAL_EXPECT

NOTEBOOK = sweep.Notebook("06_timing/timing.ipynb")
CELLS = NOTEBOOK.cells
ANSWERS = {
    "intensity": "intensity",
    "ridge_batch": "ridge_batch",
    "ttft_s": "ttft_s",
    "copy_fraction": "fraction",
}


@pytest.mark.parametrize("grade_id", sorted(ANSWERS))
def test_every_draw(grade_id: str) -> None:
    (hidden,) = sweep.HIDDEN.findall(CELLS[grade_id])
    (solution,) = sweep.SOLUTION.findall(CELLS[f"answer_{grade_id}"])
    challenge, choices = sweep.choices(hidden)
    assert sweep.choices(CELLS[f"numbers_{grade_id}"]) == (challenge, choices)
    name = ANSWERS[grade_id]
    # The setup, numbers and solution cells, then the visible check, as the student runs them.
    cells = [CELLS["setup"], CELLS[f"numbers_{grade_id}"], solution, CELLS[f"check_{grade_id}"]]
    for drawn in sweep.draws(challenge, choices):
        values = dict(drawn)
        with contextlib.redirect_stdout(io.StringIO()):
            student = sweep.run("\n".join(cells), drawn)
        # The reference solution passes: the real expect grades it.
        graded = sweep.run(hidden, drawn, also_grade=True, **{name: student[name]})
        answer, right, kwargs = graded["_expect_call"]
        assert answer == student[name]
        mistakes = kwargs["mistakes"]
        tolerance = max(kwargs.get("rel", 0.0), 1e-9)
        wrongs = list(mistakes.values())
        for i, (hint, wrong) in enumerate(mistakes.items()):
            assert not math.isclose(wrong, right, rel_tol=tolerance), (values, hint)
            assert all(not math.isclose(wrong, other, rel_tol=1e-6)
                       for other in wrongs[i + 1 :]), (values, hint)
            with pytest.raises(AssertionError) as failure:
                REAL_EXPECT(wrong, right, **kwargs)
            assert hint in str(failure.value), (values, hint, str(failure.value))
            assert repr(right) not in hint and f"{right:,}" not in hint


def test_hidden_tests_name_the_three_classic_mistakes() -> None:
    hidden = "".join(sweep.HIDDEN.findall("".join(CELLS.values())))
    assert "with sparsity" in hidden  # datasheet sparse FLOP/s
    assert "without synchronize" in hidden  # timing without synchronising
    assert "reads them and writes them" in hidden  # bytes counted once
