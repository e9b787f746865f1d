"""kvlib.tiers.nodes: each tier of a node in tokens of a model's cache."""

from __future__ import annotations

import pytest

from kvlib.config import load_config
from kvlib.hardware import get_gpu, vllm_budget_bytes
from kvlib.tiers.nodes import get_node, tier_tokens


def test_llama_8b_on_a_dgx_h100() -> None:
    cfg = load_config("Llama-3.1-8B")
    node = get_node("DGX-H100")
    tiers = tier_tokens(cfg, node)
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    assert tiers.kv_bytes_per_token_per_gpu == per_token == 128 * 1024
    assert tiers.host_dram_tokens == 2 * 10**12 // 8 // per_token
    assert tiers.nvme_tokens == 8 * 3_840 * 10**9 // 8 // per_token
    # HBM: vLLM's budget less ~16 GB of bf16 weights, an upper bound.
    budget = vllm_budget_bytes(get_gpu("H100-SXM"), 0.92)
    assert (budget - 17e9) / per_token < tiers.hbm_tokens < (budget - 15e9) / per_token
    assert tiers.hbm_tokens < tiers.host_dram_tokens < tiers.nvme_tokens


def test_tensor_parallel_shares_every_tier() -> None:
    cfg = load_config("Llama-3.1-70B")
    one, four = (tier_tokens(cfg, get_node("DGX-H100"), tp=tp) for tp in (1, 4))
    assert four.kv_bytes_per_token_per_gpu * 4 == one.kv_bytes_per_token_per_gpu
    assert four.host_dram_tokens == pytest.approx(4 * one.host_dram_tokens, abs=4)


def test_bad_input_is_one_line() -> None:
    with pytest.raises(KeyError, match="DGX-H100"):
        get_node("DGX-Z")
    with pytest.raises(ValueError, match="tp"):
        tier_tokens(load_config("Llama-3.1-8B"), get_node("DGX-H100"), tp=16)
