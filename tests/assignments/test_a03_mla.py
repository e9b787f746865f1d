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
    sweep.assert_solved_with_distinct_mistakes(NOTEBOOK, grade_id)


@pytest.mark.parametrize("grade_id", ENUMERATED)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    sweep.assert_visible_check_accepts_right_answers(NOTEBOOK, grade_id)


def test_the_prompt_draws_the_numbers_the_hidden_test_draws() -> None:
    sweep.assert_prompts_draw_as_hidden_tests(NOTEBOOK)


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
