"""kvlib.capacity.remedies: each remedy's effect against an independent computation, and the ranking
by cost (the free one first) as a property over bundled models, GPUs and traffic."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvlib.bounds import decode_bytes_per_gpu, kv_bytes_per_gpu, matmul_params, prefill_flops
from kvlib.capacity.assessment import (
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

LLAMA8 = load_config("Llama-3.1-8B")
H100 = get_gpu("H100-SXM")


def rag(**changes: object) -> Scenario:
    base = Scenario(
        model=LLAMA8,
        gpu=H100,
        prompt_tokens=6_000,
        output_tokens=496,
        concurrency=128,
        needed_context_tokens=8_192,
        shared_prefix_tokens=2_000,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


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
    assert effect.seats_gained == 0 and effect.tokens_per_s_ratio == 1.0


def test_fp8_seats_against_sizing_and_vllms_pool() -> None:
    effect = by_name(rag())["fp8 KV cache"]
    memory = kv_memory(rag())
    # 6,496 tokens = 406 whole blocks, so sizing's bytes and vLLM's blocks agree.
    assert effect.after.seats == seats_for_context(LLAMA8, memory, 6_496, "fp8")
    assert effect.before.seats == seats_for_context(LLAMA8, memory, 6_496, "bf16")
    pool = kv_pool(LLAMA8, memory, max_model_len=131_072, kv_dtype="fp8")
    assert effect.after.pool.pool_tokens == pool.pool_tokens
    assert effect.after.seats >= 2 * effect.before.seats
    # Each step reads half the cache: faster per sequence at the same batch.
    same = decode_bytes_per_gpu(LLAMA8, effect.before.batch, 6_248, "fp8", None)
    assert same < decode_bytes_per_gpu(LLAMA8, effect.before.batch, 6_248, "bf16", None)


def test_prefix_caching_holds_the_shared_prompt_once() -> None:
    effect = by_name(rag())["prefix caching"]
    blocks = effect.after.pool.num_blocks
    shared, own = 2_000 // 16, 406 - 2_000 // 16
    assert effect.after.shared_blocks == shared
    assert effect.after.seats == (blocks - shared) // own
    assert effect.after.step_bytes_per_gpu >= effect.before.step_bytes_per_gpu  # more read


def test_scheduler_settings_add_no_memory() -> None:
    effect = by_name(rag())["scheduler settings"]
    assert effect.after.pool == effect.before.pool
    assert effect.seats_gained == 0 and effect.after.batch == effect.before.batch
    # Where the cap, not the pool, limits the batch, raising it helps.
    capped = by_name(rag(max_num_seqs=16))["scheduler settings"]
    assert capped.before.limited_by == "max_num_seqs" and capped.after.batch > 16


def test_tensor_parallelism_against_each_gpus_share() -> None:
    effect = by_name(rag())["more GPUs: tensor parallelism"]
    after = effect.after.scenario
    assert after.tp == 2 and after.gpus == 2 * effect.before.scenario.gpus
    assert effect.after.seats == kv_memory(after) // kv_bytes_per_gpu(LLAMA8, 6_496, "bf16", 2)
    # Shedding half the weights grows each pool: more than twice the seats.
    assert effect.after.seats > 2 * effect.before.seats


def test_a_replica_doubles_seats_not_speed_per_sequence() -> None:
    effect = by_name(rag(concurrency=64))["more GPUs: another replica"]
    assert effect.after.total_seats == 2 * effect.before.seats
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
    alternative=st.sampled_from([None, "gpt-oss-20b", "Falcon-7B", "Mistral-7B-v0.1"]),
)
def test_ranking_is_by_cost_tier_then_tokens_per_s(
    model: str, gpu: str, prompt: int, output: int, concurrency: int, shared: float,
    alternative: str | None,
) -> None:
    cfg = load_config(model)
    limit = cfg.max_position_embeddings or 2_048
    assume(prompt + output <= limit)
    s = Scenario(model=cfg, gpu=get_gpu(gpu), prompt_tokens=prompt, output_tokens=output,
                 concurrency=concurrency, needed_context_tokens=prompt + output,
                 shared_prefix_tokens=int(prompt * shared))
    try:
        ranking = rank_remedies(s, None if alternative is None else load_config(alternative))
    except ScenarioError:
        return  # the weights do not fit this card, or the baseline holds no sequence
    effects = ranking.remedies
    keys = [(e.tier, -e.after.tokens_per_s, -e.seats_gained, -e.guaranteed_seats_gained)
            for e in effects]
    assert keys == sorted(keys)
    assert all(0 <= e.tier < len(COST_TIERS) for e in effects)
    if s.engine_max_len > s.needed_context_tokens:
        assert effects[0].name == "max context from the product's need"
        assert effects[0].after.scenario.gpus == s.gpus
        assert effects[0].after.scenario.kv_dtype == s.kv_dtype
    for e in effects:
        assert e.before is ranking.baseline
        assert e.seats_gained >= 0 or e.tier == 3  # only a model change may lose seats
        if e.tier < 2:
            assert e.after.scenario.gpus == s.gpus  # nothing but the top tiers rents GPUs
    names = [e.name for e in effects] + [name for name, _ in ranking.skipped]
    assert len(names) == len(set(names)) == 6 + (alternative is not None)


@pytest.mark.parametrize("bundled", bundled_scenarios(), ids=lambda b: b.name)
def test_every_bundled_row_is_reachable_at_the_stated_mfu(bundled: BundledScenario) -> None:
    """Each row's tokens/s leaves the GPUs enough arithmetic, at the scenario's MFU, to
    prefill the prompts of the requests it finishes and decode their replies: FLOPs
    counted here from kvlib.bounds.prefill_flops, token by token for the decode."""
    ranking = rank_remedies(bundled.scenario, bundled.alternative)
    rows = [ranking.baseline] + [e.after for e in ranking.remedies]
    for cap in rows:
        s = cap.scenario
        cached = cap.shared_blocks * s.block_size
        prefill = prefill_flops(s.model, s.prompt_tokens).total
        if cached:
            skipped = prefill_flops(s.model, cached)
            prefill -= skipped.weights + skipped.attention
        body, head = matmul_params(s.model)
        decode = 2 * (body + head) * s.output_tokens
        decode += s.output_tokens * (
            (decode_flops_per_token(s.model, s.decode_context_tokens) or 0) - 2 * (body + head)
        )
        requests_per_s = cap.tokens_per_s / s.output_tokens
        available = s.mfu * s.gpus * s.gpu.bf16_dense_flops_per_s
        assert requests_per_s * prefill / available <= 1 + 1e-9, s
        assert requests_per_s * (prefill + decode) / available <= 1 + 1e-9, s
        assert prefill_compute_share(cap) <= s.mfu + 1e-9
        assert cap.tokens_per_s <= cap.decode_tokens_per_s


def test_the_bundled_scenarios_show_both_regimes() -> None:
    kv_bound = assess(document_assistant())
    assert kv_bound.limited_by == "KV cache" and kv_bound.bound_by == "memory"
    assert (compute_share(kv_bound) or 1) < 1
    prefill_bound = assess(retrieval_heavy())
    assert prefill_bound.limited_by == "KV cache" and prefill_bound.bound_by == "compute"
    assert compute_share(prefill_bound) == pytest.approx(1.0)
    # In the compute regime more seats buy no tokens/s; in the memory regime they do.
    fp8 = by_name(retrieval_heavy())["fp8 KV cache"]
    assert fp8.seats_gained > 0
    assert fp8.after.tokens_per_s == pytest.approx(fp8.before.tokens_per_s, abs=1e-6)
    doc = by_name(document_assistant())["fp8 KV cache"]
    assert doc.after.tokens_per_s > doc.before.tokens_per_s


def test_a_compute_bound_row_is_ranked_below_a_faster_one_of_its_tier() -> None:
    """The joint bound re-ranks: in the document assistant, fp8 alone reaches the
    arithmetic's limit, and stays first of its tier only while nothing in it is faster."""
    effects = [e for e in rank_remedies(document_assistant()).remedies if e.tier == 1]
    rates = [e.after.tokens_per_s for e in effects]
    assert rates == sorted(rates, reverse=True)
    fp8 = next(e for e in effects if e.name == "fp8 KV cache")
    assert fp8.after.bound_by == "compute"
    assert fp8.after.tokens_per_s < fp8.after.decode_tokens_per_s
