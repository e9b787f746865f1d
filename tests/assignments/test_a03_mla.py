"""The chapter 3 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, every named mistake stays out of the tolerance and
is named when graded, and the sparse-query challenge's formula is what
``kvlib.mla.latent_read_cost`` counts.

Each hidden test of ``solutions/03_mla/mla.ipynb`` is swept (``sweep.py``): run with
``numbers`` returning each combination of its choices in turn and ``expect`` replaced by
a recorder, so the right value and the mistakes are the hidden test's own, not a copy.
"""

from __future__ import annotations

import math

import pytest

from assignments import a03_mla, sweep
from kvlib.mla import IndexerShape, MLAPath, MLAShape, latent_read_cost, mla_step_cost
from kvlib.specs import DS_MLA_FP8_BYTES_PER_TOKEN
from kvlib.units import GiB, MiB

NOTEBOOK = sweep.Notebook("03_mla/mla.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
# The challenges whose mistakes are all distinct, on every draw. The first four may name
# two slips that give one value (``expect`` then names both). All seven are also graded
# through nbgrader by tests/assignments/test_assignments.py.
ENUMERATED = ["sparse_query_mib", "crossover_tokens", "dp_seats_gained"]
# The first four draw from 384 to 8,640 combinations: each is tried on a seeded sample
# of 300 draws, the others on every draw.
SAMPLE = {"latent_bytes": 300, "reduction": 300, "seats_gained": 300, "absorbed_flops": 300}
UNITS = NOTEBOOK.units
PATHS: tuple[MLAPath, ...] = ("naive", "absorbed")


def test_seven_challenges_worth_fourteen_points() -> None:
    points = NOTEBOOK.points
    assert TESTS == [
        "latent_bytes",
        "reduction",
        "seats_gained",
        "absorbed_flops",
        "sparse_query_mib",
        "crossover_tokens",
        "dp_seats_gained",
    ]
    assert sum(points) == 14


@pytest.mark.parametrize("grade_id", ENUMERATED)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    sweep.assert_solved_with_distinct_mistakes(NOTEBOOK, grade_id)


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_graded_as_its_hints_say(grade_id: str) -> None:
    """For each student's numbers: the solution passes the visible and the hidden check,
    every named mistake is wrong, and grading it names a slip that gives that value; the
    classic mistake of tests/assignments/a03_mla.py is always wrong and always named."""
    results = sweep.graded_draws(NOTEBOOK, grade_id, sample=SAMPLE.get(grade_id), seed=3)
    sweep.assert_graded_as_named(NOTEBOOK, grade_id, results, a03_mla.WRONG[grade_id])


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
            shape, draw.context_tokens, DS_MLA_FP8_BYTES_PER_TOKEN,
            IndexerShape(64, 128, draw.top_k), 132
        )
        assert math.isclose(draw.layers * cost.bytes_read / MiB, right, rel_tol=1e-12), draw


def test_the_crossover_is_where_mla_step_cost_turns_on_every_draw() -> None:
    """On every draw of challenge 6, kvlib.mla.mla_step_cost (whose FLOPs are counted
    against torch's FlopCounterMode in tests/unit/test_nn_mla.py) finds the absorbed path
    no dearer one token below the hidden test's answer and the naive path cheaper at it;
    the chapter's closed form floor(T d_c (d_n + d_v) / (d_c (d_n + d_v) +
    T (2 d_c - d_n - d_v))) + 1 gives the same whole number."""
    for draw, right in NOTEBOOK.right_values("crossover_tokens"):
        shape = MLAShape(
            hidden_size=7168,
            num_heads=draw.heads,
            kv_lora_rank=draw.kv_lora_rank,
            qk_rope_head_dim=draw.rope_dim,
            qk_nope_head_dim=draw.nope_dim,
            v_head_dim=draw.v_dim,
            q_lora_rank=1536,
        )

        tokens = draw.context_tokens
        at, below = (
            {p: mla_step_cost(shape, tokens, p, query_tokens=new).flops for p in PATHS}
            for new in (right, right - 1)
        )
        assert at["naive"] < at["absorbed"], draw
        assert below["naive"] >= below["absorbed"], draw
        low_rank = draw.kv_lora_rank * (draw.nope_dim + draw.v_dim)
        wider = 2 * draw.kv_lora_rank - draw.nope_dim - draw.v_dim
        assert right == tokens * low_rank // (low_rank + tokens * wider) + 1, draw


def test_dp_pays_for_its_weight_copies_on_every_draw() -> None:
    """Challenge 7 charges DP attention its whole copy of the non-expert weights per GPU:
    on every draw, giving DP tensor parallelism's free memory (the reading that hides the
    copies) would hold more sequences than the right answer."""
    for draw, right in NOTEBOOK.right_values("dp_seats_gained"):
        sequence = draw.context_tokens * draw.layers * (draw.kv_lora_rank + draw.rope_dim) * 2
        free_tp = draw.budget_gib * GiB - (draw.dense_gib + draw.expert_gib) * GiB // draw.gpus
        tp_seats = free_tp // sequence
        assert draw.gpus * tp_seats - tp_seats > right, draw
