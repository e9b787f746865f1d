"""kvlib.capacity.assessment: a deployment's pool, seats and decode speed, each against an
independent computation: vLLM's page and block arithmetic transcribed from the raw config fields,
kvlib.sizing's bytes, the block pool itself (kvlib.paging.table), kvlib.bounds's step bytes and
prefill FLOPs, and kvlib.mla's absorbed-path FLOPs."""

from __future__ import annotations

import dataclasses
import math
import re
from itertools import count

import pytest
from capacity_support import H100, LLAMA8, rag
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.bounds import (
    decode_bytes_per_gpu,
    kv_bytes_per_gpu,
    matmul_params,
    prefill_flops,
    weight_bytes_per_gpu,
)
from kvlib.capacity.assessment import (
    assess,
    cascade_attention_applies,
    compute_share,
    decode_flops_per_token,
    held_blocks,
    prefill_compute_share,
    seats_with_shared_prefix,
)
from kvlib.capacity.scenario import Scenario, ScenarioError
from kvlib.config import load_config
from kvlib.mla import MLAShape, mla_step_cost
from kvlib.paging.block_pool import OutOfBlocksError
from kvlib.paging.table import PagedKVCache
from kvlib.paging.vllm_pool import blocks_per_request, kv_cache_groups, kv_pool
from kvlib.sizing import seats_for_context
from kvlib.units import GiB

LLAMA70 = load_config("Llama-3.1-70B")
BYTES = {"bf16": 2, "fp8": 1}


def kv_memory(s: Scenario) -> int:
    """``ceil(u x M_CUDA) - W_GPU - runtime``, from the GPU row and the weights on a GPU."""
    weights = weight_bytes_per_gpu(s.model, s.tp, s.weight_dtype)
    budget = math.ceil(s.gpu.vllm_total_bytes * s.gpu_memory_utilization)  # vLLM: CUDA's total
    return budget - weights - s.runtime_bytes_per_gpu


def vllm_page(raw_layers: int, kv_heads: int, head_dim: int, dtype: str, tp: int = 1) -> int:
    """vLLM's ``AttentionSpec.real_page_size_bytes`` over all layers, one GPU's heads."""
    return raw_layers * 2 * 16 * max(1, kv_heads // tp) * head_dim * BYTES[dtype]


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("max_model_len", [8_192, 131_072])
def test_seats_are_vllms_blocks_and_sizings_bytes(kv_dtype: str, max_model_len: int) -> None:
    s = rag(kv_dtype=kv_dtype, max_model_len=max_model_len)
    cap = assess(s)
    memory = kv_memory(s)
    assert cap.pool.kv_memory_bytes == memory
    blocks = memory // vllm_page(32, 8, 128, kv_dtype)
    assert cap.pool.num_blocks == blocks
    # Guaranteed seats: vLLM's "Maximum concurrency" rounded down, and sizing's worst case
    # (the context is a whole number of blocks, so both roundings agree).
    assert cap.guaranteed_seats == blocks // (max_model_len // 16)
    assert cap.guaranteed_seats == int(kv_pool(LLAMA8, memory, max_model_len=max_model_len,
                                               kv_dtype=kv_dtype).max_concurrency)
    assert cap.guaranteed_seats == seats_for_context(LLAMA8, memory, max_model_len, kv_dtype)
    # Traffic seats: 6,500 tokens hold cdiv(6500, 16) = 407 blocks each.
    assert cap.block_seats == blocks // 407
    assert cap.held_blocks_per_sequence == 407


def test_fp8_at_least_doubles_the_seats() -> None:
    bf16, fp8 = assess(rag()), assess(rag(kv_dtype="fp8"))
    assert fp8.pool.num_blocks in (2 * bf16.pool.num_blocks, 2 * bf16.pool.num_blocks + 1)
    assert fp8.block_seats >= 2 * bf16.block_seats
    assert fp8.weight_bytes_per_gpu == bf16.weight_bytes_per_gpu  # only the cache shrinks


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_seats_follow_each_gpus_share(tp: int) -> None:
    s = Scenario(
        model=LLAMA70,
        gpu=H100,
        prompt_tokens=3_000,
        output_tokens=200,
        concurrency=64,
        needed_context_tokens=8_192,
        tp=tp,
        max_model_len=8_192,
    )
    cap = assess(s)
    memory = kv_memory(s)
    assert cap.weight_bytes_per_gpu == weight_bytes_per_gpu(LLAMA70, tp, None)
    # 3,200 tokens are 200 whole blocks: seats are bytes per GPU over one sequence's share.
    assert cap.block_seats == memory // kv_bytes_per_gpu(LLAMA70, 3_200, "bf16", tp)
    assert cap.pool.block_bytes == vllm_page(80, 8, 128, "bf16", tp)


def test_prefix_sharing_seats_are_what_the_block_pool_holds() -> None:
    """Fill a real block pool with the traffic's sequences, the shared prompt's tokens
    identical in each, until it runs out: as many fit as the formula says."""
    gpu = dataclasses.replace(H100, driver_memory_mib=24 * 1024)  # a small pool, quick to fill
    s = rag(gpu=gpu, prefix_caching=True, concurrency=8)
    cap = assess(s)
    assert cap.shared_blocks == 2_000 // 16
    cache = PagedKVCache(cap.pool.num_blocks, 16)
    fitted = 0
    for i in count():
        if not _serve(cache, i, 2_000, s.prompt_tokens, s.output_tokens):
            break
        fitted += 1
    assert fitted == cap.block_seats
    assert assess(dataclasses.replace(s, prefix_caching=False)).block_seats < fitted


def _serve(cache: PagedKVCache, i: int, shared: int, prompt: int, output: int) -> bool:
    """Prefill request ``i`` (its first ``shared`` tokens common to all) and decode its
    output one token at a time, as an engine does; False when the pool runs out."""
    own = [10**6 + i * 10**5 + t for t in range(prompt + output - shared)]
    tokens = list(range(shared)) + own
    try:
        cache.add_sequence(i, tokens[:prompt])
        for token in tokens[prompt:]:
            cache.append_tokens(i, [token])
    except OutOfBlocksError:
        return False
    return True


@settings(max_examples=60, deadline=None)
@given(
    pool=st.integers(1, 400),
    prompt=st.integers(1, 200),
    output=st.integers(1, 60),
    shared_fraction=st.floats(0, 1),
    block=st.sampled_from([4, 8, 16]),
)
def test_shared_prefix_formula_against_the_block_pool(
    pool: int, prompt: int, output: int, shared_fraction: float, block: int
) -> None:
    shared_tokens = int(prompt * shared_fraction)
    total = prompt + output
    shared = min(shared_tokens // block, (prompt - 1) // block)
    per = -(-total // block)
    cache = PagedKVCache(pool, block)
    fitted = 0
    while fitted <= pool and _serve(cache, fitted, shared_tokens, prompt, output):
        fitted += 1
    assert fitted == seats_with_shared_prefix(pool, per, shared)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "Gemma-2-9B", "Mistral-7B-v0.1"])
@pytest.mark.parametrize("tokens", [1, 100, 4_095, 4_096, 7_000])
def test_sliding_layers_hold_their_window_in_whole_blocks(name: str, tokens: int) -> None:
    cfg = load_config(name)
    groups = tuple(kv_cache_groups(cfg))
    # Independent: the tokens each layer keeps (transformers' cache: min(T, W - 1) in a
    # window), in whole blocks; a window may straddle one block more.
    kept = {getattr(spec, "window", None): spec.tokens_held(tokens) for spec in cfg.layers}
    least = most = 0
    for group in groups:
        window = group.span_tokens if group.kind == "sliding" else None
        blocks = -(-kept[window] // group.block_size)
        least += blocks
        most += blocks + (window is not None)
    assert least <= held_blocks(groups, tokens) <= most
    assert held_blocks(groups, tokens) <= blocks_per_request(cfg, tokens)  # vLLM's budget


def test_the_step_is_the_mean_mixed_step_by_hand() -> None:
    """B decodes at the mean context and the prompts of the B / O requests that replace
    those finishing, each operation on its own roofline, the times added; the pieces from
    kvlib.bounds, put together here."""
    cap = assess(rag())
    s = cap.scenario
    b, rate = cap.batch, cap.batch / s.output_tokens
    assert cap.limited_by == "KV cache" and b == cap.block_seats < s.concurrency
    f_eff, bw = s.mfu * H100.bf16_dense_flops_per_s, H100.hbm_bandwidth_bytes_per_s
    body, head = matmul_params(LLAMA8)
    prefill = rate * s.prompt_tokens
    weights = decode_bytes_per_gpu(LLAMA8, b + round(prefill), 0, "bf16", None)
    gemms = max(weights / bw, 2 * (body * (b + prefill) + head * (b + rate)) / f_eff)
    decode = b * kv_bytes_per_gpu(LLAMA8, 6_250) / bw
    pre = prefill_flops(LLAMA8, s.prompt_tokens)
    attention = max(rate * kv_bytes_per_gpu(LLAMA8, s.prompt_tokens) / bw,
                    rate * pre.attention / f_eff)
    assert cap.step.prefill_tokens == round(prefill)
    assert cap.step_s == pytest.approx(gemms + decode + attention, rel=1e-9)
    assert cap.tokens_per_s == pytest.approx(b / cap.step_s)
    assert cap.step.reachable()


def test_a_large_batch_of_short_sequences_is_compute_bound() -> None:
    s = Scenario(model=LLAMA8, gpu=H100, prompt_tokens=16, output_tokens=16,
                 concurrency=5_000, needed_context_tokens=32, max_num_seqs=5_000)
    cap = assess(s)
    assert cap.bound_by == "compute" and cap.step.weights_bound == "compute"
    assert compute_share(cap) > 0.95
    # Each step prefills as many prompt tokens as it decodes: 2 B tokens under the budget.
    assert cap.limited_by == "token budget" and cap.batch == 8_192 // 2


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Qwen3-8B", "Gemma-2-9B", "gpt-oss-20b"])
@pytest.mark.parametrize("context", [1, 500, 5_000])
def test_decode_flops_are_one_more_prefill_token(name: str, context: int) -> None:
    cfg = load_config(name)
    more, less = prefill_flops(cfg, context + 1), prefill_flops(cfg, context)
    # Prefill counts the LM head once either way: one decode token adds the body and attention.
    expected = more.weights - less.weights + more.attention - less.attention + more.lm_head
    assert decode_flops_per_token(cfg, context) == expected


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_prefill_share_is_the_prompt_tokens_not_cached_token_by_token(
    prefix_caching: bool,
) -> None:
    """Prefilling token t costs what decoding at context t costs, less its LM head
    (prefill computes logits once): summed over the tokens past the cached prefix, at
    the rate the decode steps finish requests, over the GPU's dense peak."""
    cap = assess(rag(prefix_caching=prefix_caching, max_model_len=8_192))
    s = cap.scenario
    first = s.shared_prefix_tokens if prefix_caching else 0
    assert bool(cap.shared_blocks) == prefix_caching
    _, head = matmul_params(LLAMA8)
    flops = sum(decode_flops_per_token(LLAMA8, t) or 0 for t in range(first, s.prompt_tokens))
    flops -= 2 * head * (s.prompt_tokens - first - 1)
    expected = cap.tokens_per_s / s.output_tokens * flops / H100.bf16_dense_flops_per_s
    assert prefill_compute_share(cap) == pytest.approx(expected, rel=1e-12)
    # 6,000-token prompts for 500-token replies: most of the step's arithmetic is prefill
    assert 0.5 * cap.compute_utilization < prefill_compute_share(cap) < cap.compute_utilization


def test_prefill_share_is_spread_over_every_gpu() -> None:
    one, two = assess(rag()), assess(rag(replicas=2, concurrency=256))
    assert two.tokens_per_s == pytest.approx(2 * one.tokens_per_s)
    assert prefill_compute_share(two) == pytest.approx(prefill_compute_share(one))


def test_mla_decode_attention_is_the_absorbed_path() -> None:
    cfg = load_config("DeepSeek-V2")
    context = 1_000
    attention = decode_flops_per_token(cfg, context)
    assert attention is not None
    body = decode_flops_per_token(cfg, 0)
    assert body is not None
    # One query against T + 1 latents on the absorbed path, in every layer.
    layer = mla_step_cost(MLAShape.from_config(cfg), context + 1, "absorbed").attention_flops
    first = mla_step_cost(MLAShape.from_config(cfg), 1, "absorbed").attention_flops
    assert attention - body == cfg.num_hidden_layers * (layer - first)


def test_a_pool_smaller_than_one_full_context_does_not_start() -> None:
    # 70B at tp=2 keeps about 4 GiB a GPU for the cache: one 131,072-token request needs 20.
    s = Scenario(model=LLAMA70, gpu=H100, prompt_tokens=2_000, output_tokens=200,
                 concurrency=16, needed_context_tokens=4_096, tp=2)
    cap = assess(s)
    assert not cap.starts and cap.guaranteed_seats == 0 and cap.block_seats > 0
    assert assess(dataclasses.replace(s, max_model_len=4_096)).starts


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"needed_context_tokens": 200_000}, "needed_context_tokens (200,000) exceeds"),
        ({"max_model_len": 262_144}, "max_model_len (262,144) exceeds"),
        ({"max_model_len": 4_096}, "exceeds max_model_len (4,096)"),
        ({"output_tokens": 3_000}, "prompt_tokens + output_tokens (9,000) exceeds"),
        ({"shared_prefix_tokens": 7_000}, "shared_prefix_tokens (7,000) exceeds"),
        ({"model": LLAMA70}, "do not fit"),
        ({"tp": 3}, "tp=3 does not split"),
        ({"concurrency": 0}, "concurrency must be"),
        ({"kv_dtype": "fp7"}, "fp7"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        (
            {"model": LLAMA70, "tp": 2, "prompt_tokens": 60_000, "needed_context_tokens": 65_536},
            "not one sequence",
        ),
    ],
)
def test_bad_scenarios_say_which_field_and_what_to_do(
    changes: dict[str, object], words: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        assess(rag(**changes))


def test_a_config_without_a_position_limit_needs_max_model_len() -> None:
    unknown = dataclasses.replace(load_config("Falcon-7B"), max_position_embeddings=None)
    s = Scenario(model=unknown, gpu=H100, prompt_tokens=1_000, output_tokens=100,
                 concurrency=8, needed_context_tokens=2_048)
    with pytest.raises(ScenarioError, match="set max_model_len"):
        assess(s)
    assert assess(dataclasses.replace(s, max_model_len=2_048)).guaranteed_seats > 0


def test_replicas_multiply_seats_and_split_the_traffic() -> None:
    one, two = assess(rag()), assess(rag(replicas=2))
    assert two.total_block_seats == 2 * one.block_seats and two.scenario.gpus == 2
    assert two.batch == 64 and two.tokens_per_s == pytest.approx(2 * 64 / two.step_s)
    assert two.full_use_tokens_per_s == pytest.approx(2 * one.full_use_tokens_per_s)
    assert two.pool == one.pool  # each replica's pool is the same


def test_runtime_reserve_is_taken_from_the_pool() -> None:
    less = assess(rag(runtime_bytes_per_gpu=6 * GiB))
    assert assess(rag()).pool.kv_memory_bytes - less.pool.kv_memory_bytes == 4 * GiB


@pytest.mark.parametrize("mfu", [0.3, 0.6, 1.0])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_tokens_per_s_is_the_batch_over_a_reachable_step(
    mfu: float, prefix_caching: bool
) -> None:
    """replicas x B / t_step, at a FLOP/s no more than mfu x peak and a bytes/s no more
    than the bandwidth; the request-level FLOPs (prefill summed token by token: prefilling
    token t costs decoding at context t, less its LM head) fit in that arithmetic."""
    cap = assess(rag(mfu=mfu, prefix_caching=prefix_caching))
    s = cap.scenario
    assert cap.tokens_per_s == pytest.approx(cap.batch / cap.step_s)
    assert cap.step.flops_per_s <= mfu * H100.bf16_dense_flops_per_s * (1 + 1e-9)
    assert cap.step.hbm_bytes_per_s <= H100.hbm_bandwidth_bytes_per_s * (1 + 1e-9)
    first = cap.shared_blocks * 16
    _, head = matmul_params(LLAMA8)
    prefill = sum(decode_flops_per_token(LLAMA8, t) or 0 for t in range(first, s.prompt_tokens))
    prefill -= 2 * head * (s.prompt_tokens - first - 1)
    decode = s.output_tokens * (decode_flops_per_token(LLAMA8, s.decode_context_tokens) or 0)
    requests_per_s = cap.tokens_per_s / s.output_tokens
    assert requests_per_s * (prefill + decode) <= mfu * H100.bf16_dense_flops_per_s * 1.001
    assert cap.tokens_per_s_per_sequence == pytest.approx(cap.tokens_per_s / cap.batch)
    assert compute_share(cap) <= 1 + 1e-12
    slower = assess(rag(mfu=mfu / 2, prefix_caching=prefix_caching))
    assert slower.tokens_per_s < cap.tokens_per_s


def test_full_use_fills_the_seats_the_engine_admits() -> None:
    """The rate a cost comparison divides by: every seat busy, whatever the traffic."""
    quiet = assess(rag(concurrency=8))
    assert quiet.limited_by == "traffic" and quiet.batch == 8
    assert quiet.full_use_batch == quiet.block_seats and quiet.full_use_limited_by == "KV cache"
    assert quiet.full_use_tokens_per_s > quiet.tokens_per_s
    capped = assess(rag(concurrency=8, max_num_seqs=16))
    assert capped.full_use_batch == 16 and capped.full_use_limited_by == "max_num_seqs"


def test_a_bad_mfu_names_the_field() -> None:
    with pytest.raises(ValueError, match="mfu"):
        assess(rag(mfu=1.5))


@pytest.mark.parametrize(
    ("prefix", "requests", "heads", "kv_heads", "windowed", "all_decode", "expected"),
    [
        (2_000, 128, 32, 8, False, True, True),  # the chapter's scenario: one wave vs 125
        (255, 128, 32, 8, False, True, False),  # prefix under 256 tokens
        (2_000, 7, 32, 8, False, True, False),  # fewer than 8 requests
        (2_000, 128, 32, 8, True, True, False),  # sliding windows
        (2_000, 8, 32, 32, False, True, True),  # no grouped queries: no FlashDecoding
        (2_000, 8, 32, 8, False, False, True),  # a prefill in the batch: no FlashDecoding
        # 8 decoding requests, 128 query heads over 8 KV heads: cascade's 128 CTAs take
        # one wave on 132 SMs, times 16 prefix tiles = 16; FlashDecoding's 8 x 8 x 16 tiles
        # = 1,024 CTAs take 8 waves: FlashDecoding wins.
        (2_000, 8, 128, 8, False, True, False),
        # FlashDecoding needs fewer waves: 8 x 2 x 1 x 2 tiles = 32 CTAs, 1 wave; cascade
        # 256 heads x 1 = 256 CTAs, 2 waves x 2 tiles = 4 > 1.
        (256, 8, 256, 2, False, True, False),
    ],
)
def test_cascade_attention_follows_vllms_heuristic(
    prefix: int, requests: int, heads: int, kv_heads: int, windowed: bool, all_decode: bool,
    expected: bool,
) -> None:
    found = cascade_attention_applies(prefix, requests, heads, kv_heads, 132,
                                      windowed=windowed, all_decode=all_decode)
    assert found is expected
