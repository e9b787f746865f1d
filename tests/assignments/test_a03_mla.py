"""The chapter 3 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, every named mistake stays out of the tolerance, and
the sparse-query challenge's formula is what ``kvlib.mla.latent_read_cost`` counts.

Each hidden test of ``solutions/03_mla/mla.ipynb`` is swept (``sweep.py``): run with
``numbers`` returning each combination of its choices in turn and ``expect`` replaced by
a recorder, so the right value and the mistakes are the hidden test's own, not a copy.
"""

from __future__ import annotations

import math

import pytest

import kvlib.grading as grading
from assignments import sweep
from kvlib.mla import IndexerShape, MLAShape, latent_read_cost
from kvlib.units import MiB

NOTEBOOK = sweep.Notebook("03_mla/mla.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
# The challenges enumerated draw by draw here; the first four are exercised through nbgrader
# by tests/assignments/test_assignments.py.
ENUMERATED = ["sparse_query_mib"]
UNITS = NOTEBOOK.units


def test_five_challenges_worth_ten_points() -> None:
    points = NOTEBOOK.points
    assert TESTS == [
        "latent_bytes",
        "reduction",
        "seats_gained",
        "absorbed_flops",
        "sparse_query_mib",
    ]
    assert sum(points) == 10


@pytest.mark.parametrize("grade_id", ENUMERATED)
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
        assert math.isclose(answer, right, rel_tol=max(rel, 1e-12)), (draw, answer, right)
        wrongs = list(graded["mistakes"].items())
        assert len(wrongs) >= 3
        for hint, wrong in wrongs:
            assert not math.isclose(wrong, right, rel_tol=2 * max(rel, 1e-9)), (
                f"{draw}: the mistake {hint!r} gives {wrong}, too close to {right}"
            )
            assert f"{right:,}" not in hint and str(right) not in hint, "a hint leaks the answer"
        # Two hints for one wrong value would make the diagnosis ambiguous.
        values = [w for _, w in wrongs]
        for i, a in enumerate(values):
            assert not any(math.isclose(a, b, rel_tol=1e-6) for b in values[i + 1 :]), draw
    assert draws == math.prod(len(list(c)) for c in choices.values())


@pytest.mark.parametrize("grade_id", ENUMERATED)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    check = CELLS[f"check_{grade_id}"]
    for _, right in NOTEBOOK.right_values(grade_id):
        exec(sweep.compiled(check), {"plausible": grading.plausible, grade_id: right})


def test_the_prompt_draws_the_numbers_the_hidden_test_draws() -> None:
    for grade_id in TESTS:
        hidden = NOTEBOOK.hidden(grade_id)
        assert sweep.choices(hidden) == sweep.choices(CELLS[f"numbers_{grade_id}"])


def test_the_sparse_query_is_what_latent_read_cost_counts() -> None:
    """Every draw of challenge 5 against kvlib.mla.latent_read_cost (DeepSeek-V3's layer
    shape; only the bytes matter), summed over the draw's layers."""
    shape = MLAShape(
        hidden_size=7168,
        num_heads=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=1536,
    )
    for draw, right in NOTEBOOK.right_values("sparse_query_mib"):
        cost = latent_read_cost(
            shape, draw.context_tokens, 656, IndexerShape(64, 128, draw.top_k), 132
        )
        assert math.isclose(draw.layers * cost.bytes_read / MiB, right, rel_tol=1e-12), draw
