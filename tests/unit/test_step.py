"""The step model: each operation on its own roofline, the times added, every step reachable."""

from __future__ import annotations

import itertools
import math

import pytest

from kvlib.bounds import decode_bytes_per_gpu
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.mla import weight_bytes_per_gpu
from kvlib.step import (
    ASSUMED_MFU,
    VLLM_MAX_NUM_BATCHED_TOKENS_API,
    VLLM_MAX_NUM_BATCHED_TOKENS_LLM,
    PrefillChunk,
    decode_attention_flops,
    mixed_step,
    steady_state_step,
    step_time,
    step_time_from_counts,
)
from kvlib.view import model_view
from kvlib.weights.params import unread_weight_bytes

LLAMA = load_config("Llama-3.1-8B")
H100 = get_gpu("H100-SXM")

# Llama-3.1-8B's matmuls from its published shapes (hidden 4,096, 32 layers, 32 query and
# 8 KV heads of 128, MLP 14,336, vocabulary 128,256, untied LM head), not from kvlib.
_HIDDEN, _LAYERS, _KV_WIDTH, _MLP = 4096, 32, 8 * 128, 14336
BODY = _LAYERS * (2 * _HIDDEN * _HIDDEN + 2 * _HIDDEN * _KV_WIDTH + 3 * _HIDDEN * _MLP)
HEAD = 128_256 * _HIDDEN
KV_PER_TOKEN = 2 * _LAYERS * _KV_WIDTH * 2  # K and V, bf16
PAIR_FLOPS = _LAYERS * 32 * 2 * (2 * 128)  # QK^T and AV, 32 heads of 128, every layer
F_EFF = ASSUMED_MFU * 989.4e12
BW = 3.35e12


def test_the_assumed_mfu_and_vllm_token_budgets() -> None:
    assert ASSUMED_MFU == 0.6
    assert (VLLM_MAX_NUM_BATCHED_TOKENS_API, VLLM_MAX_NUM_BATCHED_TOKENS_LLM) == (8192, 16384)


def test_a_mixed_step_adds_the_three_operations_by_hand() -> None:
    b, t, c = 91, 3_000, 364
    step = mixed_step(LLAMA, H100, b, t, c, prefill_cached_tokens=2_000)
    norms = (2 * _LAYERS + 1) * _HIDDEN  # two RMSNorms a layer and the final one: read too
    weights = 2 * (BODY + HEAD + norms)  # bf16, the input embedding table not read
    flops = 2 * (BODY * (b + c) + HEAD * (b + 1))  # the chunk ends its prompt: one more logit
    assert step.weight_bytes == weights
    assert step.weight_flops == flops
    assert step.weights_s == pytest.approx(max(weights / BW, flops / F_EFF))
    assert step.decode_kv_bytes == b * t * KV_PER_TOKEN
    assert step.decode_attention_flops == b * (t + 1) * PAIR_FLOPS
    pairs = sum(range(2_001, 2_000 + c + 1))  # query i sees i keys
    assert step.prefill_attention_flops == pairs * PAIR_FLOPS
    assert step.prefill_kv_bytes == (2_000 + c) * KV_PER_TOKEN
    expected = (max(weights / BW, flops / F_EFF) + b * t * KV_PER_TOKEN / BW
                + max((2_000 + c) * KV_PER_TOKEN / BW, pairs * PAIR_FLOPS / F_EFF))
    assert step.total_s == pytest.approx(expected)
    assert step.total_s == pytest.approx(
        step.weights_s + step.decode_attention_s + step.prefill_attention_s)


def test_the_named_slips_give_other_times() -> None:
    step = mixed_step(LLAMA, H100, 91, 3_000, 364)
    decode_only = mixed_step(LLAMA, H100, 91, 3_000)
    at_peak = mixed_step(LLAMA, H100, 91, 3_000, 364, mfu=1.0)
    terms = (step.weights_s, step.decode_attention_s, step.prefill_attention_s)
    assert decode_only.total_s < step.total_s  # prefill left out
    assert max(terms) < step.total_s  # the times taken as a max
    assert at_peak.total_s < step.total_s  # MFU forgotten
    assert step.weights_bound == "compute" and decode_only.weights_bound == "memory"


def test_chunks_of_a_prompt_add_up_to_its_whole_prefill_attention() -> None:
    whole = step_time(LLAMA, H100, prefill_chunks=[PrefillChunk(1_024)])
    halves = [step_time(LLAMA, H100, prefill_chunks=[PrefillChunk(512, 0, last=False)]),
              step_time(LLAMA, H100, prefill_chunks=[PrefillChunk(512, 512)])]
    assert sum(s.prefill_attention_flops for s in halves) == whole.prefill_attention_flops
    assert whole.prefill_attention_flops == 1_024 * 1_025 // 2 * PAIR_FLOPS


def test_decode_contexts_may_differ() -> None:
    step = step_time(LLAMA, H100, [100, 2_000, 2_000])
    assert step.decode_kv_bytes == 4_100 * KV_PER_TOKEN
    assert step.decode_attention_flops == (101 + 2 * 2_001) * PAIR_FLOPS


def test_tensor_parallelism_splits_each_gpu_share() -> None:
    one = mixed_step(LLAMA, H100, 64, 4_000, 512)
    two = mixed_step(LLAMA, H100, 64, 4_000, 512, tp=2)
    assert two.weight_flops == one.weight_flops // 2
    assert two.decode_kv_bytes == one.decode_kv_bytes // 2
    assert two.weight_bytes == decode_bytes_per_gpu(LLAMA, 64 + 512, 0, tp=2)
    assert two.total_s < one.total_s


def test_a_mixture_of_experts_reads_the_experts_its_tokens_touch() -> None:
    moe = load_config("gpt-oss-20b")
    few = step_time(moe, H100, [1_000] * 4, weight_dtype=None)
    many = step_time(moe, H100, [1_000] * 4, [PrefillChunk(2_048)], weight_dtype=None)
    assert few.weight_bytes < many.weight_bytes
    assert many.weight_bytes == decode_bytes_per_gpu(moe, 4 + 2_048, 0, weight_dtype=None)


def test_w8a8_halves_the_weight_reads_and_runs_at_the_fp8_peak() -> None:
    bf16 = mixed_step(LLAMA, H100, 256, 2_000, 2_048)
    fp8 = mixed_step(LLAMA, H100, 256, 2_000, 2_048, weight_dtype="fp8", matmul_dtype="fp8")
    assert fp8.weight_bytes == bf16.weight_bytes // 2
    assert fp8.matmul_flops_ceiling_per_s == pytest.approx(ASSUMED_MFU * 1978.9e12)
    assert fp8.attention_flops_ceiling_per_s == bf16.attention_flops_ceiling_per_s


@pytest.mark.parametrize(
    ("batch", "context", "prefill", "mfu"),
    list(itertools.product([1, 32, 256], [0, 1_000, 30_000], [0, 64, 8_192], [0.3, 1.0])),
)
def test_every_step_is_reachable(batch: int, context: int, prefill: int, mfu: float) -> None:
    if batch == 0 and prefill == 0:
        return
    step = mixed_step(LLAMA, H100, batch, context, prefill, mfu=mfu)
    assert step.reachable()
    assert step.flops_per_s <= mfu * H100.bf16_dense_flops_per_s * (1 + 1e-9)
    assert step.hbm_bytes_per_s <= H100.hbm_bandwidth_bytes_per_s * (1 + 1e-9)


def test_an_unreachable_step_is_caught() -> None:
    step = mixed_step(LLAMA, H100, 8, 1_000)
    faster = type(step)(**{**step.__dict__, "weights_s": step.weights_s / 2})
    assert not faster.reachable()


def test_the_decode_attention_of_a_window_stops_growing() -> None:
    gemma = load_config("Gemma-2-9B")
    short, long = (decode_attention_flops(gemma, t) for t in (10_000, 20_000))
    full_layers = sum(1 for spec in gemma.layers if spec.cap_tokens is None)
    assert long - short > 0
    per_key = gemma.layers[0].decode_flops_per_key(gemma.num_attention_heads, gemma.head_dim)
    assert long - short == full_layers * 10_000 * per_key


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"mfu": 1.5}, "mfu"), ({"tp": 0}, "tp"), ({"matmul_dtype": "int4"}, "matmul_dtype")],
)
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        mixed_step(LLAMA, H100, 8, 1_000, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("contexts", [[100, -1], [100, 2.5], [True], [100, None]])
def test_a_bad_decode_context_is_named(contexts: list[object]) -> None:
    with pytest.raises(ValueError, match=rf"decode context must be a non-negative integer, "
                                         rf"got {contexts[-1]!r}"):
        step_time(LLAMA, H100, contexts)  # type: ignore[arg-type]


def test_an_empty_step_is_refused() -> None:
    with pytest.raises(ValueError, match="both"):
        step_time(LLAMA, H100)
    with pytest.raises(ValueError, match="both"):
        step_time_from_counts(weight_bytes=1, weight_flops=1, decode_tokens=0,
                              matmul_flops_per_s=1.0, bandwidth_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="tokens"):
        PrefillChunk(0)


def test_a_steady_state_step_is_a_mixed_step_when_one_prompt_replaces_one_request() -> None:
    """B = O: one request finishes, and one whole prompt is prefilled, every step."""
    steady = steady_state_step(LLAMA, H100, 100, 500, 100)
    mixed = mixed_step(LLAMA, H100, 100, 500 + 50, 500)
    assert steady == mixed


def test_the_steady_state_reproduces_the_expert_re_derivation() -> None:
    """Chapter 7's scenarios re-derived outside kvlib (an LLM-serving and a GPU performance
    engineer, by chapter 6's rule at 60% MFU): 3,306 and 1,713 tokens/s; 3,970 at peak."""
    document = steady_state_step(LLAMA, H100, 91, 4_000, 1_000)
    retrieval = steady_state_step(LLAMA, H100, 70, 6_000, 500)
    assert document.prefill_tokens == 364 and retrieval.prefill_tokens == 840
    assert document.decode_tokens_per_s == pytest.approx(3_306, abs=1)
    assert retrieval.decode_tokens_per_s == pytest.approx(1_713, abs=1)
    at_peak = steady_state_step(LLAMA, H100, 91, 4_000, 1_000, mfu=1.0)
    assert at_peak.decode_tokens_per_s == pytest.approx(3_970, abs=1)
    assert (document.bound, retrieval.bound) == ("memory", "compute")


def test_a_prefix_cache_hit_leaves_the_rest_of_the_prompt_to_prefill() -> None:
    cold = steady_state_step(LLAMA, H100, 128, 4_000, 1_000)
    warm = steady_state_step(LLAMA, H100, 128, 4_000, 1_000, cached_tokens=2_000)
    assert warm.prefill_tokens == 256 and cold.prefill_tokens == 512
    assert warm.total_s < cold.total_s
    with pytest.raises(ValueError, match="cached_tokens"):
        steady_state_step(LLAMA, H100, 128, 4_000, 1_000, cached_tokens=4_000)


# DeepSeek-V2's routed experts from its published config (60 layers, the first dense, 160
# experts of width 1,536 on a hidden size of 5,120, gate, up and down), not from kvlib.
V2 = load_config("DeepSeek-V2")
V2_EXPERT_PARAMS = 59 * 160 * 3 * 5_120 * 1_536


def test_data_parallel_attention_on_one_gpu_is_the_single_gpu_step() -> None:
    view = model_view(V2)
    for tokens in (1, 7, 64, 4_096):
        assert (view.dp_step_weight_bytes_per_gpu(tokens, 1, "fp8")
                == view.step_weight_bytes_per_gpu(tokens, 1, "fp8"))
    contexts, chunks = [3_000] * 40, [PrefillChunk(512, 1_000)]
    dp = step_time(V2, H100, contexts, chunks, dp=1, kv_dtype="fp8", weight_dtype="fp8")
    single = step_time(V2, H100, contexts, chunks, kv_dtype="fp8", weight_dtype="fp8")
    assert dp == single


def test_a_data_parallel_gpu_steps_its_own_sequences_whole() -> None:
    # 1,512 tokens: enough that one GPU alone touches every expert too.
    contexts, chunks = [3_000] * 1_000, [PrefillChunk(512, 1_000)]
    dp8 = step_time(V2, H100, contexts, chunks, dp=8, kv_dtype="fp8", weight_dtype="fp8")
    single = step_time(V2, H100, contexts, chunks, kv_dtype="fp8", weight_dtype="fp8")
    # Its own caches whole and its own tokens' FLOPs: what one GPU alone would do.
    for term in ("decode_kv_bytes", "decode_attention_flops", "prefill_kv_bytes",
                 "prefill_attention_flops", "weight_flops"):
        assert getattr(dp8, term) == getattr(single, term), term
    # Its weights: the dense ones whole, 1/8 of the routed experts' bytes.
    all_touched = 7 * V2_EXPERT_PARAMS // 8  # fp8: one byte a parameter
    assert single.weight_bytes - dp8.weight_bytes == all_touched


def test_a_data_parallel_gpu_reads_its_placed_weights() -> None:
    # 500 sequences a GPU, 4,000 on the node: every expert is touched.
    step = step_time(V2, H100, [4_000] * 500, dp=8, kv_dtype="fp8", weight_dtype="fp8")
    placed = weight_bytes_per_gpu(V2, 8, "fp8", attention="dp")
    assert step.weight_bytes == placed - unread_weight_bytes(V2, "fp8")  # the embedding table
    # One sequence a GPU: 8 tokens on the node touch at most 48 of the 160 experts.
    few = step_time(V2, H100, [4_000], dp=8, kv_dtype="fp8", weight_dtype="fp8")
    touched = 160 * (1 - (1 - 6 / 160) ** 8)
    share = V2_EXPERT_PARAMS // 8
    assert few.weight_bytes == step.weight_bytes - share + math.ceil(share * touched / 160)


@pytest.mark.parametrize(("batch", "context", "prefill", "mfu"),
                         [(1, 1_000, 0, 0.6), (64, 4_000, 0, 1.0), (500, 16_000, 0, 0.6),
                          (32, 2_000, 2_048, 1.0), (0, 0, 8_192, 0.6)])
def test_every_data_parallel_step_is_reachable(
    batch: int, context: int, prefill: int, mfu: float
) -> None:
    step = mixed_step(V2, H100, batch, context, prefill, mfu=mfu, dp=8, kv_dtype="fp8",
                      weight_dtype="fp8")
    assert step.reachable()
    assert step.hbm_bytes_per_s <= H100.hbm_bandwidth_bytes_per_s * (1 + 1e-9)


def test_tensor_and_data_parallel_together_is_refused() -> None:
    with pytest.raises(ValueError, match="pass tp or dp, not both"):
        step_time(V2, H100, [1_000], tp=2, dp=4)
