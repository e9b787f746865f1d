"""kvlib.capacity.remedies: each remedy's effect against an independent computation, every row
reachable at the stated MFU, and the ranking by cost (the free ones first, then the catalogue's
order within a tier) as a property over bundled models, GPUs and traffic."""

from __future__ import annotations

import dataclasses
import math

import pytest
from capacity_support import H100, LLAMA8, rag
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvlib.bounds import decode_bytes_per_gpu, kv_bytes_per_gpu, prefill_flops
from kvlib.capacity.assessment import (
    Capacity,
    assess,
    compute_share,
    decode_flops_per_token,
    prefill_compute_share,
)
from kvlib.capacity.examples import (
    BundledScenario,
    bundled_scenarios,
    document_assistant,
    retrieval_heavy,
)
from kvlib.capacity.remedies import COST_TIERS, RemedyEffect, rank_remedies
from kvlib.capacity.scenario import Scenario, ScenarioError
from kvlib.config import bundled_models, load_config
from kvlib.hardware import get_gpu
from kvlib.paging.vllm_pool import kv_pool
from kvlib.sizing import seats_for_context
from kvlib.weights.params import weight_bytes

TIER_ONE = ["prefix caching", "a host tier (KV offloading to host memory)", "scheduler settings",
            "gpu_memory_utilization 0.95", "fp8 KV cache", "fp8 weights (W8A8)"]


def by_name(scenario: Scenario, alternative: str | None = None) -> dict[str, RemedyEffect]:
    other = None if alternative is None else load_config(alternative)
    return {e.name.split(" (")[0]: e for e in rank_remedies(scenario, other).remedies}


def kv_memory(s: Scenario) -> int:
    weights = -(-weight_bytes(s.model, s.weight_dtype) // s.tp)
    budget = math.ceil(s.gpu.vllm_total_bytes * s.gpu_memory_utilization)  # vLLM: CUDA's total
    return budget - weights - s.runtime_bytes_per_gpu


def test_the_free_remedy_raises_the_guarantee_and_nothing_else() -> None:
    effect = by_name(rag())["max context from the product's need"]
    memory = kv_memory(rag())
    assert effect.tier == 0 and effect.cost_label == "free"
    # The guarantee is vLLM's concurrency at 8,192 tokens instead of 131,072.
    assert effect.after.guaranteed_seats == int(
        kv_pool(LLAMA8, memory, max_model_len=8_192).max_concurrency
    )
    assert effect.before.guaranteed_seats == seats_for_context(LLAMA8, memory, 131_072)
    assert effect.guaranteed_seats_gained > 10
    # A paged engine's pool, seats at the traffic's length and speed are unchanged.
    assert effect.after.pool.num_blocks == effect.before.pool.num_blocks
    assert effect.block_seats_gained == 0 and effect.tokens_per_s_ratio == 1.0


def test_fp8_seats_against_sizing_and_vllms_pool() -> None:
    effect = by_name(rag())["fp8 KV cache"]
    memory = kv_memory(rag())
    # 6,496 tokens = 406 whole blocks, so sizing's bytes and vLLM's blocks agree.
    assert effect.after.block_seats == seats_for_context(LLAMA8, memory, 6_496, "fp8")
    assert effect.before.block_seats == seats_for_context(LLAMA8, memory, 6_496, "bf16")
    pool = kv_pool(LLAMA8, memory, max_model_len=131_072, kv_dtype="fp8")
    assert effect.after.pool.pool_tokens == pool.pool_tokens
    assert effect.after.block_seats >= 2 * effect.before.block_seats
    # Each step reads half the cache: faster per sequence at the same batch.
    same = decode_bytes_per_gpu(LLAMA8, effect.before.batch, 6_248, "fp8", None)
    assert same < decode_bytes_per_gpu(LLAMA8, effect.before.batch, 6_248, "bf16", None)


def test_prefix_caching_holds_the_shared_prompt_once() -> None:
    effect = by_name(rag())["prefix caching"]
    blocks = effect.after.pool.num_blocks
    shared, own = 2_000 // 16, -(-6_500 // 16) - 2_000 // 16  # 407 blocks, 125 shared
    assert effect.after.shared_blocks == shared
    assert effect.after.block_seats == (blocks - shared) // own
    assert effect.after.step_bytes_per_gpu >= effect.before.step_bytes_per_gpu  # more read


def test_a_host_tier_applies_only_where_conversations_return() -> None:
    reason = dict(rank_remedies(document_assistant()).skipped)
    assert reason["a host tier (KV offloading to host memory)"].startswith(
        "no conversation returns with a prefix of its own")
    with pytest.raises(ScenarioError, match="returning_tokens"):
        assess(rag(returning_tokens=4_001))  # 2,000 shared + 4,001 > the 6,000-token prompt
    with pytest.raises(ScenarioError, match="prefix_caching=True"):
        assess(rag(returning_tokens=1_000, host_tier=True))


def test_a_host_tier_copies_back_the_returning_blocks_instead_of_prefilling_them() -> None:
    """Prefix caching keeps the shared prompt's 125 blocks on the GPU; the host tier copies
    back the conversation's own 1,500 tokens with them, in full blocks (3,500 // 16 = 218
    blocks: 3,488 tokens in all), holds no GPU block, and each copy runs over PCIe 5.0 x16
    (32 GT/s x 16 lanes x 128/130 / 8 bits: PCI-SIG's base specification 5.0)."""
    s = rag(returning_tokens=1_500)
    effects = by_name(s)
    tier, caching = effects["a host tier"].after, effects["prefix caching"].after
    assert tier.cached_tokens == 3_500 // 16 * 16 == 3_488
    assert tier.reloaded_tokens == 3_488 - caching.cached_tokens == 3_488 - 2_000 // 16 * 16
    assert tier.block_seats == caching.block_seats  # host memory holds it, not the pool
    assert tier.tokens_per_s > caching.tokens_per_s
    assert tier.step.prefill_tokens < caching.step.prefill_tokens
    pcie5 = 32e9 * 16 * 128 / 130 / 8
    per_request = kv_bytes_per_gpu(LLAMA8, tier.reloaded_tokens, "bf16", 1) / pcie5
    assert tier.reload_s_per_step == pytest.approx(tier.batch / s.output_tokens * per_request)
    assert tier.reload_s_per_step < tier.step_s and tier.notes == ()


def test_a_host_tier_slower_than_the_step_is_bound_by_pcie() -> None:
    """Prompts that are almost all a returning conversation, replies of 4 tokens: a
    quarter of the batch starts each step, each copying 5,984 tokens (784 MB) over PCIe,
    longer than the step's kernels: the step waits for the copies."""
    s = Scenario(model=LLAMA8, gpu=H100, prompt_tokens=6_000, output_tokens=4,
                 concurrency=128, needed_context_tokens=8_192, returning_tokens=5_990,
                 prefix_caching=True, host_tier=True)
    cap = assess(s)
    assert cap.reloaded_tokens == 5_984
    assert cap.reload_s_per_step > cap.step.total_s
    assert cap.bound_by == "PCIe" and cap.step_s == cap.reload_s_per_step
    assert cap.tokens_per_s == pytest.approx(cap.batch / cap.reload_s_per_step)
    assert any("PCIe bounds this row" in note for note in cap.notes)


def test_scheduler_settings_add_no_memory() -> None:
    effect = by_name(rag())["scheduler settings"]
    assert effect.after.pool == effect.before.pool
    assert effect.block_seats_gained == 0 and effect.after.batch == effect.before.batch
    # Where the cap, not the pool, limits the batch, raising it helps.
    capped = by_name(rag(max_num_seqs=16))["scheduler settings"]
    assert capped.before.limited_by == "max_num_seqs" and capped.after.batch > 16


def test_tensor_parallelism_against_each_gpus_share() -> None:
    effect = by_name(rag())["more GPUs: tensor parallelism"]
    after = effect.after.scenario
    assert after.tp == 2 and after.gpus == 2 * effect.before.scenario.gpus
    per_sequence = kv_bytes_per_gpu(LLAMA8, 6_496, "bf16", 2)
    assert effect.after.block_seats == kv_memory(after) // per_sequence
    # Shedding half the weights grows each pool: more than twice the seats.
    assert effect.after.block_seats > 2 * effect.before.block_seats


def test_a_replica_doubles_seats_not_speed_per_sequence() -> None:
    effect = by_name(rag(concurrency=64))["more GPUs: another replica"]
    assert effect.after.total_block_seats == 2 * effect.before.block_seats
    assert effect.after.batch == 32


def test_a_model_with_fewer_bytes_is_applied_and_one_with_more_is_skipped() -> None:
    assert "a model with fewer KV bytes per token" in by_name(rag(), "gpt-oss-20b")
    ranking = rank_remedies(rag(), load_config("Qwen3-8B"))  # 36 layers: more bytes
    assert any("caches no fewer bytes" in why for _, why in ranking.skipped)


def test_remedies_that_do_not_apply_say_why() -> None:
    ranking = rank_remedies(rag(kv_dtype="fp8", max_model_len=8_192, prefix_caching=True))
    reasons = dict(ranking.skipped)
    assert reasons["fp8 KV cache"] == "the cache is already fp8"
    assert reasons["max context from the product's need"].startswith("max_model_len is already")
    assert reasons["prefix caching"] == "prefix caching is already on"
    spelled = dict(rank_remedies(rag(kv_dtype="float8_e4m3fn")).skipped)  # a config's spelling
    assert spelled["fp8 KV cache"] == "the cache is already float8_e4m3fn"


def test_an_alternative_that_cannot_run_is_skipped_with_the_reason() -> None:
    ranking = rank_remedies(rag(), load_config("DeepSeek-V2"))  # 439 GiB of weights
    assert any("cannot run" in why and "do not fit" in why for _, why in ranking.skipped)


MODELS = [m for m in bundled_models() if m not in ("DeepSeek-V3", "DeepSeek-V2")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    gpu=st.sampled_from(["H100-SXM", "H200", "A100-80GB", "L40S"]),
    prompt=st.integers(64, 6_000),
    output=st.integers(16, 2_000),
    concurrency=st.integers(1, 512),
    shared=st.floats(0, 1),
    returning=st.floats(0, 1),
    alternative=st.sampled_from([None, "gpt-oss-20b", "Falcon-7B", "Mistral-7B-v0.1"]),
)
def test_ranking_is_by_cost_tier_then_the_catalogue(
    model: str, gpu: str, prompt: int, output: int, concurrency: int, shared: float,
    returning: float, alternative: str | None,
) -> None:
    cfg = load_config(model)
    limit = cfg.max_position_embeddings or 2_048
    assume(prompt + output <= limit)
    s = Scenario(model=cfg, gpu=get_gpu(gpu), prompt_tokens=prompt, output_tokens=output,
                 concurrency=concurrency, needed_context_tokens=prompt + output,
                 shared_prefix_tokens=int(prompt * shared),
                 returning_tokens=int((prompt - int(prompt * shared)) * returning))
    try:
        ranking = rank_remedies(s, None if alternative is None else load_config(alternative))
    except ScenarioError:
        return  # the weights do not fit this card, or the baseline holds no sequence
    effects = ranking.remedies
    tiers = [e.tier for e in effects]
    assert tiers == sorted(tiers)
    ones = [e.name for e in effects if e.tier == 1]
    assert ones == [name for name in TIER_ONE if name in ones]
    assert all(0 <= e.tier < len(COST_TIERS) for e in effects)
    if s.engine_max_len > s.needed_context_tokens:
        assert effects[0].name == "max context from the product's need"
        assert effects[0].after.scenario.gpus == s.gpus
        assert effects[0].after.scenario.kv_dtype == s.kv_dtype
    for e in effects:
        assert e.before is ranking.baseline
        assert e.block_seats_gained >= 0 or e.tier == 3  # only a model change may lose seats
        if e.tier < 2:
            assert e.after.scenario.gpus == s.gpus  # nothing but the top tiers rents GPUs
    names = [e.name for e in effects] + [name for name, _ in ranking.skipped]
    assert len(names) == len(set(names)) == 10 + (alternative is not None)


def rows(bundled: BundledScenario, mfu: float | None = None) -> list[Capacity]:
    scenario = bundled.scenario if mfu is None else dataclasses.replace(bundled.scenario, mfu=mfu)
    ranking = rank_remedies(scenario, bundled.alternative)
    return [ranking.baseline] + [e.after for e in ranking.remedies]


@pytest.mark.parametrize("mfu", [None, 0.3, 1.0])
@pytest.mark.parametrize("bundled", bundled_scenarios(), ids=lambda b: b.name)
def test_every_bundled_row_is_reachable_at_the_stated_mfu(
    bundled: BundledScenario, mfu: float | None
) -> None:
    """Each row's step keeps its FLOP/s under MFU x the card's dense peak (fp8 for W8A8
    weight GEMMs) and its bytes/s under the bandwidth; and, counted per request from
    kvlib.bounds.prefill_flops and the decode FLOPs token by token, the rate leaves the
    GPUs the arithmetic to prefill the prompts of the requests it finishes and decode them."""
    for cap in rows(bundled, mfu):
        s = cap.scenario
        peak = s.gpu.fp8_dense_flops_per_s if s.matmul_dtype == "fp8" else None
        peak = peak or s.gpu.bf16_dense_flops_per_s
        for step in (cap.step, cap.full_use_step):
            assert step.reachable()
            assert step.flops_per_s <= s.mfu * peak * (1 + 1e-9), s
            assert step.hbm_bytes_per_s <= s.gpu.hbm_bandwidth_bytes_per_s * (1 + 1e-9), s
        cached = cap.shared_blocks * s.block_size
        prefill = prefill_flops(s.model, s.prompt_tokens).total
        if cached:
            skipped = prefill_flops(s.model, cached)
            prefill -= skipped.weights + skipped.attention
        decode = s.output_tokens * (decode_flops_per_token(s.model, s.decode_context_tokens) or 0)
        requests_per_s = cap.tokens_per_s / s.output_tokens
        available = s.mfu * s.gpus * peak
        assert requests_per_s * (prefill + decode) / available <= 1 + 1e-3, s
        assert prefill_compute_share(cap) <= s.mfu * peak / s.gpu.bf16_dense_flops_per_s


def test_the_bundled_scenarios_show_both_regimes() -> None:
    kv_bound = assess(document_assistant())
    assert kv_bound.limited_by == "KV cache" and kv_bound.bound_by == "memory"
    prefill_bound = assess(retrieval_heavy())
    assert prefill_bound.limited_by == "KV cache" and prefill_bound.bound_by == "compute"
    assert compute_share(kv_bound) < compute_share(prefill_bound) <= 1 + 1e-12
    # Once the weight GEMMs are compute-bound every term of the step grows with the batch:
    # more seats alone buy no tokens/s; fewer bytes or fewer prompt tokens do.
    for scenario in (document_assistant(), retrieval_heavy()):
        effects = by_name(scenario)
        memory = effects["gpu_memory_utilization 0.95"]
        assert memory.block_seats_gained > 0
        assert memory.after.tokens_per_s == pytest.approx(memory.before.tokens_per_s, rel=1e-3)
        assert effects["fp8 KV cache"].tokens_per_s_ratio > 1.2
        assert effects["prefix caching"].tokens_per_s_ratio > 1.1


def test_within_a_tier_cost_ranks_not_speed() -> None:
    """Prefix caching (lossless, on by default) comes before an fp8 KV cache (an accuracy
    check) although fp8 is faster here."""
    effects = [e for e in rank_remedies(document_assistant()).remedies if e.tier == 1]
    assert [e.name for e in effects] == [n for n in TIER_ONE if not n.startswith("a host")]
    prefix, fp8 = (next(e for e in effects if e.name == n) for n in TIER_ONE[::4])
    assert prefix.after.tokens_per_s < fp8.after.tokens_per_s


def test_fp8_weights_free_half_the_weights_and_run_on_fp8_tensor_cores() -> None:
    effect = by_name(document_assistant())["fp8 weights"]
    after, before = effect.after, effect.before
    assert after.scenario.weight_dtype == after.scenario.matmul_dtype == "fp8"
    freed = weight_bytes(LLAMA8, "bf16") - weight_bytes(LLAMA8, "fp8")
    assert before.weight_bytes_per_gpu - after.weight_bytes_per_gpu == freed
    assert 7 * 10**9 < freed < 8.1 * 10**9  # about 7.5 GB for an 8B model
    assert after.pool.kv_memory_bytes - before.pool.kv_memory_bytes == freed
    assert after.step.weight_bytes * 2 == pytest.approx(before.step.weight_bytes, rel=0.01)
    fp8_peak = H100.fp8_dense_flops_per_s
    assert fp8_peak is not None
    assert after.step.matmul_flops_ceiling_per_s == pytest.approx(after.scenario.mfu * fp8_peak)
    skipped = dict(rank_remedies(rag(weight_dtype="fp8", matmul_dtype="fp8")).skipped)
    assert skipped["fp8 weights (W8A8)"] == "the weights are already fp8"


def test_the_server_side_max_tokens_is_free_and_changes_no_row() -> None:
    effect = by_name(rag())["server-side default max_tokens"]
    assert effect.tier == 0 and effect.after.scenario == effect.before.scenario
    assert effect.block_seats_gained == 0 and effect.tokens_per_s_ratio == 1.0
    assert "HTTP 400" in by_name(rag())["max context from the product's need"].cost
