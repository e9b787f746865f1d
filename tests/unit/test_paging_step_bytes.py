"""kvlib.paging.step_bytes: a decode step's bytes through a block table, counted by hand."""

from __future__ import annotations

import pytest

from kvlib.config import load_config
from kvlib.paging import step_bytes
from kvlib.paging.step_bytes import paged_step_bytes
from kvlib.weights.params import param_count


def test_exports() -> None:
    assert sorted(step_bytes.__all__) == ["BLOCK_ID_BYTES", "PagedStepBytes", "paged_step_bytes"]


def test_llama_counted_from_its_config() -> None:
    """Llama-3.1-8B: 32 layers, 8 KV heads of 128, bf16; 17 tokens fill 2 blocks of 16."""
    llama = load_config("Llama-3.1-8B")
    got = paged_step_bytes(llama, 17, 3)
    per_token = 2 * 32 * 8 * 128 * 2
    assert got.cache_tokens == 3 * 17 * per_token
    assert got.cache_blocks == 3 * 2 * 16 * per_token
    assert got.block_table == 3 * 2 * 4
    assert got.gather_copy == 2 * got.cache_blocks
    # Every weight but the 128,256 x 4,096 input embedding table, two bytes each.
    assert got.weights == (param_count(llama) - 128_256 * 4_096) * 2
    assert got.fused_paged - got.contiguous == 3 * 15 * per_token + got.block_table
    assert got.gather_then_attend == got.fused_paged + 2 * got.cache_blocks


def test_whole_blocks_cost_nothing_extra_at_a_multiple_of_the_block() -> None:
    got = paged_step_bytes(load_config("Llama-3.1-8B"), 4_096, 2, block_size=16)
    assert got.cache_blocks == got.cache_tokens


def test_sliding_layers_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="not full attention"):
        paged_step_bytes(load_config("gpt-oss-20b"), 100, 1)
    with pytest.raises(ValueError, match="batch"):
        paged_step_bytes(load_config("Llama-3.1-8B"), 100, 0)
