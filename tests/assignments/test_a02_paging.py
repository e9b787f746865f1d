"""The chapter 2 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, every named mistake stays out of the tolerance, and
the block-pool challenge's formula is what the real block pool does.

Each hidden test of ``solutions/02_paging/paging.ipynb`` is swept (``sweep.py``): run with
``numbers`` returning each combination of its choices in turn and ``expect`` replaced by
a recorder, so the right value and the mistakes are the hidden test's own, not a copy.
"""

from __future__ import annotations

import math

import pytest

from assignments import sweep
from course.checks import sliding_config
from kvlib.config import load_config
from kvlib.paging.prefix import prefix_sharing
from kvlib.paging.table import PagedKVCache
from kvlib.paging.vllm_pool import kv_pool

NOTEBOOK = sweep.Notebook("02_paging/paging.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
UNITS = NOTEBOOK.units


def test_seven_challenges_worth_fourteen_points() -> None:
    points = NOTEBOOK.points
    assert TESTS == [
        "blocks",
        "reserved_extra_mib",
        "prefix_saved_mib",
        "fork_blocks",
        "pool_tokens",
        "max_concurrency",
        "hybrid_concurrency",
    ]
    assert sum(points) == 14


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    sweep.assert_solved_with_distinct_mistakes(NOTEBOOK, grade_id)


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    sweep.assert_visible_check_accepts_right_answers(NOTEBOOK, grade_id)


def test_the_prompt_draws_the_numbers_the_hidden_test_draws() -> None:
    sweep.assert_prompts_draw_as_hidden_tests(NOTEBOOK)


def test_the_fork_formula_is_what_the_block_pool_does() -> None:
    """Every draw of the copy-on-write challenge, run on kvlib.paging.table's PagedKVCache."""
    for draw, right in NOTEBOOK.right_values("fork_blocks"):
        cache = PagedKVCache(200, draw.block_size)
        cache.add_sequence(0, list(range(draw.prompt_tokens)))
        for i in range(1, draw.samples):
            cache.fork(0, i)
        for step in range(draw.new_tokens):
            for i in range(draw.samples):
                cache.append_tokens(i, [10_000 * i + step])
        assert cache.pool.num_used_blocks == right, draw


def test_the_concurrency_challenges_are_what_kv_pool_logs() -> None:
    """Every draw of challenges 6 and 7, against kvlib.paging.vllm_pool.kv_pool on a config
    built from the draw (a Llama-format one, and an alternating sliding/full one)."""
    for grade_id in ("max_concurrency", "hybrid_concurrency"):
        for draw, right in NOTEBOOK.right_values(grade_id):
            if grade_id == "max_concurrency":
                layers, kv_heads, head_dim = draw.model
                cfg = load_config(
                    {
                        "model_type": "llama",
                        "num_hidden_layers": layers,
                        "num_attention_heads": 4 * kv_heads,
                        "num_key_value_heads": kv_heads,
                        "head_dim": head_dim,
                        "hidden_size": 4096,
                    }
                )
                pool = kv_pool(
                    cfg,
                    draw.kv_memory_bytes,
                    max_model_len=draw.max_model_len,
                    block_size=draw.block_size,
                )
            else:
                cfg = load_config(
                    sliding_config(
                        layers=draw.layers,
                        full_every=2,
                        kv_heads=8,
                        heads=32,
                        head_dim=64,
                        hidden_size=2048,
                        window=draw.window,
                    )
                )
                pool = kv_pool(
                    cfg,
                    draw.kv_memory_bytes,
                    max_model_len=draw.max_model_len,
                    max_num_batched_tokens=draw.max_num_batched_tokens,
                )
                assert len(pool.groups) == 2, draw
            assert math.isclose(pool.max_concurrency, right, rel_tol=1e-12), (draw, right)


def test_the_prefix_challenge_is_what_prefix_sharing_saves() -> None:
    """Every draw of challenge 3 against kvlib.paging.prefix.prefix_sharing, which the
    hidden test may not import (hidden tests import only the modules the grader loads)."""
    for draw, right in NOTEBOOK.right_values("prefix_saved_mib"):
        layers, kv_heads, head_dim = draw.model
        block = draw.block_size * 2 * layers * kv_heads * head_dim * 2
        saved = prefix_sharing(draw.requests, draw.system_tokens, 1, draw.block_size)
        assert math.isclose(saved.blocks_saved * block / 2**20, right, rel_tol=1e-12), draw
