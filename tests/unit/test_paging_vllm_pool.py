"""vLLM's KV-pool arithmetic, checked against an independent transcription of vLLM's code
and against the figures vLLM's documentation publishes.

The ``vllm_*`` helpers below transcribe vLLM (commit 001cabc1be16) from the raw
config fields, without kvlib's specs:
- ``AttentionSpec.real_page_size_bytes`` (vllm/v1/kv_cache_interface.py):
  ``2 * block_size * num_kv_heads * head_size * get_dtype_size(dtype)``;
- ``MLAAttentionSpec.real_page_size_bytes``: ``block_size * num_kv_heads * head_size *
  dtype size`` with one head of ``kv_lora_rank + qk_rope_head_dim``;
- ``get_num_blocks`` (vllm/v1/core/kv_cache_utils.py):
  ``int(available_memory // page_size // num_layers)``;
- ``_report_kv_cache_config``: ``num_blocks // len(groups) * min_block_size`` tokens
  at that commit, ``int(max_concurrency * max_model_len)`` since PRs #38364/#40694;
- ``get_max_concurrency_for_kv_cache_config``: ``num_blocks / cdiv(num_layer_per_group *
  sum(max_memory_usage_bytes), page_size * num_layer_per_group)``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

import kvlib.paging.vllm_pool as kvpool
from kvlib.config import load_config
from kvlib.paging.vllm_pool import (
    KVCacheGroup,
    blocks_per_request,
    kv_cache_groups,
    kv_memory_range,
    kv_pool,
    unified_page_bytes,
)
from kvlib.specs import ChunkedLocal, FullAttention, LinearState, SharedKV, SlidingWindow
from kvlib.units import GiB

# Qwen/Qwen3-4B config.json, the fields that size its cache (the model of vLLM's
# fp8 KV cache documentation).
QWEN3_4B: dict[str, Any] = {
    "_name_or_path": "Qwen3-4B",
    "model_type": "qwen3",
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": True,
    "sliding_window": None,
    "use_sliding_window": False,
}
DTYPE_SIZE = {"bf16": 2, "fp8": 1}


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def vllm_attention_page(block_size: int, num_kv_heads: int, head_size: int, dtype: str) -> int:
    return 2 * block_size * num_kv_heads * head_size * DTYPE_SIZE[dtype]


def vllm_num_blocks(available_memory: int, page_size: int, num_layers: int) -> int:
    return int(available_memory // page_size // num_layers)


def vllm_uniform_report(
    available: int, page: int, layers: int, block_size: int, max_model_len: int
) -> tuple[int, float]:
    """(tokens, concurrency) vLLM logs for one group of identical full-attention layers."""
    num_blocks = vllm_num_blocks(available, page, layers)
    max_memory = cdiv(max_model_len, block_size) * page  # FullAttentionSpec
    per_request = cdiv(layers * max_memory, page * layers)
    return num_blocks // 1 * block_size, num_blocks / per_request


def test_exports() -> None:
    assert sorted(kvpool.__all__) == sorted(
        ["DEFAULT_BLOCK_SIZE", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_VLLM_VERSION",
         "KVCacheGroup", "KVPool", "LayerPage", "blocks_per_request", "kv_cache_groups",
         "kv_memory_on_gpu", "kv_memory_range", "kv_pool", "layer_page_bytes", "layer_pages",
         "logged_pool_tokens", "parse_vllm_version", "unified_page_bytes",
         "uses_derived_pool_line"]
    )
    assert kvpool.DEFAULT_BLOCK_SIZE == 16


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-8B", "Falcon-7B",
                                   "GPT-2", "Mixtral-8x7B"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_full_attention_models_match_vllms_formulas(
    model: str, dtype: str, block_size: int
) -> None:
    cfg = load_config(model)
    raw = cfg.raw
    layers = raw.get("num_hidden_layers") or raw["n_layer"]
    heads = raw.get("num_attention_heads") or raw["n_head"]
    hidden = raw.get("hidden_size") or raw["n_embd"]
    kv_heads = 1 if raw.get("multi_query") else raw.get("num_key_value_heads", heads)
    head_size = raw.get("head_dim") or hidden // heads
    page = vllm_attention_page(block_size, kv_heads, head_size, dtype)
    assert unified_page_bytes(cfg, block_size, dtype) == page * layers
    for memory in (0, page * layers - 1, page * layers, 17 * GiB + 12_345, 61 * GiB):
        pool = kv_pool(cfg, memory, max_model_len=8192, block_size=block_size, kv_dtype=dtype)
        tokens, concurrency = vllm_uniform_report(memory, page, layers, block_size, 8192)
        assert pool.num_blocks == vllm_num_blocks(memory, page, layers)
        assert (pool.pool_tokens, pool.max_concurrency) == (tokens, concurrency)
        assert blocks_per_request(cfg, 8192, block_size, dtype) == cdiv(8192, block_size)


def test_mla_pages_the_latent_without_the_factor_two() -> None:
    cfg = load_config("DeepSeek-V3")
    latent = cfg.raw["kv_lora_rank"] + cfg.raw["qk_rope_head_dim"]  # 576
    mla_page = 16 * 1 * latent * 2  # MLAAttentionSpec: one head, bf16
    assert unified_page_bytes(cfg, 16, "bf16") == mla_page * cfg.raw["num_hidden_layers"]
    pool = kv_pool(cfg, 40 * GiB, max_model_len=32_768)
    assert pool.num_blocks == vllm_num_blocks(40 * GiB, mla_page, 61)


def test_tensor_parallelism_splits_the_kv_heads() -> None:
    cfg = load_config("Llama-3.1-70B")  # 8 KV heads
    for tp, heads in ((1, 8), (2, 4), (8, 1), (16, 1)):  # one replicated head past tp = 8
        page = vllm_attention_page(16, heads, 128, "bf16")
        assert unified_page_bytes(cfg, 16, "bf16", tp) == 80 * page


def test_qwen3_4b_on_an_l4_as_vllms_fp8_kv_cache_doc_reports() -> None:
    """vLLM docs, features/quantization/quantized_kvcache.md (measured on vLLM 0.25.1,
    --max-model-len 32768, "11.47 GiB KV reservation in both cases"): 83,488 tokens and
    2.55x at bf16, 166,992 tokens and 5.10x at fp8."""
    cfg = load_config(QWEN3_4B)
    bf16 = kv_memory_range(cfg, 83_488, 16, "bf16")
    fp8 = kv_memory_range(cfg, 166_992, 16, "fp8")
    low, high = max(bf16[0], fp8[0]), min(bf16[1], fp8[1])
    assert low < high, "one KV reservation explains both figures"
    for memory in (low, high - 1):
        assert f"{memory / GiB:.2f}" == "11.47"  # vLLM's format_gib
        lines = {
            dtype: kv_pool(cfg, memory, max_model_len=32_768, kv_dtype=dtype).startup_lines
            for dtype in ("bf16", "fp8")
        }
        assert lines["bf16"] == (
            "GPU KV cache size: 83,488 tokens",
            "Maximum concurrency for 32,768 tokens per request: 2.55x",
        )
        assert lines["fp8"] == (
            "GPU KV cache size: 166,992 tokens",
            "Maximum concurrency for 32,768 tokens per request: 5.10x",
        )
    # Not exactly twice: fp8 blocks are half the size, so one more fits in the remainder.
    assert 166_992 != 2 * 83_488


def test_kv_memory_range_inverts_the_logged_size() -> None:
    cfg = load_config("Llama-3.1-8B")
    low, high = kv_memory_range(cfg, 16_000)

    def logged(memory: int) -> int:  # the whole-block line, as 0.19 logs it
        return kv_pool(cfg, memory, max_model_len=1, vllm_version="0.19.0").pool_tokens

    assert logged(low) == logged(high - 1) == 16_000
    assert logged(low - 1) < 16_000 < logged(high)
    with pytest.raises(ValueError, match="whole number of 16-token blocks"):
        kv_memory_range(cfg, 16_001)


def test_a_hybrid_model_pages_sliding_and_full_layers_in_separate_groups() -> None:
    """Gemma-2-9B: 21 sliding (W = 4096) and 21 full layers, 8 KV heads of 256."""
    cfg = load_config("Gemma-2-9B")
    groups = kv_cache_groups(cfg)
    assert sorted((g.kind, g.num_layers) for g in groups) == [("full", 21), ("sliding", 21)]
    page = vllm_attention_page(16, 8, 256, "bf16")
    memory, max_model_len, batched = 20 * GiB, 8192, 2048
    pool = kv_pool(cfg, memory, max_model_len=max_model_len, max_num_batched_tokens=batched)
    num_blocks = vllm_num_blocks(memory, page, 21)  # group_size = 21
    full_blocks = cdiv(max_model_len, 16)
    sliding_blocks = cdiv(min(4096 - 1 + batched, max_model_len), 16) + 1
    assert pool.num_blocks == num_blocks
    assert pool.blocks_per_request == full_blocks + sliding_blocks
    assert pool.max_concurrency == num_blocks / (full_blocks + sliding_blocks)
    # The line: whole blocks shared among the groups until 0.19, derived since.
    old = kv_pool(cfg, memory, max_model_len=max_model_len, max_num_batched_tokens=batched,
                  vllm_version="0.19.0")
    assert old.pool_tokens == num_blocks // 2 * 16
    assert pool.pool_tokens == int(num_blocks / (full_blocks + sliding_blocks) * max_model_len)
    assert pool.pool_tokens != old.pool_tokens
    assert pool.min_kv_memory_bytes == (full_blocks + sliding_blocks) * 21 * page
    assert blocks_per_request(cfg, 100, max_num_batched_tokens=batched) == 7 + 8


def test_vllm_refuses_no_memory_and_less_than_one_request() -> None:
    """check_enough_kv_cache_memory: memory left, and one max_model_len request in it."""
    cfg = load_config("Llama-3.1-8B")
    need = cdiv(8192, 16) * vllm_attention_page(16, 8, 128, "bf16") * 32
    assert kv_pool(cfg, need, max_model_len=8192).refusal is None
    short = kv_pool(cfg, need - 1, max_model_len=8192).refusal
    assert short is not None and "To serve at least one request" in short
    assert kv_pool(cfg, 0, max_model_len=8192).refusal.startswith(  # type: ignore[union-attr]
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
    )


def test_the_gpt_oss_line_changed_with_vllms_release() -> None:
    """gpt-oss-20b (12 sliding + 12 full layers), 40 GiB, max_model_len 131,072: two
    groups of whole blocks logged 873,808 tokens until 0.19; int(concurrency x len) since."""
    cfg = load_config("gpt-oss-20b")
    pools = {v: kv_pool(cfg, 40 * GiB, max_model_len=131_072, vllm_version=v)
             for v in ("0.19.0", "0.20.0", kvpool.DEFAULT_VLLM_VERSION)}
    old, first, now = pools.values()
    assert old.num_blocks == now.num_blocks and old.max_concurrency == now.max_concurrency
    assert old.pool_tokens == old.num_blocks // 2 * 16 == 873_808
    assert first.pool_tokens == now.pool_tokens == int(now.max_concurrency * 131_072)
    assert now.pool_tokens == 1_643_116
    # For one full-attention group at a whole number of blocks the two lines agree.
    llama = load_config("Llama-3.1-8B")
    same = {kv_pool(llama, 20 * GiB, max_model_len=8192, vllm_version=v).pool_tokens
            for v in ("0.19.0", kvpool.DEFAULT_VLLM_VERSION)}
    assert len(same) == 1


def test_the_refusal_is_vllms_message_with_its_estimate() -> None:
    """V1's _check_enough_kv_cache_memory at 001cabc1: the needed and available GiB as
    format_gib rounds them, and estimate_max_model_len's binary search (here the last
    whole block that fits); v0 (before 0.8) named the tokens its blocks store."""
    cfg = load_config("Llama-3.1-8B")
    page = vllm_attention_page(16, 8, 128, "bf16") * 32  # 2 MiB a block, every layer
    pool = kv_pool(cfg, 3 * GiB, max_model_len=32_768)
    fits = 3 * GiB // page * 16
    assert pool.estimated_max_model_len == fits == 24_576
    assert pool.budget_bytes(fits) <= 3 * GiB < pool.budget_bytes(fits + 1)
    assert pool.refusal == (
        "To serve at least one request with the models's max seq len (32768), (4.0 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (3.0 GiB). "
        "Based on the available memory, the estimated maximum model length is 24576. Try "
        "increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
    old = kv_pool(cfg, 3 * GiB, max_model_len=32_768, vllm_version="0.6.4")
    assert old.refusal == (
        "The model's max seq len (32768) is larger than the maximum number of tokens that "
        "can be stored in KV cache (24576). Try increasing `gpu_memory_utilization` or "
        "decreasing `max_model_len` when initializing the engine."
    )
    assert kv_pool(cfg, page - 1, max_model_len=32_768).estimated_max_model_len == 0


@pytest.mark.parametrize("version", ["0.19", "v0.20.1", "0.11.0+cu129", "0.20.1rc1"])
def test_version_strings_vllm_publishes_parse(version: str) -> None:
    assert kvpool.parse_vllm_version(version)[:2] in ((0, 19), (0, 20), (0, 11))


@pytest.mark.parametrize("version", ["latest", "19", "", "0.x"])
def test_a_bad_version_names_the_form(version: str) -> None:
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        kv_pool(load_config("Llama-3.1-8B"), GiB, max_model_len=16, vllm_version=version)


def test_the_sliding_budget_straddles_a_block_boundary() -> None:
    group = KVCacheGroup("sliding", 4, 4, 1, 1)
    # Window 4 with 1 token per step: 4 tokens may spread over [XXCD][EF], 2 blocks.
    assert group.blocks_per_request(max_model_len=100, max_num_batched_tokens=1) == 2
    assert KVCacheGroup("chunked", 8, 4, 1, 1).blocks_per_request(100, 8) == 4
    assert KVCacheGroup("full", None, 4, 1, 1).blocks_per_request(10, 10**6) == 3


def _fake(*layers: object) -> Any:
    return SimpleNamespace(name="fake", layers=layers)


def test_vllm_pads_the_smaller_type_when_counts_are_close() -> None:
    """kv_cache_utils: "12 sw + 13 full ... pad to (13 sw, 13 full)"."""
    cfg = _fake(*[SlidingWindow(8, 64, window=128)] * 12, *[FullAttention(8, 64)] * 13)
    groups = kv_cache_groups(cfg)
    assert sorted((g.kind, g.num_layers) for g in groups) == [("full", 13), ("sliding", 12)]
    pool = kv_pool(cfg, 10 * GiB, max_model_len=4096)
    assert pool.block_bytes == 13 * vllm_attention_page(16, 8, 64, "bf16")


def test_a_five_to_one_pattern_makes_six_groups() -> None:
    """Gemma-3-like: 5 sliding layers for every full one; group size = the full count."""
    cfg = _fake(*([SlidingWindow(4, 128, window=1024)] * 5 + [FullAttention(4, 128)]) * 6)
    groups = kv_cache_groups(cfg)
    assert len(groups) == 6 and all(g.num_layers == 6 for g in groups)
    pool = kv_pool(cfg, 3 * GiB, max_model_len=8192, max_num_batched_tokens=1024)
    page = vllm_attention_page(16, 4, 128, "bf16")
    assert pool.num_blocks == vllm_num_blocks(3 * GiB, page, 6)
    old = kv_pool(cfg, 3 * GiB, max_model_len=8192, max_num_batched_tokens=1024,
                  vllm_version="0.19.0")
    assert old.pool_tokens == pool.num_blocks // 6 * 16
    assert pool.blocks_per_request == 512 + 5 * (cdiv(1023 + 1024, 16) + 1)


def test_smaller_pages_get_a_larger_block_size() -> None:
    """unify_kv_cache_spec_page_size: a layer with half the page gets twice the block."""
    cfg = _fake(*[FullAttention(8, 128)] * 4, *[SlidingWindow(4, 128, window=512)] * 4)
    groups = {g.kind: g for g in kv_cache_groups(cfg)}
    assert (groups["full"].block_size, groups["sliding"].block_size) == (16, 32)
    pool = kv_pool(cfg, GiB, max_model_len=1024, vllm_version="0.19.0")
    assert pool.pool_tokens == pool.num_blocks // 2 * 16  # the smallest block size
    odd = _fake(FullAttention(3, 128), SlidingWindow(2, 128, window=512))
    with pytest.raises(ValueError, match="do not divide"):
        kv_cache_groups(odd)


def test_one_type_with_different_pages_is_one_group_summing_its_pages() -> None:
    """UniformTypeKVCacheSpecs: all full attention, different KV heads per layer."""
    cfg = _fake(FullAttention(8, 128), FullAttention(2, 128), FullAttention(8, 64))
    (group,) = kv_cache_groups(cfg)
    total = sum(vllm_attention_page(16, h, d, "bf16") for h, d in ((8, 128), (2, 128), (8, 64)))
    assert group.page_bytes == total
    pool = kv_pool(cfg, GiB, max_model_len=1000)
    assert pool.num_blocks == GiB // total and pool.blocks_per_request == cdiv(1000, 16)


def test_shared_layers_have_no_pages_and_linear_ones_are_refused() -> None:
    assert unified_page_bytes(_fake(FullAttention(8, 128), SharedKV())) == vllm_attention_page(
        16, 8, 128, "bf16"
    )
    with pytest.raises(ValueError, match="linear attention"):
        unified_page_bytes(_fake(FullAttention(8, 128), LinearState(10, 10)))
    with pytest.raises(ValueError, match="no layer with a KV cache"):
        unified_page_bytes(_fake(SharedKV()))
    chunked = _fake(*[ChunkedLocal(8, 128, chunk=8192)] * 3, FullAttention(8, 128))
    assert {g.kind for g in kv_cache_groups(chunked)} == {"chunked", "full"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"kv_memory_bytes": -1}, "non-negative"), ({"kv_memory_bytes": 1.5}, "kv_memory_bytes"),
     ({"max_model_len": 0}, "max_model_len"), ({"block_size": 0}, "block_size"),
     ({"tp": 0}, "tp")],
)
def test_bad_input_names_the_argument(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"kv_memory_bytes": GiB, "max_model_len": 4096, **kwargs}
    memory = args.pop("kv_memory_bytes")
    with pytest.raises(ValueError, match=match):
        kv_pool(load_config("Llama-3.1-8B"), memory, **args)


def test_kv_memory_on_gpu_multiplies_cudas_total() -> None:
    """vLLM's request_memory: ceil(u x CUDA's total); then weights and runtime come off."""
    from kvlib.hardware import get_gpu
    from kvlib.paging.vllm_pool import kv_memory_on_gpu

    h200 = get_gpu("H200")
    cuda_total = 13_981 * 2**30 // 100  # 139.81 GiB
    free = kv_memory_on_gpu(h200, 16 * 10**9, runtime_bytes=2 * 2**30)
    assert free == math.ceil(cuda_total * 0.92) - 16 * 10**9 - 2 * 2**30
    assert free < int(0.92 * h200.memory_bytes) - 16 * 10**9 - 2 * 2**30  # the driver's total
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_memory_on_gpu(h200, 200 * 2**30)
